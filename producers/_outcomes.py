"""After the effect: how a run handle makes a tool's outcome durable, reads recorded results back and settles
calls whose outcome is unknown (mixed into :class:`~runjournal.producers.handle.RunHandle` via ``CallMixin``).

DESIGN.md "Decisions after the first build", after the effect. Once a tool has been invoked, exactly one
of these holds, whatever fails afterwards:

1. its outcome (TOOL_CALL_COMMITTED / FAILED / RECONCILED) is durable; or
2. the call is left INTENDED in the journal — outcome unknown — and is settled later by
   ``reconcile(idempotency_key)`` or an approval (the live handle's retry of the call, a resumed run,
   or "continue" of a failed run: the reducer marks it OUTCOME_UNKNOWN when the run ends or is resumed).

The outcome event is built once (its ``event_id`` and ``seq`` fixed) and kept as the handle's *pending
outcome* until it is acknowledged: sent with bounded retries (``Journal(outcome_retries=5)``, 50 ms
doubling backoff), and, if still not durable, sent again — the very same event — before any later event
of the run. Sending the same event again is safe even after an ambiguous commit: readers drop the copy
by ``event_id``. A record the broker refuses for its size is sent again with the result by reference.
A result that cannot be recorded faithfully is recorded as committed without a result, and only then
raises ``UnrecordableResultError``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from runjournal.producers._digest import digest
from runjournal.producers._recorded import RecordedValue, record_value
from runjournal.producers._steps import Effect, Reconcile, Sleep
from runjournal.producers.errors import (
    ApprovalDeniedError,
    DeliveryError,
    OutcomeNotDurableError,
    OutcomeUnknownError,
    ProducerFencedError,
    QueueFullError,
    ResultUnavailableError,
    UnrecordableResultError,
)
from runjournal.producers.plan import ApprovalStatus, CallStatus, PlannedCall
from runjournal.producers.tools import Outcome, Tool
from runjournal.schemas import Event, EventType

if TYPE_CHECKING:
    from runjournal.producers._port import JournalPort

__all__ = ["OutcomeMixin", "PendingOutcome"]

log = logging.getLogger("runjournal.producers.calls")

_BACKOFF_S = 0.05
_MAX_BACKOFF_S = 1.0


@dataclass(slots=True)
class PendingOutcome:
    """An outcome event accepted by the handle but not yet acknowledged by the broker."""

    event: Event
    """The event, its event_id and seq fixed: every resend is this same event."""
    durable: bool
    """Commit (broker ack) before it counts as sent."""
    entry: PlannedCall
    """What the handle knows of the call once the event is durable."""
    tool_error: BaseException | None = None
    """The tool's own exception, for a TOOL_CALL_FAILED."""
    smaller: Callable[[], tuple[dict[str, Any], PlannedCall] | None] | None = None
    """The same outcome with the result by reference, for a record the broker refused for its size."""
    deferred: bool = False
    """Group commit: produced into the open transaction and acknowledged by the next commit (``durable`` then
    only says the event is durable in kind); a later loss stops the run (``RunHandle._on_lost``)."""


def _by_reference(pending: PendingOutcome) -> Callable[[], Event | None] | None:
    """The pending outcome's event with its result by reference (same event_id, seq and time), made only if the
    broker refuses the inline one for its size; None when it has no such form."""
    make = pending.smaller
    if make is None:
        return None
    event = pending.event

    def smaller() -> Event | None:
        made = make()
        return None if made is None else replace(event, payload=made[0])
    return smaller


class OutcomeMixin:
    """Outcome half of the call protocol (see the module docstring). Expects RunHandle's attributes."""

    journal: JournalPort
    run_id: str
    _next_seq: int
    _calls: dict[str, PlannedCall]
    _approvals: dict[str, ApprovalStatus]
    _pending: PendingOutcome | None
    _reconcile_after: dict[str, float]

    @property
    def node_path(self) -> str | None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _check_writable(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _event(self, etype: EventType, payload: dict[str, Any], node_id: str | None) -> Event:
        raise NotImplementedError  # pragma: no cover - overridden

    def _publish(
        self, etype: EventType, payload: dict[str, Any], *, node_id: str | None, durable: bool
    ) -> Event:
        raise NotImplementedError  # pragma: no cover - overridden

    # -- the pending outcome --------------------------------------------------------------------
    def _on_lost(self, error: DeliveryError) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _record_outcome(self, etype: EventType, payload: dict[str, Any], node_path: str, durable: bool,
                        entry: PlannedCall, *, tool_error: BaseException | None = None,
                        smaller: Callable[[], tuple[dict[str, Any], PlannedCall] | None] | None = None,
                        deferred: bool = False) -> None:
        """Make a tool's outcome durable (or keep it pending and raise ``OutcomeNotDurableError``); with
        ``deferred`` (group commit) produce it into the open transaction for the next commit to acknowledge."""
        event = self._event(etype, payload, node_path or None)
        self._pending = PendingOutcome(event, durable, entry, tool_error, smaller, deferred)
        self._flush_pending()

    def _flush_pending(self) -> None:
        """Send the pending outcome, if any, with bounded retries; called before every write of the run.

        Raises:
            OutcomeNotDurableError: still not acknowledged (it stays pending); ProducerFencedError and the
            handle's other refusals (the call is then left to recovery as OUTCOME_UNKNOWN).
        """
        pending = self._pending
        if pending is None:
            return
        last: Exception | None = None
        for attempt in range(self.journal.outcome_retries + 1):
            if attempt:
                time.sleep(min(_BACKOFF_S * 2 ** (attempt - 1), _MAX_BACKOFF_S))
            self._check_writable()
            try:
                self.journal.publish(pending.event, durable=pending.durable and not pending.deferred,
                                     on_lost=self._on_lost if pending.deferred else None, deferred=pending.deferred,
                                     smaller=_by_reference(pending))
            except ProducerFencedError:
                raise
            except (DeliveryError, QueueFullError) as exc:
                last = exc
                if pending.event.key in getattr(exc, "refused_keys", ()) and pending.smaller is not None:
                    self._shrink(pending)
                continue
            self._pending = None
            self._next_seq += 1
            self._calls[pending.entry.call_id] = pending.entry
            return
        entry = pending.entry
        raise OutcomeNotDurableError(
            f"{entry.tool} ran (call {entry.call_id}) but its {pending.event.type} was not acknowledged after "
            f"{self.journal.outcome_retries + 1} attempts ({last}); call it again with the same arguments at "
            "the same step to get its outcome — the tool will not run again",
            call_id=entry.call_id, idempotency_key=entry.call_id, tool=entry.tool, tool_error=pending.tool_error,
        ) from last

    def _shrink(self, pending: PendingOutcome) -> None:
        smaller, pending.smaller = pending.smaller, None
        made = smaller() if smaller is not None else None
        if made is not None:
            payload, pending.entry = made
            old = pending.event
            pending.event = self._event(old.type, payload, old.node_id)
            log.warning("the broker refused %s of call %s for its size; sending it with the result by reference",
                        old.type, pending.entry.call_id)

    # -- results ---------------------------------------------------------------------------------------
    def _result_fields(self, text: str, *, inline: bool = True) -> tuple[dict[str, Any], str | None]:
        """``result_json`` inline (if ``inline`` and small), else ``result_ref`` (``runjournal.producers.results``);
        always the digest. Returns ``(fields, problem)``: ``problem`` when Redis refused a large result."""
        fields: dict[str, Any] = {"result_json": None, "result_ref": None, "result_digest": digest(text)}
        if inline and len(text.encode("utf-8")) <= self.journal.inline_result_bytes:
            fields["result_json"] = text
            return fields, None
        try:
            fields["result_ref"] = self.journal.results.put(text)
        except Exception as exc:  # noqa: BLE001 - the effect happened: record it, then say why its result is not
            return fields, f"Redis did not store the {len(text)}-character result ({type(exc).__name__}: {exc})"
        return fields, None

    def _recorded_result(self, planned: PlannedCall) -> Any:
        """The recorded result of a committed call, read back exactly as the live caller received it.

        Raises:
            ResultUnavailableError: the result is stored by reference and Redis no longer has it.
            UnrecordableResultError: the call committed without a result (it could not be recorded).
        """
        if planned.result_json is not None:
            return json.loads(planned.result_json)
        if planned.result_ref is not None:
            text = self.journal.results.get(planned.result_ref)
            if text is None:
                raise ResultUnavailableError(f"result {planned.result_ref} of call {planned.call_id} is not in Redis")
            return json.loads(text)
        raise UnrecordableResultError(
            f"{planned.tool} call {planned.call_id} committed but its result could not be recorded; it does not "
            "run again", call_id=planned.call_id, tool=planned.tool, reason="committed without a recorded result")

    @staticmethod
    def _unrecordable(tool: str, call_id: str, problem: str) -> UnrecordableResultError:
        return UnrecordableResultError(
            f"{tool} call {call_id} ran but its result cannot be recorded faithfully ({problem}); it is recorded "
            "as committed without a result and does not run again", call_id=call_id, tool=tool, reason=problem)

    # -- unknown outcomes ----------------------------------------------------------------------------
    def _settle_unknown(
        self, tool: Tool, planned: PlannedCall, key: str, common: dict[str, Any]
    ) -> Generator[Effect, Any, tuple[bool, Any]]:
        """Resolve an OUTCOME_UNKNOWN call (steps of ``CallMixin.call_steps``). Returns (True, result) when
        settled as committed, (False, None) when the tool should run (again) with the same key."""
        approval = self._approvals.get(planned.call_id)
        if approval == ApprovalStatus.GRANTED:
            return False, None
        who = {"call_id": planned.call_id, "idempotency_key": key, "tool": tool.name}
        if approval == ApprovalStatus.DENIED:
            raise ApprovalDeniedError(f"re-running {tool.name} call {planned.call_id} was denied", **who)
        reconcile = getattr(tool, "reconcile", None)
        if callable(reconcile):
            left_s = self._reconcile_after.pop(key, 0.0) - time.monotonic()
            if left_s > 0:  # went unknown in this handle: its request may still act until the tool's timeout
                yield Sleep(left_s)
        outcome: Outcome | None = (yield Reconcile(tool, key)) if callable(reconcile) else None
        if outcome is None:
            how = "its provider cannot tell" if callable(reconcile) else "the tool has no reconcile()"
            raise OutcomeUnknownError(
                f"{tool.name} call {planned.call_id} was intended but has no outcome and {how}; "
                "request an approval (DESIGN.md § The side-effect protocol)",
                **who,
            )
        return self._reconciled(tool, planned, outcome, common)

    def _reconciled(self, tool: Tool, planned: PlannedCall, outcome: Outcome,
                    common: dict[str, Any]) -> tuple[bool, Any]:
        node_id = self.node_path
        if not outcome.executed or outcome.error is not None:
            verdict = "NOT_EXECUTED" if not outcome.executed else "FAILED"
            self._publish(EventType.TOOL_CALL_RECONCILED, {**common, "outcome": verdict}, node_id=node_id,
                          durable=True)
            status = CallStatus.RECONCILED_NOT_EXECUTED if not outcome.executed else CallStatus.FAILED
            self._calls[planned.call_id] = replace(planned, status=status, retryable=True, error=outcome.error)
            return False, None
        recorded: RecordedValue = record_value(outcome.result)
        problem = recorded.problem
        fields: dict[str, Any] = {"result_json": None, "result_ref": None, "result_digest": None}
        if recorded.text is not None:
            fields, problem = self._result_fields(recorded.text)
        self._publish(EventType.TOOL_CALL_RECONCILED, {**common, "outcome": "COMMITTED", **fields},
                      node_id=node_id, durable=True)
        self._calls[planned.call_id] = replace(planned, status=CallStatus.RECONCILED_COMMITTED,
                                               result_json=fields["result_json"], result_ref=fields["result_ref"])
        if problem is not None:
            raise self._unrecordable(tool.name, planned.call_id, problem)
        return True, recorded.value

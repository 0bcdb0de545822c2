"""``RunHandle.call``: the side-effect protocol (DESIGN.md § The side-effect protocol).

1. key = ``idempotency_key(run_id, node path, call index)`` (1-based index per node path); the
   call's ``call_id`` in every TOOL_CALL_* event is the same string.
2. TOOL_CALL_INTENDED is published and its transaction committed (the broker's ack) *before*
   the tool runs.
3. The tool runs with the key.
4. TOOL_CALL_COMMITTED (result) or TOOL_CALL_FAILED (the tool raised) is published and
   committed before ``call`` returns or re-raises.

A call index is taken once the intent is accepted (or a recorded result is returned): a call
whose intent failed to publish did not happen, and the next call at that step gets the same key.

Read-only tools (``side_effect=False``) follow the same steps but non-durably: their events ride
in the open transaction. A crash can lose them; the recovery job then sees NOT_STARTED (or an
unknown read-only call) and the tool simply runs again — harmless, as it changes nothing.

On a resumed run, the plan entry for the key decides (see :meth:`CallMixin.call`).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from runjournal.core import failpoints
from runjournal.producers._digest import canonical_json, digest, idempotency_key
from runjournal.producers.errors import (
    ApprovalDeniedError,
    OutcomeUnknownError,
    PlanMismatchError,
    RecordedFailureError,
    ResultUnavailableError,
)
from runjournal.producers.plan import ApprovalStatus, CallStatus, PlannedCall
from runjournal.producers.tools import Outcome, Tool
from runjournal.schemas import Event, EventType

if TYPE_CHECKING:
    from runjournal.producers._port import JournalPort
    from runjournal.producers.plan import RecoveryPlan

__all__ = ["CallMixin", "error_text"]

log = logging.getLogger("runjournal.producers.calls")

_MAX_ERROR_CHARS = 4000
_DONE = frozenset({CallStatus.COMMITTED, CallStatus.RECONCILED_COMMITTED})


def error_text(exc: BaseException) -> str:
    """``"Type: message"``, capped at 4000 characters."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 3] + "..."


class CallMixin:
    """The ``call`` half of :class:`~runjournal.producers.handle.RunHandle` (kept apart to keep modules small)."""

    journal: JournalPort
    run_id: str
    plan: RecoveryPlan | None
    _call_counts: dict[str, int]

    # provided by RunHandle
    @property
    def node_path(self) -> str | None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _check_writable(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _publish(
        self, etype: EventType, payload: dict[str, Any], *, node_id: str | None, durable: bool
    ) -> Event:
        raise NotImplementedError  # pragma: no cover - overridden

    def call(self, tool: Tool, args: dict[str, Any], *, side_effect: bool | None = None) -> Any:
        """Run ``tool(args, idempotency_key)`` under the side-effect protocol and return its result.

        Args:
            tool: a :class:`~runjournal.producers.tools.Tool` (``name``, ``side_effect``, ``timeout_ms``,
                optional ``reconcile``).
            args: JSON-serialisable arguments; recorded as ``args_digest`` (sha256 of canonical JSON) and,
                when at most ``inline_result_bytes``, as ``args_json``.
            side_effect: overrides ``tool.side_effect``.

        On a resumed run, by the plan's status for this step's key:

        * COMMITTED / RECONCILED_COMMITTED → the recorded result is returned; the tool does not run,
          nothing is published;
        * OUTCOME_UNKNOWN → approval GRANTED: run again (same key); DENIED: ``ApprovalDeniedError``;
          otherwise ``tool.reconcile(key)``: executed → TOOL_CALL_RECONCILED(COMMITTED), result returned;
          executed with error → RECONCILED(FAILED), then run again; not executed →
          RECONCILED(NOT_EXECUTED), then run (same key); None or no ``reconcile`` → ``OutcomeUnknownError``;
        * NOT_STARTED / RECONCILED_NOT_EXECUTED / FAILED / absent → run (attempt = recorded attempts + 1).

        Returns:
            The tool's result (or the recorded one, as parsed JSON).

        Raises:
            The tool's own exception, after TOOL_CALL_FAILED is acknowledged.
            OutcomeUnknownError / ApprovalDeniedError / PlanMismatchError / ResultUnavailableError:
                resumed runs only.
            DeliveryError, ProducerFencedError, RunClosedError, QueueFullError, EventTooLargeError: publishing
            failed; if that was the intent, the tool did not run.
        """
        self._check_writable()
        node_path = self.node_path or ""
        index = self._call_counts.get(node_path, 0) + 1
        key = idempotency_key(self.run_id, node_path, index)
        effect = tool.side_effect if side_effect is None else side_effect
        args_json = canonical_json(args)
        common = {"call_id": key, "tool": tool.name, "idempotency_key": key, "args_digest": digest(args_json)}
        planned = self.plan.calls.get(key) if self.plan is not None else None
        if planned is not None:
            if planned.tool != tool.name:
                raise PlanMismatchError(
                    f"run {self.run_id} step {node_path or '<top>'} call {index}: plan records tool "
                    f"{planned.tool!r} for key {key}, the code calls {tool.name!r}"
                )
            if planned.args_digest is not None and planned.args_digest != common["args_digest"]:
                raise PlanMismatchError(
                    f"run {self.run_id} step {node_path or '<top>'} call {index}: {tool.name} was called with "
                    f"other arguments before the crash (args digest {planned.args_digest[:12]}…, now "
                    f"{common['args_digest'][:12]}…); its recorded outcome cannot answer this call"
                )
            if planned.status is CallStatus.FAILED and planned.retryable is False:
                self._call_counts[node_path] = index
                raise RecordedFailureError(
                    f"{tool.name} call {planned.call_id} failed before the crash and is not retryable: "
                    f"{planned.error}", error=planned.error, call_id=planned.call_id, tool=tool.name)
            if planned.status in _DONE:
                result = self._recorded_result(planned)
                self._call_counts[node_path] = index
                return result
            if planned.status is CallStatus.OUTCOME_UNKNOWN and effect and planned.side_effect:
                settled, result = self._settle_unknown(tool, planned, key, common, effect)
                if settled:
                    self._call_counts[node_path] = index
                    return result
        attempt = (planned.attempts if planned is not None else 0) + 1
        return self._execute(tool, args, args_json, common, node_path, index, effect, attempt)

    def _execute(
        self,
        tool: Tool,
        args: dict[str, Any],
        args_json: str,
        common: dict[str, Any],
        node_path: str,
        index: int,
        effect: bool,
        attempt: int,
    ) -> Any:
        node_id = node_path or None
        inline = len(args_json.encode("utf-8")) <= self.journal.inline_result_bytes
        intended = {
            **common,
            "side_effect": effect,
            "attempt": attempt,
            "timeout_ms": int(tool.timeout_ms),
            "args_json": args_json if inline else None,
        }
        self._publish(EventType.TOOL_CALL_INTENDED, intended, node_id=node_id, durable=effect)
        self._call_counts[node_path] = index
        failpoints.hit("producers.call.after_intent")
        if effect:
            self.journal.check_still_owner()  # a paused zombie whose lease expired must not send now
        try:
            result = tool(args, common["idempotency_key"])
            failpoints.hit("producers.call.after_tool")
        except Exception as exc:
            failed = {**common, "error": error_text(exc), "retryable": bool(getattr(exc, "retryable", False))}
            self._publish(EventType.TOOL_CALL_FAILED, failed, node_id=node_id, durable=effect)
            raise
        committed = {**common, **self._result_fields(result)}
        self._publish(EventType.TOOL_CALL_COMMITTED, committed, node_id=node_id, durable=effect)
        failpoints.hit("producers.call.after_outcome")
        return result

    def _settle_unknown(
        self, tool: Tool, planned: PlannedCall, key: str, common: dict[str, Any], effect: bool
    ) -> tuple[bool, Any]:
        """Resolve an OUTCOME_UNKNOWN step. Returns (True, result) when settled as committed,
        (False, None) when the tool should run (again) with the same key."""
        assert self.plan is not None
        approval = self.plan.approvals.get(planned.call_id)
        if approval == ApprovalStatus.GRANTED:
            return False, None
        who = {"call_id": planned.call_id, "idempotency_key": key, "tool": tool.name}
        if approval == ApprovalStatus.DENIED:
            raise ApprovalDeniedError(f"re-running {tool.name} call {planned.call_id} was denied", **who)
        reconcile = getattr(tool, "reconcile", None)
        outcome: Outcome | None = reconcile(key) if callable(reconcile) else None
        if outcome is None:
            how = "its provider cannot tell" if callable(reconcile) else "the tool has no reconcile()"
            raise OutcomeUnknownError(
                f"{tool.name} call {planned.call_id} was intended but has no outcome and {how}; "
                "request an approval (DESIGN.md § The side-effect protocol)",
                **who,
            )
        node_id = self.node_path
        if not outcome.executed:
            payload = {**common, "outcome": "NOT_EXECUTED"}
            self._publish(EventType.TOOL_CALL_RECONCILED, payload, node_id=node_id, durable=True)
            return False, None
        if outcome.error is not None:
            payload = {**common, "outcome": "FAILED"}
            self._publish(EventType.TOOL_CALL_RECONCILED, payload, node_id=node_id, durable=True)
            return False, None
        payload = {**common, "outcome": "COMMITTED", **self._result_fields(outcome.result)}
        self._publish(EventType.TOOL_CALL_RECONCILED, payload, node_id=node_id, durable=True)
        return True, outcome.result

    def _result_fields(self, result: Any) -> dict[str, Any]:
        """``result_json`` inline if small, else ``result_ref`` (runjournal.producers.results); always the digest."""
        text = canonical_json(result)
        fields: dict[str, Any] = {"result_json": None, "result_ref": None, "result_digest": digest(text)}
        if len(text.encode("utf-8")) <= self.journal.inline_result_bytes:
            fields["result_json"] = text
            return fields
        try:
            fields["result_ref"] = self.journal.results.put(text)
        except Exception as exc:  # noqa: BLE001 - the effect happened: record it even without its result
            log.error(
                "could not store a %d-byte result in Redis (%s); recording its digest only", len(text), exc
            )
        return fields

    def _recorded_result(self, planned: PlannedCall) -> Any:
        if planned.result_json is not None:
            return json.loads(planned.result_json)
        if planned.result_ref is not None:
            text = self.journal.results.get(planned.result_ref)
            if text is None:
                raise ResultUnavailableError(
                    f"result {planned.result_ref} of call {planned.call_id} is not in Redis"
                )
            return json.loads(text)
        if planned.status is CallStatus.RECONCILED_COMMITTED:
            return None
        raise ResultUnavailableError(f"call {planned.call_id} committed but its result was not recorded")

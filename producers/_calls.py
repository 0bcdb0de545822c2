"""``RunHandle.call``: the side-effect protocol (DESIGN.md § The side-effect protocol).

1. key = ``idempotency_key(run_id, node path, call index)`` (1-based index per node path); the
   call's ``call_id`` in every TOOL_CALL_* event is the same string.
2. TOOL_CALL_INTENDED is published and its transaction committed (the broker's ack) *before*
   the tool runs; the instance's lease is read while that commit is in flight and checked with the lease's
   local validity after it (``Journal.check_still_owner``).
3. The tool runs with the key.
4. TOOL_CALL_COMMITTED (the result, recorded as canonical JSON that round-trips) or TOOL_CALL_FAILED
   (a definite failure) is published and committed before ``call`` returns or re-raises — except in group
   commit (``Journal(outcome_commit="group")``, the default), where a reconcilable tool's TOOL_CALL_COMMITTED
   rides the next commit (:meth:`CallMixin._groups_outcome`; a crash before it leaves the call unknown,
   reconciled by key). A failure
   that leaves the outcome unknown (``runjournal.producers._unknown``) publishes nothing: the call
   stays intended and ``call`` raises ``OutcomeUnknownError``. What happens when step 4 itself fails:
   ``runjournal.producers._outcomes``.

A call index is taken once the intent is accepted (or a recorded result is returned): a call
whose intent failed to publish did not happen, and the next call at that step gets the same key.

**A new attempt never gets a new key.** A call that did not give its caller a value (it raised after
its intent: the tool failed or its outcome is unknown or not yet durable) is *open*; calling the same
tool with the same arguments at the same node path again is the next attempt of that same call: same
index, same key. Its recorded state decides, exactly as for a resumed run: a recorded outcome is
returned (nothing runs), an unknown one is reconciled or held for approval, a failed one runs again
(attempt + 1). The live caller and a resumed run therefore see the same keys and the same values.

Read-only tools (``side_effect=False``) follow the same steps but non-durably: their events ride
in the open transaction. A crash can lose them; the recovery job then sees NOT_STARTED (or an
unknown read-only call) and the tool simply runs again — harmless, as it changes nothing.

On a resumed run, the plan entry for the key decides (see :meth:`CallMixin.call`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from runjournal.core import failpoints
from runjournal.producers._digest import canonical_json, digest, idempotency_key
from runjournal.producers._outcomes import OutcomeMixin
from runjournal.producers._recorded import record_value
from runjournal.producers._steps import CallSteps, Invoke, drive
from runjournal.producers._unknown import outcome_unknown
from runjournal.producers.errors import OutcomeUnknownError, PlanMismatchError, RecordedFailureError
from runjournal.producers.plan import CallStatus, PlannedCall
from runjournal.producers.tools import Tool
from runjournal.schemas import EventType

if TYPE_CHECKING:
    from runjournal.producers.plan import RecoveryPlan

__all__ = ["CallMixin", "error_text"]

log = logging.getLogger("runjournal.producers.calls")

_MAX_ERROR_CHARS = 4000
_DONE = frozenset({CallStatus.COMMITTED, CallStatus.RECONCILED_COMMITTED})


def error_text(exc: BaseException) -> str:
    """``"Type: message"``, capped at 4000 characters, as valid Unicode (a lone surrogate is escaped)."""
    text = f"{type(exc).__name__}: {exc}"
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 3] + "..."


@dataclass(slots=True)
class LastCall:
    """The latest call at one node path (for recognising the next attempt of an open call)."""

    index: int
    key: str
    tool: str
    args_digest: str
    delivered: bool = False
    """True once ``call`` gave its caller a value; until then the call is open."""


class CallMixin(OutcomeMixin):
    """The ``call`` half of :class:`~runjournal.producers.handle.RunHandle` (kept apart to keep modules small)."""

    plan: RecoveryPlan | None
    _call_counts: dict[str, int]
    _last_call: dict[str, LastCall]

    def call(self, tool: Tool, args: dict[str, Any], *, side_effect: bool | None = None,
             step: str | None = None) -> Any:
        """Run ``tool(args, idempotency_key)`` under the side-effect protocol and return its recorded result.

        Args:
            tool: a :class:`~runjournal.producers.tools.Tool` (``name``, ``side_effect``, ``timeout_ms``,
                optional ``reconcile``).
            args: JSON-serialisable arguments; recorded as ``args_digest`` (sha256 of canonical JSON) and,
                when at most ``inline_result_bytes``, as ``args_json``.
            side_effect: overrides ``tool.side_effect``.
            step: a stable name of this call within the run, for callers that have one (a model's
                ``tool_call_id``): the key derives from ``(run_id, "#" + step, 1)`` instead of the open node
                path and call index, so it does not depend on the order calls arrive in (parallel tool calls,
                a graph resumed from a checkpoint). A step is *one* call: calling it again follows its recorded
                state (a committed step returns its recorded result, never runs under a new key).

        By the call's recorded state (a resumed run's plan, or this handle's own earlier attempt of an open
        call — same tool, same args, same node path):

        * COMMITTED / RECONCILED_COMMITTED → the recorded result is returned; the tool does not run,
          nothing is published;
        * OUTCOME_UNKNOWN → approval GRANTED: run again (same key); DENIED: ``ApprovalDeniedError``;
          otherwise, once the tool's timeout has passed, ``tool.reconcile(key)``: executed →
          TOOL_CALL_RECONCILED(COMMITTED), result returned; executed with error → RECONCILED(FAILED), then
          run again; not executed → RECONCILED(NOT_EXECUTED), then run (same key); None or no
          ``reconcile`` → ``OutcomeUnknownError``;
        * FAILED and not retryable, met for the first time on a resumed run → ``RecordedFailureError``;
        * NOT_STARTED / RECONCILED_NOT_EXECUTED / FAILED / absent → run (attempt = recorded attempts + 1).

        Returns:
            The result as recorded: ``json.loads`` of its canonical JSON (a tuple comes back as a list) —
            the same value a resumed run receives.

        Raises:
            The tool's own exception, after TOOL_CALL_FAILED is acknowledged (a definite failure).
            OutcomeUnknownError: the tool failed after its request may have left (nothing more is
                published; call again to reconcile), or an unknown outcome cannot be settled.
            UnrecordableResultError: the tool ran but its result cannot be recorded faithfully; the call is
                durable as committed without a result.
            OutcomeNotDurableError: the tool ran but its outcome was not acknowledged; call again.
            ApprovalDeniedError / PlanMismatchError / RecordedFailureError / ResultUnavailableError.
            DeliveryError, ProducerFencedError, LeaseLapsedError, RunClosedError, QueueFullError,
            EventTooLargeError: publishing failed; if that was the intent, the tool did not run.
        """
        return drive(self.call_steps(tool, args, side_effect=side_effect, step=step))

    def call_steps(self, tool: Tool, args: dict[str, Any], *, side_effect: bool | None = None,
                    step: str | None = None) -> CallSteps:
        """:meth:`call` as a step machine (``runjournal.producers._steps``): the one implementation of the
        protocol; the sync ``call`` and ``AsyncRunHandle.call`` only perform the effects it yields."""
        self._check_writable()
        self._flush_pending()
        effect = tool.side_effect if side_effect is None else side_effect
        args_json = canonical_json(args)
        args_digest = digest(args_json)
        if step is None:
            node_path = self.node_path or ""
            index, retry = self._call_index(node_path, tool.name, args_digest)
        else:
            node_path, index = _step_path(step), 1
            last = self._last_call.get(node_path)
            retry = last is not None and not last.delivered
        key = idempotency_key(self.run_id, node_path, index)
        common = {"call_id": key, "tool": tool.name, "idempotency_key": key, "args_digest": args_digest}
        planned = self._calls.get(key)
        if planned is not None:
            self._check_plan(planned, tool, args_digest, node_path, index)
            self._enter(node_path, index, key, tool.name, args_digest)
            if planned.status is CallStatus.FAILED and planned.retryable is False and not retry:
                raise RecordedFailureError(
                    f"{tool.name} call {planned.call_id} failed before the crash and is not retryable: "
                    f"{planned.error}", error=planned.error, call_id=planned.call_id, tool=tool.name)
            if planned.status in _DONE:
                return self._deliver(node_path, self._recorded_result(planned))
            if planned.status is CallStatus.OUTCOME_UNKNOWN and effect and planned.side_effect:
                settled, result = yield from self._settle_unknown(tool, planned, key, common)
                if settled:
                    return self._deliver(node_path, result)
        attempt = (planned.attempts if planned is not None else 0) + 1
        return (yield from self._execute(tool, args, args_json, common, node_path, index, effect, attempt))

    # -- steps ---------------------------------------------------------------------------------------
    def _groups_outcome(self, tool: Tool) -> bool:
        """True when this tool's TOOL_CALL_COMMITTED may ride the next commit (group commit): the journal's
        ``outcome_commit`` is ``group`` and the tool can ``reconcile()`` — so a crash before that commit leaves
        an OUTCOME_UNKNOWN that the next owner settles by key, never one only a human can settle. A FAILED or
        RECONCILED outcome is always committed before ``call`` returns: a deferred definite failure could be
        reconciled as "executed with error" and run again, which the strict mode would not do. A tool whose
        ``reconcile`` may answer None ("cannot tell") opts out with ``outcome_commit = "strict"``."""
        return (self.journal.outcome_commit == "group" and callable(getattr(tool, "reconcile", None))
                and getattr(tool, "outcome_commit", None) != "strict")  # a tool may opt out (producers/tools.py)

    def _call_index(self, node_path: str, tool: str, args_digest: str) -> tuple[int, bool]:
        """(index, is_retry): the open call's index when this is its next attempt, else the next index."""
        last = self._last_call.get(node_path)
        if last is not None and not last.delivered and last.tool == tool and last.args_digest == args_digest:
            return last.index, True
        return self._call_counts.get(node_path, 0) + 1, False

    def _enter(self, node_path: str, index: int, key: str, tool: str, args_digest: str) -> None:
        """The call at ``index`` happened (intent accepted, or a recorded state met): count it, mark it open."""
        self._call_counts[node_path] = max(index, self._call_counts.get(node_path, 0))
        self._last_call[node_path] = LastCall(index, key, tool, args_digest)

    def _deliver(self, node_path: str, value: Any) -> Any:
        last = self._last_call.get(node_path)
        if last is not None:
            last.delivered = True
        return value

    def _check_plan(self, planned: PlannedCall, tool: Tool, args_digest: str, node_path: str, index: int) -> None:
        if planned.tool != tool.name:
            raise PlanMismatchError(
                f"run {self.run_id} step {node_path or '<top>'} call {index}: plan records tool "
                f"{planned.tool!r} for key {planned.call_id}, the code calls {tool.name!r}"
            )
        if planned.args_digest is not None and planned.args_digest != args_digest:
            raise PlanMismatchError(
                f"run {self.run_id} step {node_path or '<top>'} call {index}: {tool.name} was called with "
                f"other arguments before the crash (args digest {planned.args_digest[:12]}…, now "
                f"{args_digest[:12]}…); its recorded outcome cannot answer this call"
            )

    def _execute(self, tool: Tool, args: dict[str, Any], args_json: str, common: dict[str, Any], node_path: str,
                 index: int, effect: bool, attempt: int) -> CallSteps:
        key = common["idempotency_key"]
        inline = len(args_json.encode("utf-8")) <= self.journal.inline_result_bytes
        intended = {**common, "side_effect": effect, "attempt": attempt, "timeout_ms": int(tool.timeout_ms),
                    "args_json": args_json if inline else None}
        probe = self.journal.probe_lease() if effect else None  # its GET overlaps the intent's commit
        self._publish(EventType.TOOL_CALL_INTENDED, intended, node_id=node_path or None, durable=effect)
        self._enter(node_path, index, key, tool.name, common["args_digest"])
        failpoints.hit("producers.call.after_intent")
        if effect:
            self.journal.check_still_owner(probe)  # a paused zombie whose lease expired must not send now
        self._reconcile_after[key] = time.monotonic() + int(tool.timeout_ms) / 1000
        try:
            result = yield Invoke(tool, args, key)
        except BaseException as exc:
            self._after_raise(tool, exc, common, node_path, effect, attempt)
        failpoints.hit("producers.call.after_tool")
        value = self._commit_outcome(tool, result, common, node_path, effect, attempt)
        failpoints.hit("producers.call.after_outcome")
        return self._deliver(node_path, value)

    def _after_raise(self, tool: Tool, exc: BaseException, common: dict[str, Any], node_path: str, effect: bool,
                     attempt: int) -> NoReturn:
        """The tool raised: an unknown outcome publishes nothing (the call stays intended); a definite failure
        is recorded as TOOL_CALL_FAILED. Always raises."""
        key = common["idempotency_key"]
        base = {"call_id": key, "tool": tool.name, "attempts": attempt, "side_effect": effect,
                "args_digest": common["args_digest"]}
        if effect and (not isinstance(exc, Exception) or outcome_unknown(exc)):
            self._calls[key] = PlannedCall(status=CallStatus.OUTCOME_UNKNOWN, **base)
            if not isinstance(exc, Exception):
                raise exc  # interrupted inside the tool (KeyboardInterrupt …): the call stays intended
            raise OutcomeUnknownError(
                f"{tool.name} call {key} raised {error_text(exc)} after its request may have left: the outcome is "
                "unknown; call it again to reconcile it by key (it is not run blindly), or request an approval",
                call_id=key, idempotency_key=key, tool=tool.name) from exc
        if not isinstance(exc, Exception):
            raise exc  # a read-only call interrupted: nothing to state, it may simply run again
        retryable = bool(getattr(exc, "retryable", False))
        failed = {**common, "error": error_text(exc), "retryable": retryable}
        entry = PlannedCall(status=CallStatus.FAILED, retryable=retryable, error=failed["error"], **base)
        self._record_outcome(EventType.TOOL_CALL_FAILED, failed, node_path, effect, entry, tool_error=exc)
        raise exc

    def _commit_outcome(self, tool: Tool, result: Any, common: dict[str, Any], node_path: str, effect: bool,
                        attempt: int) -> Any:
        """Record TOOL_CALL_COMMITTED; return the value as recorded (raises UnrecordableResultError after the
        outcome is durable when the result cannot be recorded faithfully)."""
        key = common["idempotency_key"]
        base = {"call_id": key, "tool": tool.name, "attempts": attempt, "side_effect": effect,
                "args_digest": common["args_digest"]}
        recorded = record_value(result)
        problem = recorded.problem
        fields: dict[str, Any] = {"result_json": None, "result_ref": None,
                                  "result_digest": digest(f"unrecordable: {problem}")}
        smaller = None
        if recorded.text is not None:
            text = recorded.text
            fields, problem = self._result_fields(text)

            def by_reference() -> tuple[dict[str, Any], PlannedCall] | None:
                ref_fields, ref_problem = self._result_fields(text, inline=False)
                if ref_problem is not None:
                    return None
                entry = PlannedCall(status=CallStatus.COMMITTED, result_ref=ref_fields["result_ref"], **base)
                return {**common, **ref_fields}, entry

            smaller = by_reference if fields["result_json"] is not None else None
        entry = PlannedCall(status=CallStatus.COMMITTED, result_json=fields["result_json"],
                            result_ref=fields["result_ref"], **base)
        self._record_outcome(EventType.TOOL_CALL_COMMITTED, {**common, **fields}, node_path, effect, entry,
                             smaller=smaller, deferred=effect and problem is None and self._groups_outcome(tool))
        if problem is not None:  # the call stays open: calling it again raises this again, never re-runs it
            raise self._unrecordable(tool.name, key, problem)
        return recorded.value


def _step_path(step: str) -> str:
    """The key path of a named step (``call(step=...)``): ``#`` + the name. No node path starts with ``#`` (node
    names cannot hold it), so a step never shares a key with a call made inside a node."""
    if not step:
        raise ValueError("a call's step must be a non-empty string")
    return f"#{step}"

"""RunHandle: one run's writer — seq, epoch, node paths, the side-effect protocol (``call``).

A handle may be shared by threads (LangGraph's ToolNode runs a model turn's tool calls on a thread pool): it
serialises what it publishes with the run's lock (``Journal.run_lock``, shared by every handle and framework
record store of the run in this process), held while a step of ``call`` decides and publishes — never while the
tool runs, so tools run in parallel and seqs follow publish order. Give parallel calls ``step=`` names so their
keys do not depend on the order they arrive in. Nodes (``with run.node(...)``) are a stack per handle: open them
from one thread at a time. Rules: docs/operations/concurrency.md.

Per-run rules it enforces (docs/design/protocol.md § Events):

* ``seq`` starts at 1 (or at ``plan.last_seq + 1`` after a resume) and grows by exactly 1 per
  *published* event — a publish that raised did not consume its seq;
* ``epoch`` is 1 for a new run, ``plan.epoch`` for a resumed one;
* node paths are deterministic: ``outer/inner``, and the n-th entry (n >= 2) of the same name
  under the same parent is ``name#n`` — so a resumed run that re-executes the same code
  derives the same paths, and with them the same idempotency keys.

**``call``: the side-effect protocol** (docs/design/protocol.md § The side-effect protocol).

1. key = ``idempotency_key(run_id, node path, call index)`` (1-based index per node path); the
   call's ``call_id`` in every TOOL_CALL_* event is the same string.
2. TOOL_CALL_INTENDED is published and its transaction committed (the broker's ack) *before*
   the tool runs; the instance's lease is read while that commit is in flight and checked with the lease's
   local validity after it (``Journal.check_still_owner``).
3. The tool runs with the key.
4. TOOL_CALL_COMMITTED (the result, recorded as canonical JSON that round-trips) or TOOL_CALL_FAILED
   (a definite failure) is published and committed before ``call`` returns or re-raises — except in group
   commit (``Journal(outcome_commit="group")``, the default), where a reconcilable tool's TOOL_CALL_COMMITTED
   rides the next commit (:meth:`RunHandle._groups_outcome`; a crash before it leaves the call unknown,
   reconciled by key). A failure
   that leaves the outcome unknown (``runjournal.producers._unknown``) publishes nothing: the call
   stays intended and ``call`` raises ``OutcomeUnknownError``. What happens when step 4 itself fails:
   *After the effect*, below.

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

On a resumed run, the plan entry for the key decides (see :meth:`RunHandle.call`).

**After the effect**: how the handle makes a tool's outcome durable, reads recorded results back and settles
calls whose outcome is unknown.

docs/design/protocol.md "Decisions after the first build", after the effect. Once a tool has been invoked, exactly one
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
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

from runjournal.core import failpoints
from runjournal.core.ids import CALL_ID, NODE_PATH, STEP, USER_ID, InvalidIdError
from runjournal.core.otel import tracer as otel_tracer
from runjournal.producers._digest import canonical_json, canonical_value, digest, enter_node, idempotency_key
from runjournal.producers._recorded import RecordedValue, record_value
from runjournal.producers._steps import CallSteps, Effect, Invoke, Reconcile, Sleep, advance, drive
from runjournal.producers._unknown import outcome_unknown
from runjournal.producers.control import WAIT, ControlRequest, ControlStore, current_stop, reset_stop
from runjournal.producers.encryption import ContentCrypto, payload_address, signal_address
from runjournal.producers.errors import (
    ApprovalDeniedError,
    ArgumentsTooLargeError,
    DeliveryError,
    JournalError,
    LeaseLapsedError,
    OutcomeNotDurableError,
    OutcomeUnknownError,
    PlanMismatchError,
    ProducerFencedError,
    QueueFullError,
    RecordedFailureError,
    ResultTooLargeError,
    ResultUnavailableError,
    RunCancelledError,
    RunClosedError,
    RunPausedError,
    RunStoppedError,
    RunTooLongError,
    RunWaitingError,
    SignalTimeoutError,
    UnrecordableResultError,
)
from runjournal.producers.plan import ApprovalStatus, CallVerdict, PlannedCall
from runjournal.producers.results import unavailable_reason
from runjournal.producers.spend import (
    RESERVE_TOOL,
    SETTLE_TOOL,
    Reservation,
    SpendLedger,
    SpendPolicy,
    SpendReserve,
    SpendSettle,
)
from runjournal.producers.spend import reserve as reserve_spend
from runjournal.producers.streams import Stream
from runjournal.producers.tools import Outcome, Tool
from runjournal.producers.tracing import RunTrace, current_traceparent
from runjournal.producers.waits import SignalInbox, SignalReceive, TimerStart
from runjournal.schemas import DURABLE_TYPES, Event, EventType, new_event_id, utcnow

if TYPE_CHECKING:
    from runjournal.producers._port import JournalPort
    from runjournal.producers.plan import RecoveryPlan

__all__ = ["LastCall", "PendingOutcome", "RunHandle", "error_text"]

log = logging.getLogger("runjournal.producers.handle")

_NOT_EMITTABLE = frozenset(
    {EventType.RUN_STARTED, EventType.RUN_RESUMED, EventType.RUN_SUCCEEDED, EventType.RUN_FAILED}
)
_TERMINAL = frozenset({EventType.RUN_SUCCEEDED, EventType.RUN_FAILED, EventType.RUN_CANCELLED})
#: What a run past its hard event limit (``Settings.run_events_max``) may no longer publish: what starts new work —
#: a new call's first intent (attempt 1), a message, a correction, a plan. Settling recorded work always goes through
#: (a node entered again on resume, an outcome, a reconcile, a recorded call's next attempt, an approval request to
#: re-run an unknown call, a decision) and so does the run's end: a run resumed past its limit can settle its open
#: calls, then its next new call is refused (README § Limits).
_NEW_WORK = frozenset({EventType.PLAN_COMPILED, EventType.TOOL_CALL_INTENDED, EventType.MESSAGE,
                       EventType.USER_CORRECTION})
_APPROVAL = {EventType.APPROVAL_REQUESTED: ApprovalStatus.PENDING, EventType.APPROVAL_GRANTED: ApprovalStatus.GRANTED,
             EventType.APPROVAL_DENIED: ApprovalStatus.DENIED}
_MAX_ERROR_CHARS = 4000
_DONE = frozenset({CallVerdict.COMMITTED, CallVerdict.RECONCILED_COMMITTED})


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
    running: bool = True
    """True while its ``call`` has not returned or raised: another thread's call with the same tool and arguments
    is then a call of its own (the next index), never taken for this one's retry."""


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


class _TooLarge(str):
    """A ``_result_fields`` problem: the result is over ``max_result_bytes`` (raised as ``ResultTooLargeError``)."""

    size: int
    limit: int

    def __new__(cls, text: str, size: int, limit: int) -> _TooLarge:
        made = super().__new__(cls, text)
        made.size, made.limit = size, limit
        return made


def approval_id(call_id: str, attempt: int) -> str:
    """``<call_id>@<attempt>``: the id an approval to re-run attempt ``attempt`` of an unknown-outcome call is asked
    under — it authorises that one re-run (docs/design/protocol.md § The side-effect protocol)."""
    return f"{call_id}@{attempt}"


def approval_scope(approval: str) -> tuple[str | None, int | None]:
    """``(call_id, attempt)`` an approval id of :func:`approval_id`'s form authorises, else ``(None, None)`` (an
    approval not bound to one attempt: a step's own id, or a bare call id)."""
    head, _, attempt = approval.rpartition("@")
    if head and attempt.isdigit() and not attempt.startswith("0"):
        return head, int(attempt)
    return None, None


class RunHandle:
    """Publishes one run's events. Get one from ``Journal.start_run`` or ``Journal.resume``.

    Usable as a context manager: an exception escaping the block publishes RUN_FAILED (unless the
    run already ended or the handle can no longer write); a clean exit publishes nothing — call
    :meth:`succeed`. An unfinished run stays in the instance's owned set, so if the instance goes
    away the recovery job resumes it.

    Attributes:
        run_id, tenant_id, agent, epoch, producer_id: the run's identity and ownership.
        plan: the recovery plan it resumed from, or None for a new run.
    """

    def __init__(
        self,
        journal: JournalPort,
        *,
        run_id: str,
        tenant_id: str,
        agent: str,
        epoch: int,
        next_seq: int,
        plan: RecoveryPlan | None = None,
        traceparent: str | None = None,
    ) -> None:
        self.journal = journal
        self.run_id = run_id
        self.tenant_id = tenant_id
        self.agent = agent
        self.epoch = epoch
        self.producer_id = journal.producer_id
        self.plan = plan
        self._next_seq = next_seq
        warn, limit = journal.run_events_warn, journal.run_events_max
        self._budget_from = min(b for b in (warn, limit + 1 if limit else 0, 2**63) if b)
        """The first seq checked against the run's event budget (:meth:`_event_budget`)."""
        self._budget_warned = False
        self._traceparent = traceparent
        self._fence_mark = journal.fence_count
        self._finished: EventType | None = None
        self._broken: DeliveryError | None = None
        self._node_stack: list[str] = []
        self._entries: dict[str, dict[str, int]] = {}
        self._call_counts: dict[str, int] = {}
        self._last_call: dict[str, LastCall] = {}
        self._in_flight: dict[str, LastCall] = {}
        """idempotency key → its call while ``call`` runs (several at once: threads and tasks sharing the handle)."""
        self._calls: dict[str, PlannedCall] = dict(plan.calls) if plan is not None else {}
        """idempotency key -> what is known of the call: the plan's entries, then this handle's own outcomes."""
        self._approvals: dict[str, ApprovalStatus] = dict(plan.approvals) if plan is not None else {}
        self._lineage: tuple[str, ...] = plan.fork_lineage if plan is not None else ()
        self._pending: PendingOutcome | None = None
        self._reconcile_after: dict[str, float] = {}
        self._delivered: LastCall | None = None
        self._sending = 0
        """Side-effect requests handed to a tool and not yet returned (:meth:`wait_idle`)."""
        self._idle = threading.Condition()
        self._surrendered = False
        self._stop_error: RunStoppedError | None = None
        """Set once an operator's request was carried out here: no new intent, node or approval starts."""
        run_lock = getattr(journal, "run_lock", None)
        self._lock: threading.RLock = run_lock(run_id) if callable(run_lock) else threading.RLock()
        """The run's lock: held by every step that decides or publishes (module docstring)."""
        trc = otel_tracer()
        self._trace: RunTrace | None = None if trc is None else RunTrace(
            trc, run_id=run_id, tenant_id=tenant_id, agent=agent, epoch=epoch, resumed=plan is not None,
            sealed=bool(getattr(getattr(journal, "content", None), "encrypting", False)))
        """This segment's OpenTelemetry spans, or None when tracing is off (``runjournal.core.otel``)."""

    @classmethod
    def start_new(
        cls,
        journal: JournalPort,
        *,
        run_id: str,
        tenant_id: str,
        agent: str,
        input_json: str,
        user_id: str | None,
        traceparent: str | None,
    ) -> RunHandle:
        """A handle for a new run (epoch 1) after publishing its RUN_STARTED (seq 1, non-durable).

        Used by ``Journal.start_run``; raises as :meth:`emit`.
        """
        handle = cls(
            journal,
            run_id=run_id,
            tenant_id=tenant_id,
            agent=agent,
            epoch=1,
            next_seq=1,
            traceparent=traceparent,
        )
        payload = {"agent": agent, "input_json": input_json, "user_id": user_id}
        trace = handle._trace
        root = None if trace is None else trace.start_root(agent, traceparent or current_traceparent.get())
        try:
            handle._publish(EventType.RUN_STARTED, payload, node_id=None, durable=False)
        except BaseException:
            handle.end_trace("not_started")
            raise
        finally:
            if root is not None:
                root.end()  # the root marks the run's start; its segments carry the durations (0054)
        return handle

    # -- state ----------------------------------------------------------------------------------
    @property
    def last_seq(self) -> int:
        """The seq of the last event this handle published (or the plan's ``last_seq`` before any)."""
        return self._next_seq - 1

    @property
    def node_path(self) -> str | None:
        """The innermost open node's path, or None at the run's top level."""
        return self._node_stack[-1] if self._node_stack else None

    def approval(self, call_id: str) -> ApprovalStatus | None:
        """The journal's state of approval ``call_id`` for this run as this handle knows it: the recovery plan's,
        updated by the APPROVAL_* events the handle published (PENDING / GRANTED / DENIED), or None."""
        return self._approvals.get(call_id)

    @property
    def forked_from(self) -> str | None:
        """The run this one was forked from (``runjournal fork``), or None."""
        return self._lineage[0] if self._lineage else None

    @property
    def input(self) -> Any:
        """The run's input as recorded (RUN_STARTED ``input_json`` parsed), when this handle knows it: a resumed or
        forked run's plan carries it; None otherwise."""
        text = self.plan.input_json if self.plan is not None else None
        return None if text is None else json.loads(text)

    @property
    def finished(self) -> bool:
        """True once RUN_SUCCEEDED / RUN_FAILED / RUN_CANCELLED was published through this handle."""
        return self._finished is not None

    @property
    def writable(self) -> bool:
        """False once finished, fenced, broken by a lost event, or stopped by an operator's request (a stopped
        handle still records the outcomes of calls in flight, and nothing else)."""
        if self._stop_error is not None:
            return False
        try:
            self._check_writable()
        except (RunClosedError, DeliveryError):
            return False
        return True

    def _check_writable(self) -> None:
        if self._finished is not None:
            if isinstance(self._stop_error, RunCancelledError):
                raise self._stop_error  # ended by an operator's cancel: say so, not just "closed"
            raise RunClosedError(f"run {self.run_id} already ended ({self._finished})")
        if self.journal.fence_count != self._fence_mark:
            kind = LeaseLapsedError if self.journal.lapsed else ProducerFencedError
            raise kind(
                f"instance {self.producer_id} was fenced; run {self.run_id} now belongs to the recovery job"
            )
        if self._broken is not None:
            err = type(self._broken)(
                f"run {self.run_id} lost events and stopped: {self._broken}; this instance handed the run to the "
                "recovery job (surrendered), which resumes it under a new epoch on a live instance — do not write it "
                "again here (docs/design/protocol.md § Surrender)")
            err.retryable = False
            raise err from self._broken

    def _on_lost(self, error: DeliveryError) -> None:
        """Called by the journal (any thread) when an already-accepted event of this run was lost."""
        self._break(error)

    def _break(self, error: DeliveryError) -> None:
        """The handle stops for good (an event's fate is unknown: its seq cannot be reused) and gives the run up:
        ``Journal.surrender`` hands it to the recovery job once every request this handle sent has returned."""
        self._broken = error
        if self._surrendered:
            return
        self._surrendered = True
        surrender = getattr(self.journal, "surrender", None)
        if callable(surrender):
            surrender(self)

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Wait until no side-effect request of this handle is in flight (every tool it invoked returned or
        raised, and its outcome was handed to the journal or found unpublishable); True when idle, False on timeout
        (s). A broken or stopped handle sends no new request."""
        with self._idle:
            return self._idle.wait_for(lambda: self._sending == 0, timeout_s)

    def _begin_send(self) -> None:
        """Under the run's lock, just before a side-effect request: refuse it once the handle broke (the run is
        being handed over), else count it in flight."""
        self._check_writable()
        with self._idle:
            self._sending += 1

    def _end_send(self) -> None:
        with self._idle:
            self._sending -= 1
            if self._sending == 0:
                self._idle.notify_all()

    # -- publishing -------------------------------------------------------------------------------
    def _event(self, etype: EventType, payload: dict[str, Any], node_id: str | None) -> Event:
        """A new event of this run with the next seq (not yet published)."""
        if self._next_seq >= self._budget_from:
            self._event_budget(etype, payload)
        return Event(  # positional, in the fields' order (event_id … traceparent): the cheapest call on this path
            new_event_id(), self.run_id, self.tenant_id, self._next_seq, self.epoch, self.producer_id, etype, utcnow(),
            payload, node_id, self._trace.traceparent_for(payload, node_id) if self._trace is not None
            else self._traceparent or current_traceparent.get(),
        )

    def _event_budget(self, etype: EventType, payload: dict[str, Any]) -> None:
        """The run's event budget, for the event about to take ``self._next_seq`` (README § Limits): past
        ``Settings.run_events_max`` new work (``_NEW_WORK``) is refused; at ``run_events_warn`` the journal is told
        once per handle (a warning and ``runjournal_journal_runs_over_event_budget_total``).

        Raises:
            RunTooLongError: new work past ``run_events_max``; nothing was published.
        """
        seq, limit, warn = self._next_seq, self.journal.run_events_max, self.journal.run_events_warn
        if limit and seq > limit and etype in _NEW_WORK and payload.get("tool") != SETTLE_TOOL and \
                (etype is not EventType.TOOL_CALL_INTENDED or int(payload.get("attempt") or 1) <= 1):
            raise RunTooLongError(self.run_id, seq, limit)
        if warn and seq >= warn and not self._budget_warned:
            self._budget_warned = True
            self.journal.event_budget_reached(self.run_id, seq)

    def advance(self, steps: CallSteps, value: Any = None, error: BaseException | None = None) -> tuple[bool, Any]:
        """Run the next step of ``steps`` (a :meth:`call_steps` or approval generator of this handle) under the run's
        lock: ``runjournal.producers._steps.advance``, one writer at a time. The sync and async drivers use it."""
        with self._lock:
            return advance(steps, value, error)

    def advance_call(self, steps: CallSteps, value: Any = None,
                     error: BaseException | None = None) -> tuple[bool, Any, LastCall | None]:
        """:meth:`advance`, and when the call returned, the call it delivered (for :meth:`undeliver`)."""
        with self._lock:
            self._delivered = None
            done, out = advance(steps, value, error)
            return done, out, (self._delivered if done else None)

    def close_steps(self, steps: CallSteps) -> None:
        """Abandon ``steps`` (a cancelled caller) under the run's lock: an intended call stays open (OUTCOME_UNKNOWN
        for this handle, reconciled by key on the next attempt), never a new key."""
        with self._lock:
            steps.close()

    def _publish(
        self, etype: EventType, payload: dict[str, Any], *, node_id: str | None, durable: bool
    ) -> Event:
        with self._lock:
            return self._publish_locked(etype, payload, node_id=node_id, durable=durable)

    def _publish_locked(
        self, etype: EventType, payload: dict[str, Any], *, node_id: str | None, durable: bool
    ) -> Event:
        self._check_writable()
        if self._pending is not None:
            self._flush_pending()  # a tool's outcome not yet durable goes first (After the effect)
        event = self._event(etype, payload, node_id)
        try:
            self.journal.publish(event, durable=durable, on_lost=self._on_lost)
        except DeliveryError as exc:
            if not exc.retryable and not isinstance(exc, ProducerFencedError):
                self._break(exc)  # the event may or may not be visible: its seq cannot be reused
            raise
        self._next_seq += 1
        if self._trace is not None:
            self._trace.published(etype.name, payload, event.seq)
        if etype in _APPROVAL:
            self._approvals[payload["call_id"]] = _APPROVAL[etype]
        if etype in _TERMINAL:
            self._finished = etype
            self.journal.release_run(self.run_id)
            trace, self._trace = self._trace, None
            if trace is not None:
                trace.end(etype.name.removeprefix("RUN_").lower(), payload.get("error"))
        return event

    def emit(
        self,
        type: EventType | str,
        payload: dict[str, Any],
        *,
        node_id: str | None = None,
        durable: bool | None = None,
    ) -> Event:
        """Publish one event of this run with the next seq.

        Args:
            type: the event type (not RUN_STARTED / RUN_RESUMED / RUN_SUCCEEDED / RUN_FAILED: those
                have their own methods or belong to the recovery job).
            payload: fields for ``type`` (``runjournal.schemas.PAYLOAD_FIELDS``); absent optional fields are None.
            node_id: node path the event belongs to; default: the innermost open node (checked by
                ``runjournal.core.ids.NODE_PATH``: no control character, at most 2048 bytes).
            durable: None → durable iff ``type`` is in ``runjournal.schemas.DURABLE_TYPES``; True forces a commit
                (broker ack) before returning. False is refused for a durable type.

        Returns:
            The published :class:`~runjournal.schemas.Event`.

        Raises:
            ValueError: a reserved type, or ``durable=False`` for a durable type.
            InvalidIdError: a ``node_id`` that breaks the node-path rules.
            InvalidEventError / EventTooLargeError: from the codec, before anything is sent.
            DeliveryError (and subclasses), RunClosedError, QueueFullError, PartitionCountChangedError.
        """
        etype = type if isinstance(type, EventType) else EventType(type)
        if etype in _NOT_EMITTABLE:
            raise ValueError(
                f"{etype} is published by start_run/resume/succeed/fail or the recovery job, not emit()"
            )
        if durable is False and etype in DURABLE_TYPES:
            raise ValueError(f"{etype} is always durable (docs/design/protocol.md § The side-effect protocol)")
        if node_id is not None:
            NODE_PATH.check(node_id)
        return self._publish(
            etype,
            dict(payload),
            node_id=node_id or self.node_path,
            durable=bool(durable) or etype in DURABLE_TYPES,
        )

    # -- call: the side-effect protocol ------------------------------------------------------------
    def call(self, tool: Tool, args: dict[str, Any], *, side_effect: bool | None = None,
             step: str | None = None) -> Any:
        """Run ``tool(args, idempotency_key)`` under the side-effect protocol and return its recorded result.

        Args:
            tool: a :class:`~runjournal.producers.tools.Tool` (``name``, ``side_effect``, ``timeout_ms``,
                optional ``reconcile``).
            args: JSON values; recorded as ``args_digest`` (sha256 of canonical JSON) and, when at most
                ``inline_result_bytes``, as ``args_json``. A value with no exact canonical JSON form (a set, bytes,
                a datetime, an object, NaN, a non-string key, an integer beyond 64 bits) is refused before the
                intent (``NonCanonicalValueError``): its digest could differ on resume.
            side_effect: overrides ``tool.side_effect``.
            step: a stable name of this call within the run, for callers that have one (a model's
                ``tool_call_id``): the key derives from ``(run_id, "#" + step, 1)`` instead of the open node
                path and call index, so it does not depend on the order calls arrive in (parallel tool calls,
                a graph resumed from a checkpoint). A step is *one* call: calling it again follows its recorded
                state (a committed step returns its recorded result, never runs under a new key). At most 256
                bytes, no control character (``runjournal.core.ids.STEP``).

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
            InvalidIdError / NonCanonicalValueError: a bad ``step`` or ``args``, or a tool named as one of the
                spend ledger's steps (``runjournal.spend.reserve``/``settle``); nothing was published.
            DeliveryError, ProducerFencedError, LeaseLapsedError, RunClosedError, QueueFullError,
            EventTooLargeError: publishing failed; if that was the intent, the tool did not run.
        """
        token = current_stop(self.pending_request)  # what stop_requested() shows the tool
        try:
            return drive(self.call_steps(tool, args, side_effect=side_effect, step=step), self.advance)
        finally:
            reset_stop(token)

    def call_steps(self, tool: Tool, args: dict[str, Any], *, side_effect: bool | None = None,
                    step: str | None = None) -> CallSteps:
        """:meth:`call` as a step machine (``runjournal.producers._steps``): the one implementation of the
        protocol; the sync ``call`` and ``AsyncRunHandle.call`` only perform the effects it yields."""
        if tool.name in (RESERVE_TOOL, SETTLE_TOOL) and not isinstance(tool, SpendReserve | SpendSettle):
            # the spend steps' names: their calls stay in clear under encryption (decision 0059), so no other tool
            raise InvalidIdError("tool name", tool.name, "reserved", "the spend ledger's steps are the library's "
                                 "own tools", "rename the tool; nothing was published")
        args_json = canonical_value(args, "args")  # refused before the handle changes or publishes anything
        if len(args_json) > self.journal.max_result_bytes // 4 and \
                (size := len(args_json.encode("utf-8"))) > self.journal.max_result_bytes:
            raise ArgumentsTooLargeError(
                f"{tool.name}: its {size}-byte arguments are over max_result_bytes ({self.journal.max_result_bytes}, "
                "RUNJOURNAL_MAX_RESULT_BYTES); nothing was published and the tool did not run")
        key_path = None if step is None else _step_path(step)
        self._check_writable()
        self._flush_pending()
        effect = tool.side_effect if side_effect is None else side_effect
        args_digest = digest(args_json)
        if key_path is None:
            node_path = self.node_path or ""
            index, retry = self._call_index(node_path, tool.name, args_digest)
        else:
            node_path, index = key_path, 1
            last = self._last_call.get(node_path)
            retry = last is not None and not last.delivered
        key = self._key(node_path, index)
        common = {"call_id": key, "tool": tool.name, "idempotency_key": key, "args_digest": args_digest}
        trace, failure = self._trace, None
        if trace is not None:
            trace.open_call(key, tool.name, self.node_path)  # a child of the open node (a step's key path is none)
        try:
            planned = self._calls.get(key)
            if planned is not None:
                self._check_plan(planned, tool, args_digest, node_path, index)
                self._enter(node_path, index, key, tool.name, args_digest)
                if planned.status is CallVerdict.FAILED and planned.retryable is False and not retry:
                    raise RecordedFailureError(
                        f"{tool.name} call {planned.call_id} failed before the crash and is not retryable: "
                        f"{planned.error}", error=planned.error, call_id=planned.call_id, tool=tool.name)
                if planned.status in _DONE:
                    return self._deliver(node_path, self._recorded_result(planned), key)
                if planned.status is CallVerdict.OUTCOME_UNKNOWN and effect and planned.side_effect:
                    settled, result = yield from self._settle_unknown(tool, planned, key, common)
                    if settled:
                        return self._deliver(node_path, result, key)
            attempt = (planned.attempts if planned is not None else 0) + 1
            return (yield from self._execute(tool, args, args_json, common, node_path, index, effect, attempt))
        except BaseException as exc:
            failure = exc
            raise
        finally:  # returned, raised or abandoned: no longer running (a later call like it may be its retry)
            running = self._in_flight.pop(key, None)
            if running is not None:
                running.running = False
            if trace is not None:
                trace.close_call(key, failure)

    # -- steps ---------------------------------------------------------------------------------------
    def _key(self, node_path: str, index: int) -> str:
        """The call's idempotency key: derived from this run — or, in a forked run, from the source (its source …)
        when the call is one the fork copied from it (its recorded outcome answers it under the key the provider
        saw; docs/design/decisions/0049-fork.md). Calls after the fork point get this run's new keys."""
        for source in self._lineage:
            copied = idempotency_key(source, node_path, index)
            if copied in self._calls:
                return copied
        return idempotency_key(self.run_id, node_path, index)

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
        if last is not None and not last.delivered and not last.running and last.tool == tool \
                and last.args_digest == args_digest:
            return last.index, True
        return self._call_counts.get(node_path, 0) + 1, False

    def _enter(self, node_path: str, index: int, key: str, tool: str, args_digest: str) -> None:
        """The call at ``index`` happened (intent accepted, or a recorded state met): count it, mark it open."""
        self._call_counts[node_path] = max(index, self._call_counts.get(node_path, 0))
        self._last_call[node_path] = self._in_flight[key] = LastCall(index, key, tool, args_digest)

    def _deliver(self, node_path: str, value: Any, key: str | None = None) -> Any:
        """The call ``key`` gave its caller ``value``: that call is delivered (not the node path's latest, which
        may be another thread's call still running)."""
        last = self._in_flight.get(key) if key is not None else None
        if last is None:
            last = self._last_call.get(node_path)
        if last is not None:
            last.delivered = True
        self._delivered = last
        return value

    def undeliver(self, delivered: LastCall | None) -> None:
        """The value of a call that returned (``delivered``, from :meth:`advance_call`) never reached its caller (an
        asyncio task cancelled while the last step ran): the call is open again, so the caller's next attempt keeps
        its key and gets the recorded value — it never runs under a new key."""
        if delivered is not None:
            with self._lock:
                delivered.delivered = False

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
        window_ms = int(tool.timeout_ms)
        # a step that finishes work already begun (a spend settle: the money is spent) is no step boundary: an
        # operator's cancel / pause is carried out after it, so nothing it finishes is left open
        finishing = bool(getattr(tool, "finishes_work", False))
        if not finishing:
            self._stop_if_requested()  # a step boundary: an operator's cancel / pause stops the run before an intent
        probe = self.journal.probe_lease(window_ms) if effect else None  # its read overlaps the intent's commit
        self._publish(EventType.TOOL_CALL_INTENDED, intended, node_id=node_path or None, durable=effect)
        self._enter(node_path, index, key, tool.name, common["args_digest"])
        failpoints.hit("producers.call.after_intent")
        if effect:
            self.journal.check_still_owner(probe, window_ms)  # a paused zombie whose lease expired must not send
            failpoints.hit("producers.call.before_send")
            if not finishing:
                self._stop_before_send(tool.name, common, attempt)
            self._begin_send()  # a surrendering or stopping handle waits for this request and its outcome
        try:
            try:
                result = yield Invoke(tool, args, key)
            except BaseException as exc:
                self._after_raise(tool, exc, common, node_path, effect, attempt)
            failpoints.hit("producers.call.after_tool")
            value = self._commit_outcome(tool, result, common, node_path, effect, attempt)
        finally:
            if effect:
                self._end_send()
        failpoints.hit("producers.call.after_outcome")
        return self._deliver(node_path, value, key)

    # -- operators' requests (docs/design/decisions/0047-operator-controls.md) ------------------------------------
    def pending_request(self) -> ControlRequest | None:
        """The operator's cancel or pause request pending on this run as the instance last read it, or None
        (``runjournal.producers.control.stop_requested`` shows it to a running tool)."""
        look = getattr(self.journal, "request_for", None)
        return look(self.run_id) if callable(look) else None

    def stop_if_requested(self) -> None:
        """A step boundary: when an operator's cancel or pause request is pending on the run (as this instance last
        read it: ``Journal.request_for``), carry it out and raise — a cancel publishes RUN_CANCELLED with who and why
        (once the side-effect requests in flight on other threads have returned and their outcomes are recorded),
        a pause gives the run up to the recovery job (``Journal.surrender``), which holds it for nobody until an
        operator resumes it. ``call`` checks before every new intent (and again between a side effect's
        acknowledged intent and its request), ``node`` on entry once no call's outcome is left unknown, approval
        waits on every poll; a long agent loop without those may call it itself.

        Raises:
            RunCancelledError, RunPausedError: the request was carried out (or was, earlier, on this handle).
        """
        with self._lock:
            self._stop_if_requested()

    def _stop_if_requested(self) -> None:
        if self._stop_error is not None:
            raise self._stop_error
        look = getattr(self.journal, "request_for", None)
        request = look(self.run_id) if callable(look) and self._finished is None else None
        if request is not None:
            self._carry_out(request)

    def step_boundary(self) -> None:
        """The step boundary :meth:`node` marks on entry, for code whose nodes are not this handle's (a framework's
        graph nodes: ``runjournal.adapters.langgraph``): :meth:`stop_if_requested` — unless a call of the run still
        has an unknown outcome, which the code must reach and settle first (the request is then carried out at the
        next boundary after it).

        Raises:
            RunCancelledError, RunPausedError: the request was carried out (or was, earlier, on this handle).
        """
        with self._lock:
            if not self._unknown_left():
                self._stop_if_requested()

    def _stop_before_send(self, tool: str, common: dict[str, Any], attempt: int) -> None:
        """After a side effect's intent was acknowledged, before its request: a request that arrived meanwhile (or a
        stop on another thread) stops the run here. The intent is answered at once with TOOL_CALL_RECONCILED
        (NOT_EXECUTED) — this instance is the one that would have sent it and did not — so the run ends or resumes
        with the call known as not executed (never an unknown outcome to reconcile)."""
        look = getattr(self.journal, "request_for", None)
        request = look(self.run_id) if callable(look) else None
        if request is None and self._stop_error is None:
            return
        payload = {**common, "outcome": "NOT_EXECUTED"}
        self._publish_locked(EventType.TOOL_CALL_RECONCILED, payload, node_id=self.node_path, durable=False)
        key = common["call_id"]
        self._calls[key] = PlannedCall(call_id=key, tool=tool, status=CallVerdict.RECONCILED_NOT_EXECUTED,
                                       attempts=attempt, side_effect=True, args_digest=common["args_digest"],
                                       retryable=True)
        if self._stop_error is not None:
            raise self._stop_error
        assert request is not None
        self._carry_out(request)

    def _carry_out(self, request: ControlRequest) -> NoReturn:
        """Carry ``request`` out under the run's lock (:meth:`stop_if_requested`); always raises its stop error."""
        cls = {"cancel": RunCancelledError, WAIT: RunWaitingError}.get(request.action, RunPausedError)
        verb = {"cancel": "cancelled", WAIT: "released while it waits"}.get(request.action, "paused")
        err = cls(f"run {self.run_id} was {verb} by {request.requested_by or 'an operator'}"
                  f"{': ' + request.reason if request.reason else ''} (request {request.request_id})",
                  run_id=self.run_id, action=request.action, requested_by=request.requested_by,
                  reason=request.reason, request_id=request.request_id)
        err.retryable = False
        if isinstance(err, RunWaitingError):
            err.until_ms, err.signal = request.until_ms, request.signal
        self._stop_error = err
        if request.action != "cancel":
            self._give_up(f"{verb} by {request.requested_by or 'an operator'}")
            raise err
        with self._idle:
            busy = self._sending > 0
        if busy:  # requests in flight on other threads: cancel once they returned and their outcomes are recorded
            threading.Thread(target=self._cancel_when_idle, args=(request,), daemon=True,
                             name=f"runjournal-cancel-{self.run_id}"[:60]).start()
            raise err
        try:
            self._publish_cancelled(request)
        except JournalError as exc:
            err.add_note(f"RUN_CANCELLED was not published ({error_text(exc)}); the run was handed to the recovery "
                         "job, which carries the cancel out")
            self._give_up("its cancel could not be published")
        raise err

    # -- spend (runjournal.producers.spend; docs/design/decisions/0053-spend-ledger.md) ------------------------
    def reserve(self, model: str, *, input_tokens: int, output_tokens: int, user_id: str | None = None,
                step: str | None = None) -> Reservation:
        """Reserve the estimated spend of one model call before making it; settle it after with the actual usage.

        ``with run.reserve("gpt-4o", input_tokens=1200, output_tokens=512) as r: resp = llm(...);
        r.settle(resp.usage)``. The reservation is a journaled step (like a side-effecting call): the ledger's
        script checks the run's, the tenant's and (with ``user_id``) the user's budgets and charges the estimate
        to each at once, or refuses. A resumed run meets its recorded reservation and settle again: nothing is
        charged twice (``Reservation.recorded``).

        Args:
            model: the model's name (priced by ``Settings.spend_prices``).
            input_tokens, output_tokens: the estimate (whole, >= 0; the request's ``max_tokens`` for output keeps
                a budget exact).
            user_id: also charge this user's budget within the tenant.
            step: a stable name of this reservation (as ``call(step=…)``); its settle is ``step + "/settle"``.

        Returns:
            A :class:`~runjournal.producers.spend.Reservation` (a context manager).

        Raises:
            BudgetExceededError: a budget would pass its limit (``left`` says what may still be reserved); nothing
                was charged.
            SpendValueError / UnknownModelError / InvalidIdError: bad input; nothing was published.
            As :meth:`call` otherwise.
        """
        return reserve_spend(self, model, input_tokens=input_tokens, output_tokens=output_tokens,
                             user_id=user_id, step=step)

    def spend_policy(self) -> SpendPolicy:
        """The journal's prices and default budgets (``Settings.spend_*``)."""
        return self.spend_ledger().policy

    def spend_ledger(self) -> SpendLedger:
        """The journal's spend ledger (``Journal.spend_ledger``)."""
        ledger = getattr(self.journal, "spend_ledger", None)
        if ledger is None:
            raise JournalError("spend needs a Journal (its spend ledger); this handle's journal has none")
        return ledger  # type: ignore[no-any-return]

    # -- durable waits (runjournal.producers.waits; docs/design/decisions/0050-durable-waits.md) ------------------
    def sleep(self, seconds: float | None = None, *, until_ms: int | None = None, step: str | None = None) -> None:
        """Wait ``seconds`` (or until ``until_ms``, ms since the Unix epoch) by Redis's clock, durably: the end time is
        journaled (a step, like a call), so a resumed run's re-executed code passes a sleep that is over at once. A
        sleep longer than the Journal's ``hold_after_s`` releases the run (``RunWaitingError``): no process holds it,
        and the recovery service resumes it on a live instance when the time comes.

        Args:
            step: a stable name of this sleep within the run (as ``call(step=…)``): its end time is keyed by the name
                instead of the open node path and call index — for code that is not re-executed from its start on
                resume (a LangGraph node resumed from its checkpoint). Default: keyed like any call.

        Raises:
            RunWaitingError: the run was released until the sleep ends.
            RunCancelledError, RunPausedError: an operator's request met at this step.
            ValueError: neither or both of ``seconds`` and ``until_ms``, or a negative ``seconds``.
            InvalidIdError: a bad ``step``.
        """
        drive(self.sleep_steps(seconds, until_ms=until_ms, step=step), self.advance)

    def sleep_steps(self, seconds: float | None = None, *, until_ms: int | None = None,
                    step: str | None = None) -> CallSteps:
        """:meth:`sleep` as steps (the asyncio handle drives them)."""
        if (seconds is None) == (until_ms is None) or (seconds is not None and seconds < 0):
            raise ValueError("give seconds (>= 0) or until_ms, not both")
        args: dict[str, Any] = {"seconds": seconds} if seconds is not None else {"until_ms": until_ms}
        timer = yield from self.call_steps(TimerStart(self._controls()), args, step=step)
        due = int(timer["due_ms"])
        while (left_ms := due - self._controls().now_ms()) > 0:
            self._stop_if_requested()
            if left_ms > self._hold_after_ms():
                self._hold(until_ms=due, signal=None, reason=f"sleeping until {due} (Redis's clock, ms)")
            yield Sleep(min(left_ms / 1000, 1.0))

    def wait_signal(self, name: str, *, timeout_s: float | None = None, poll_s: float = 0.2,
                    step: str | None = None) -> Any:
        """Wait for the signal ``name`` (``runjournal signal RUN_ID NAME --payload JSON``) and return its payload —
        delivered exactly once, also when it was sent before the run waits for it; the payload is journaled, so a
        resumed run gets the same value. A wait longer than the Journal's ``hold_after_s`` releases the run until the
        signal arrives or the timeout ends (``RunWaitingError``).

        Args:
            timeout_s: give up after this many seconds (Redis's clock, from the first wait; the end time is
                journaled); None waits without end.
            poll_s: how often the signal inbox is read while the wait is in the process (s).
            step: a stable name of this wait within the run (as ``call(step=…)``): the payload is keyed by it (the
                timeout's end time by ``step + "/timeout"``) instead of the open node path and call index, and a
                wait whose step already has its payload recorded returns it at once, without reading the inbox or
                setting a timer — for code that is not re-executed from its start on resume (a LangGraph node).

        Raises:
            SignalTimeoutError: ``timeout_s`` passed (by Redis's clock, from the first wait) without the signal.
            RunWaitingError: the run was released until the signal (or the timeout).
            RunCancelledError, RunPausedError: an operator's request met while it waited.
            InvalidIdError: ``name`` breaks the call-id rules, or a bad ``step``.
        """
        return drive(self.wait_signal_steps(name, timeout_s=timeout_s, poll_s=poll_s, step=step), self.advance)

    def wait_signal_steps(self, name: str, *, timeout_s: float | None = None, poll_s: float = 0.2,
                          step: str | None = None) -> CallSteps:
        """:meth:`wait_signal` as steps (the asyncio handle drives them)."""
        CALL_ID.check(name)
        if step is not None:
            planned = self._calls.get(self._key(_step_path(step), 1))
            if planned is not None and planned.status in _DONE:  # recorded: the journal answers, nothing waits
                return (yield from self.call_steps(SignalReceive({}), {"signal": name}, step=step))
        due: int | None = None
        if timeout_s is not None:
            timer = yield from self.call_steps(TimerStart(self._controls()), {"seconds": timeout_s,
                                                                             "signal": name},
                                               step=None if step is None else f"{step}/timeout")
            due = int(timer["due_ms"])
        inbox = SignalInbox(self._controls().r, self._prefix())
        waited_ms = 0.0
        while (delivered := inbox.get(self.run_id, name)) is None:
            self._stop_if_requested()
            now = self._controls().now_ms()
            if due is not None and now >= due:
                raise SignalTimeoutError(f"run {self.run_id}: no signal {name!r} before its timeout",
                                         run_id=self.run_id, signal=name)
            if waited_ms >= self._hold_after_ms():  # waited in this process long enough: release the run
                self._hold(until_ms=due, signal=name, reason=f"waiting for signal {name!r}")
            yield Sleep(poll_s)
            waited_ms += poll_s * 1000
        if "sealed" in delivered:  # sent sealed under the run's key (encryption on: decision 0059)
            content = getattr(self.journal, "content", None) or ContentCrypto()  # none: EncryptedContentError
            opened = content.open(str(delivered["sealed"]), self.run_id, signal_address(name), "payload")
            delivered = {"payload": None if opened is None else json.loads(opened), "sent_by": delivered.get("sent_by")}
        return (yield from self.call_steps(SignalReceive(delivered), {"signal": name}, step=step))

    def _controls(self) -> ControlStore:
        controls = getattr(self.journal, "controls", None)
        if controls is None:
            raise JournalError("durable waits need a Journal (its ControlStore); this handle's journal has none")
        return controls  # type: ignore[no-any-return]

    def _prefix(self) -> str:
        return str(getattr(self.journal, "_prefix", ""))

    def _hold_after_ms(self) -> float:
        return float(getattr(self.journal, "hold_after_s", 30.0)) * 1000

    def _hold(self, *, until_ms: int | None, signal: str | None, reason: str) -> NoReturn:
        """Release the run until ``until_ms`` or ``signal``: a ``wait`` request of its own, carried out at once (the
        run is given up; the recovery job holds it with its wake-up time). A cancel or pause pending stands instead."""
        stored, request = self._controls().request(self.run_id, WAIT, requested_by=self.producer_id, reason=reason,
                                                   until_ms=until_ms, signal=signal)
        self._carry_out(request)  # when not stored, the request that stands (a cancel, a pause) is carried out

    def _publish_cancelled(self, request: ControlRequest) -> None:
        payload = {"reason": request.reason or "cancelled by an operator", "requested_by": request.requested_by,
                   "request_id": request.request_id}
        self._publish_locked(EventType.RUN_CANCELLED, payload, node_id=None, durable=True)
        done = getattr(self.journal, "request_done", None)
        if callable(done):
            done(request)

    def _cancel_when_idle(self, request: ControlRequest) -> None:
        """The cancel of a run with requests in flight (its own thread): wait for them and their outcomes, then
        RUN_CANCELLED; if it cannot be published, the run is handed to the recovery job, which carries it out."""
        self.wait_idle()
        try:
            with self._lock:
                if self._finished is None:
                    self._publish_cancelled(request)
        except Exception as exc:  # noqa: BLE001 - the recovery job carries the cancel out instead
            log.error("run %s: RUN_CANCELLED was not published (%s); handing the run to the recovery job",
                      self.run_id, exc)
            self._give_up("its cancel could not be published")

    def _give_up(self, why: str) -> None:
        """Hand the run to the recovery job (``Journal.surrender``), which carries out the request still pending."""
        if self._surrendered:
            return
        self._surrendered = True
        surrender = getattr(self.journal, "surrender", None)
        if callable(surrender):
            surrender(self, why)

    def _after_raise(self, tool: Tool, exc: BaseException, common: dict[str, Any], node_path: str, effect: bool,
                     attempt: int) -> NoReturn:
        """The tool raised: an unknown outcome publishes nothing (the call stays intended); a definite failure
        is recorded as TOOL_CALL_FAILED. Always raises."""
        key = common["idempotency_key"]
        base = {"call_id": key, "tool": tool.name, "attempts": attempt, "side_effect": effect,
                "args_digest": common["args_digest"]}
        if effect and (not isinstance(exc, Exception) or outcome_unknown(exc)):
            # The request left at the latest now: the provider may act on it until timeout_ms from now, by this
            # host's monotonic clock (from the raise, not from the intent: a slow intent commit delays the send).
            self._reconcile_after[key] = time.monotonic() + int(tool.timeout_ms) / 1000
            self._calls[key] = PlannedCall(status=CallVerdict.OUTCOME_UNKNOWN, **base)
            if not isinstance(exc, Exception):
                raise exc  # interrupted inside the tool (KeyboardInterrupt …): the call stays intended
            raise OutcomeUnknownError(
                f"{tool.name} call {key} raised {error_text(exc)} after its request may have left: the outcome is "
                "unknown; call it again to reconcile it by key (it is not run blindly), or request an approval",
                call_id=key, idempotency_key=key, tool=tool.name, approval_id=approval_id(key, attempt)) from exc
        if not isinstance(exc, Exception):
            raise exc  # a read-only call interrupted: nothing to state, it may simply run again
        retryable = bool(getattr(exc, "retryable", False))
        failed = {**common, "error": error_text(exc), "retryable": retryable}
        entry = PlannedCall(status=CallVerdict.FAILED, retryable=retryable, error=failed["error"], **base)
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
            fields, problem = self._result_fields(text, key)

            def by_reference() -> tuple[dict[str, Any], PlannedCall] | None:
                ref_fields, ref_problem = self._result_fields(text, key, inline=False, durable=False)
                if ref_problem is not None:
                    return None
                entry = PlannedCall(status=CallVerdict.COMMITTED, result_ref=ref_fields["result_ref"], **base)
                return {**common, **ref_fields}, entry

            smaller = by_reference if fields["result_json"] is not None else None
        entry = PlannedCall(status=CallVerdict.COMMITTED, result_json=fields["result_json"],
                            result_ref=fields["result_ref"], **base)
        self._record_outcome(EventType.TOOL_CALL_COMMITTED, {**common, **fields}, node_path, effect, entry,
                             smaller=smaller, deferred=effect and problem is None and self._groups_outcome(tool))
        if problem is not None:  # the call stays open: calling it again raises this again, never re-runs it
            raise self._unrecordable(tool.name, key, problem)
        return recorded.value

    # -- the pending outcome --------------------------------------------------------------------
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
    def _result_fields(self, text: str, call_id: str, *, inline: bool = True,
                       durable: bool = True) -> tuple[dict[str, Any], str | None]:
        """``result_json`` inline (if ``inline`` and small), else ``result_ref``: the result written to
        ``{prefix}.payloads`` and committed (``Journal.publish_payload``, ``runjournal.producers.results``) — or, with
        ``durable=False`` (the fallback for an inline event the broker refused for its size: such a broker would
        refuse the payload records too), put in Redis only (``sha256:``). Always the digest. Returns
        ``(fields, problem)``: ``problem`` when the result is over ``max_result_bytes`` (a :class:`_TooLarge`; nothing
        of it was produced) or could not be stored. ProducerFencedError (and its subclasses) propagate. A result by
        reference is stored sealed like an event's content (encrypted with ``RUNJOURNAL_ENCRYPTION=on``, bound to
        ``call_id``: ``runjournal.producers.encryption.payload_address``); the digest is the plain text's."""
        fields: dict[str, Any] = {"result_json": None, "result_ref": None, "result_digest": digest(text)}
        size = len(text.encode("utf-8"))
        limit = self.journal.max_result_bytes
        if size > limit:  # before inline: a limit below inline_result_bytes holds too
            return fields, _TooLarge(f"its {size}-byte result is over max_result_bytes ({limit}, "
                                     "RUNJOURNAL_MAX_RESULT_BYTES); none of it was written", size, limit)
        if inline and size <= self.journal.inline_result_bytes:
            fields["result_json"] = text
            return fields, None
        attempts = self.journal.outcome_retries + 1 if durable else 1
        content = getattr(self.journal, "content", None)
        if content is not None:
            text = content.seal_text(text, tenant_id=self.tenant_id, subject=self._subject(), run_id=self.run_id,
                                     address=payload_address(call_id), field="result_ref")
        problem: Exception | None = None
        for attempt in range(attempts):  # a lost transaction: written again under a new payload id
            if attempt:
                time.sleep(min(_BACKOFF_S * 2 ** (attempt - 1), _MAX_BACKOFF_S))
            try:
                fields["result_ref"] = (self.journal.publish_payload(self.run_id, text) if durable
                                        else self.journal.results.put(text))
                return fields, None
            except ProducerFencedError:
                raise
            except (DeliveryError, QueueFullError) as exc:
                if attempt + 1 < attempts:
                    continue
                problem = exc
            except Exception as exc:  # noqa: BLE001 - the effect happened: record it, then say why its result is not
                problem = exc
            break
        where = "the payloads topic" if durable else "Redis"
        return fields, f"{where} did not store the {size}-byte result ({type(problem).__name__}: {problem})"

    def _recorded_result(self, planned: PlannedCall) -> Any:
        """The recorded result of a committed call, read back exactly as the live caller received it.

        Raises:
            ResultUnavailableError: the result is stored by reference and can no longer be read (an old ``sha256:``
                reference gone from Redis; a ``kafka:`` reference whose records were erased).
            ResultCorruptError: the records read do not make the recorded result (digest or key mismatch).
            UnrecordableResultError: the call committed without a result (it could not be recorded).
        """
        if planned.result_json is not None:
            return json.loads(planned.result_json)
        if planned.result_ref is not None:
            text = self.journal.results.get(planned.result_ref, run_id=self.run_id)
            if text is None:
                raise ResultUnavailableError(f"result {planned.result_ref} of call {planned.call_id} can no longer "
                                             f"be read: {unavailable_reason(planned.result_ref)}")
            content = getattr(self.journal, "content", None)
            if content is not None:
                text = content.open(text, [self.run_id, *self._lineage], payload_address(planned.call_id),
                                    "result_ref")
            return json.loads(text)
        raise UnrecordableResultError(
            f"{planned.tool} call {planned.call_id} committed but its result could not be recorded; it does not "
            "run again", call_id=planned.call_id, tool=planned.tool, reason="committed without a recorded result")

    def _subject(self) -> str | None:
        """The subject whose key seals this run's content (the journal knows it from RUN_STARTED or the plan)."""
        subject_of = getattr(self.journal, "subject_of", None)
        return subject_of(self.run_id) if callable(subject_of) else None

    @staticmethod
    def _unrecordable(tool: str, call_id: str, problem: str) -> UnrecordableResultError:
        if isinstance(problem, _TooLarge):
            return ResultTooLargeError(
                f"{tool} call {call_id} ran but {problem}; it is recorded as committed without a result and does not "
                "run again", call_id=call_id, tool=tool, reason=str(problem), size=problem.size, limit=problem.limit)
        return UnrecordableResultError(
            f"{tool} call {call_id} ran but its result cannot be recorded faithfully ({problem}); it is recorded "
            "as committed without a result and does not run again", call_id=call_id, tool=tool, reason=problem)

    # -- unknown outcomes ----------------------------------------------------------------------------
    def _settle_unknown(
        self, tool: Tool, planned: PlannedCall, key: str, common: dict[str, Any]
    ) -> Generator[Effect, Any, tuple[bool, Any]]:
        """Resolve an OUTCOME_UNKNOWN call (steps of :meth:`call_steps`). Returns (True, result) when
        settled as committed, (False, None) when the tool should run (again) with the same key."""
        scoped = approval_id(planned.call_id, planned.attempts)
        who = {"call_id": planned.call_id, "idempotency_key": key, "tool": tool.name, "approval_id": scoped}
        reconcile = getattr(tool, "reconcile", None)
        outcome: Outcome | None = None
        if callable(reconcile):  # the provider is asked first, always: an approval answers only what it cannot
            left_s = self._reconcile_after.pop(key, 0.0) - time.monotonic()
            if left_s > 0:  # went unknown in this handle: its request may still act until the tool's timeout
                yield Sleep(left_s)
            outcome = yield Reconcile(tool, key)
        if outcome is None:
            # One approval, one attempt: asked under <key>@<attempt> it answers this attempt only; under the bare key
            # (older callers) the re-run's intent uses it up — the reducer records it consumed, so a resumed owner's
            # plan leaves it out. Either way another unknown outcome needs another approval.
            asked = scoped if scoped in self._approvals else planned.call_id
            approval = self._approvals.get(asked)
            if approval == ApprovalStatus.GRANTED:
                del self._approvals[asked]
                return False, None
            if approval == ApprovalStatus.DENIED:
                raise ApprovalDeniedError(f"re-running {tool.name} call {planned.call_id} was denied", **who)
            how = "its provider cannot tell" if callable(reconcile) else "the tool has no reconcile()"
            raise OutcomeUnknownError(
                f"{tool.name} call {planned.call_id} was intended but has no outcome and {how}; "
                "request an approval (docs/design/protocol.md § The side-effect protocol)",
                **who,
            )
        return self._reconciled(tool.name, planned, outcome, common)

    def settle_by_hand(self, call_id: str, result: Any) -> Any:
        """Record, on a person's word, that the OUTCOME_UNKNOWN call ``call_id`` (an idempotency key) happened,
        with ``result``: TOOL_CALL_RECONCILED(COMMITTED) carrying it (durable), exactly as if its provider had
        answered — the call is not run again; calling it returns ``result`` (live and after a resume). How an
        operator settles a call whose tool cannot reconcile (``runjournal settle``; rules:
        docs/guide/side-effect-boundary.md § Settling an unknown outcome by hand).

        Returns:
            ``result`` as recorded (canonical JSON read back).

        Raises:
            PlanMismatchError: this handle knows no call ``call_id`` with an unknown outcome (never intended here,
                or already settled); nothing was published.
            NonCanonicalValueError: ``result`` has no exact JSON form; nothing was published.
            UnrecordableResultError: the result could not be stored (the outcome is durable without it).
            Publishing errors as :meth:`emit`.
        """
        canonical_value(result, "result")  # refused before anything is published
        with self._lock:
            self._check_writable()
            self._flush_pending()
            planned = self._calls.get(call_id)
            if planned is None or planned.status is not CallVerdict.OUTCOME_UNKNOWN:
                state = "no such call" if planned is None else f"its outcome is {planned.status.value}"
                raise PlanMismatchError(f"run {self.run_id}: call {call_id} cannot be settled by hand ({state}): "
                                        "only a call whose outcome is unknown can")
            common = {"call_id": call_id, "tool": planned.tool, "idempotency_key": call_id,
                      "args_digest": planned.args_digest or ""}
            _settled, value = self._reconciled(planned.tool, planned, Outcome(executed=True, result=result), common)
            return value

    def _reconciled(self, tool: str, planned: PlannedCall, outcome: Outcome,
                    common: dict[str, Any]) -> tuple[bool, Any]:
        node_id = self.node_path
        if not outcome.executed or outcome.error is not None:
            verdict = "NOT_EXECUTED" if not outcome.executed else "FAILED"
            self._publish(EventType.TOOL_CALL_RECONCILED, {**common, "outcome": verdict}, node_id=node_id,
                          durable=True)
            status = CallVerdict.RECONCILED_NOT_EXECUTED if not outcome.executed else CallVerdict.FAILED
            self._calls[planned.call_id] = replace(planned, status=status, retryable=True, error=outcome.error)
            return False, None
        recorded: RecordedValue = record_value(outcome.result)
        problem = recorded.problem
        fields: dict[str, Any] = {"result_json": None, "result_ref": None, "result_digest": None}
        if recorded.text is not None:
            fields, problem = self._result_fields(recorded.text, planned.call_id)
        self._publish(EventType.TOOL_CALL_RECONCILED, {**common, "outcome": "COMMITTED", **fields},
                      node_id=node_id, durable=True)
        self._calls[planned.call_id] = replace(planned, status=CallVerdict.RECONCILED_COMMITTED,
                                               result_json=fields["result_json"], result_ref=fields["result_ref"])
        if problem is not None:
            raise self._unrecordable(tool, planned.call_id, problem)
        return True, recorded.value

    # -- streams ------------------------------------------------------------------------------------
    def stream(self, name: str | None = None) -> Stream:
        """A segment of the run's durable stream of partial output (``runjournal.producers.streams``, decision
        0055): ``with run.stream() as s: s.write("tok")``. Not a step: nothing enters the journal, recovery never
        reads it; after a crash the next owner's first ``stream`` (or its ``Journal.resume``) marks the gap.

        Args:
            name: the segment's name (default: the current node path, else ``output``); no ``#``.

        Returns:
            An open :class:`~runjournal.producers.streams.Stream` (its ``end`` record is written on exit).

        Raises:
            JournalError: the journal has no stream writer (a test double). ValueError: a name with ``#``.
        """
        writer = getattr(self.journal, "streams", None)
        if writer is None:
            raise JournalError("run.stream() needs a Journal (its stream writer); this handle's journal has none")
        label = name if name is not None else (self.node_path or "output")
        if "#" in label and name is not None:
            raise ValueError(f"stream name {name!r}: no '#' (it separates the segment's epoch)")
        return writer.open(self.run_id, self.epoch, label)  # type: ignore[no-any-return]

    # -- nodes --------------------------------------------------------------------------------------
    @contextmanager
    def node(self, name: str) -> Iterator[str]:
        """A node of the run: NODE_STARTED on entry, NODE_SUCCEEDED on exit, NODE_FAILED + re-raise on error.

        Args:
            name: node name; no ``/`` or ``#`` (they build paths), no control character, at most 128 bytes
                (``runjournal.core.ids.NODE_NAME``).

        Yields:
            The node path (``outer/inner``, ``book#2`` for the second ``book`` under one parent).

        Raises:
            InvalidIdError: a bad name (a ``ValueError``); nothing was published. Publishing errors as :meth:`emit`.
            The block's own exception is re-raised.
        """
        with self._lock:
            if not self._unknown_left():
                self._stop_if_requested()  # a step boundary (never before an unknown outcome is reconciled)
            path = enter_node(self._entries, self.node_path or "", name)
            attempt = (self.plan.node_attempts.get(path, 0) if self.plan else 0) + 1
            if self._trace is not None:
                self._trace.open_node(path, self.node_path, attempt)
            try:
                self._publish(
                    EventType.NODE_STARTED, {"node_path": path, "attempt": attempt}, node_id=path, durable=False
                )
            except BaseException as exc:
                if self._trace is not None:
                    self._trace.close_node(path, exc)
                raise
            self._node_stack.append(path)
        try:
            yield path
        except Exception as exc:
            self._leave(path)
            try:
                if self.writable:
                    retryable = bool(getattr(exc, "retryable", False))
                    payload = {"node_path": path, "error": error_text(exc), "retryable": retryable}
                    try:
                        self._publish(EventType.NODE_FAILED, payload, node_id=path, durable=False)
                    except JournalError as publish_exc:  # keep the block's own exception; say why no NODE_FAILED
                        exc.add_note(f"NODE_FAILED of {path} was not published: {error_text(publish_exc)}")
            finally:
                if self._trace is not None:
                    self._trace.close_node(path, exc)
            raise
        except BaseException as exc:
            self._leave(path)  # interrupted (KeyboardInterrupt, GeneratorExit): no outcome to state
            if self._trace is not None:
                self._trace.close_node(path, exc)
            raise
        self._leave(path)
        try:
            self._publish(EventType.NODE_SUCCEEDED, {"node_path": path}, node_id=path, durable=False)
        finally:
            if self._trace is not None:
                self._trace.close_node(path)

    def _unknown_left(self) -> bool:
        """True while a call of the run's plan or of this handle has an unknown outcome not yet reconciled (a node
        boundary does not stop the run then: the resumed code must reach the call and settle it first)."""
        return any(c.status is CallVerdict.OUTCOME_UNKNOWN for c in self._calls.values())

    def _leave(self, path: str) -> None:
        """Close the node ``path``: its innermost entry leaves the stack (under the run's lock)."""
        with self._lock:
            for i in range(len(self._node_stack) - 1, -1, -1):
                if self._node_stack[i] == path:
                    del self._node_stack[i]
                    return

    # -- other facts ------------------------------------------------------------------------------------
    def message(self, role: str, content: str, *, user_id: str | None = None) -> Event:
        """A transcript turn (MESSAGE; non-durable). Input for memory only — never for recovery.

        Raises ``InvalidIdError`` for a ``user_id`` that breaks its rules; otherwise as :meth:`emit`."""
        USER_ID.check_optional(user_id)
        payload = {"role": role, "content": content, "user_id": user_id}
        return self._publish(EventType.MESSAGE, payload, node_id=self.node_path, durable=False)

    def correction(self, subject: str, text: str, *, user_id: str | None = None) -> Event:
        """A user's correction (USER_CORRECTION; non-durable), for the memory extractor (``user_id`` checked as in
        :meth:`message`)."""
        USER_ID.check_optional(user_id)
        payload = {"subject": subject, "text": text, "user_id": user_id}
        return self._publish(EventType.USER_CORRECTION, payload, node_id=self.node_path, durable=False)

    def request_approval(self, call_id: str, reason: str, tool: str | None = None, *, args: Any = None) -> Event:
        """APPROVAL_REQUESTED (durable) for ``call_id`` — e.g. an ``OutcomeUnknownError.approval_id``
        (``<key>@<attempt>``), whose scope the event records: ``scope_call_id`` = the key, ``scope_attempt`` = the
        attempt a grant authorises (envelope v3; :func:`approval_scope`; docs/design/decisions/0044). ``args``: the
        call's arguments, recorded as canonical JSON (``args_json``, envelope v4) so the approver sees what they
        decide about (docs/design/decisions/0046-approvals-carry-their-arguments.md) when they fit in
        ``inline_result_bytes`` (bytes), as an intent's do; None: not recorded.

        Raises ``InvalidIdError`` for a ``call_id`` that breaks ``runjournal.core.ids.CALL_ID`` (a control character,
        ``|`` or ``/``, over 256 bytes), ``NonCanonicalValueError`` for ``args`` with no canonical JSON (NaN, a set
        …), both before anything is published; otherwise as :meth:`emit`."""
        CALL_ID.check(call_id)
        args_json = None if args is None else canonical_value(args, "approval args")
        if args_json is not None and len(args_json.encode("utf-8")) > self.journal.inline_result_bytes:
            args_json = None  # as TOOL_CALL_INTENDED: larger arguments are not inlined (the console says so)
        scope_call_id, scope_attempt = approval_scope(call_id)
        payload = {"call_id": call_id, "reason": reason, "tool": tool, "scope_call_id": scope_call_id,
                   "scope_attempt": scope_attempt, "args_json": args_json}
        return self._publish(EventType.APPROVAL_REQUESTED, payload, node_id=self.node_path, durable=True)

    def succeed(self, output: Any = None) -> Event:
        """RUN_SUCCEEDED (durable) with ``output`` as canonical JSON (None → no output); ends the run.

        The run leaves the instance's owned set. Raises as :meth:`emit`.
        """
        payload = {"output_json": None if output is None else canonical_json(output)}
        return self._publish(EventType.RUN_SUCCEEDED, payload, node_id=None, durable=True)

    def fail(self, error: str | BaseException) -> Event:
        """RUN_FAILED (durable) with ``error`` (an exception becomes ``"Type: message"``); ends the run.

        A failed run can be continued later under a new epoch (``runjournal.consumers.recovery.continue_run``).
        """
        text = error if isinstance(error, str) else error_text(error)
        if not text.isascii():
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
        return self._publish(EventType.RUN_FAILED, {"error": text}, node_id=None, durable=True)

    def end_trace(self, outcome: str) -> None:
        """End this segment's span with ``runjournal.outcome`` = ``outcome`` (``surrendered``: the run was given up to
        the recovery job, which spares this owner's segment); no-op when tracing is off or it already ended.

        Takes no lock: ``Journal.surrender`` calls it from a delivery callback while another thread may hold the run's
        lock waiting for that delivery."""
        trace, self._trace = self._trace, None
        if trace is not None:
            trace.end(outcome)

    def __enter__(self) -> RunHandle:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None and isinstance(exc, Exception) and self.writable:
            try:
                self.fail(exc)
            except JournalError as publish_exc:  # the block's exception propagates; the run stays unfinished
                exc.add_note(f"RUN_FAILED of run {self.run_id} was not published: {error_text(publish_exc)}")
                log.error("RUN_FAILED of run %s was not published: %s", self.run_id, publish_exc)

    def __repr__(self) -> str:
        return f"RunHandle(run_id={self.run_id!r}, epoch={self.epoch}, last_seq={self.last_seq})"


def _step_path(step: str) -> str:
    """The key path of a named step (``call(step=...)``): ``#`` + the name. No node path starts with ``#`` (node
    names cannot hold it), so a step never shares a key with a call made inside a node.

    Raises:
        InvalidIdError: ``step`` breaks ``runjournal.core.ids.STEP`` (empty, a control character, over 256 bytes).
    """
    return f"#{STEP.check(step)}"

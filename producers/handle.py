"""RunHandle: one run's writer — seq, epoch, node paths, the side-effect protocol (``call``).

A handle is **not** thread-safe (one run is one ordered stream: use it from one thread at a
time); the :class:`~runjournal.producers.journal.Journal` it came from is, and many handles share it.

Per-run rules it enforces (DESIGN.md § Events):

* ``seq`` starts at 1 (or at ``plan.last_seq + 1`` after a resume) and grows by exactly 1 per
  *published* event — a publish that raised did not consume its seq;
* ``epoch`` is 1 for a new run, ``plan.epoch`` for a resumed one;
* node paths are deterministic: ``outer/inner``, and the n-th entry (n >= 2) of the same name
  under the same parent is ``name#n`` — so a resumed run that re-executes the same code
  derives the same paths, and with them the same idempotency keys.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any

from runjournal.producers._calls import CallMixin, LastCall, error_text
from runjournal.producers._digest import canonical_json, enter_node
from runjournal.producers._outcomes import PendingOutcome
from runjournal.producers.errors import (
    DeliveryError,
    JournalError,
    LeaseLapsedError,
    ProducerFencedError,
    RunClosedError,
)
from runjournal.producers.plan import ApprovalStatus, PlannedCall
from runjournal.producers.tracing import current_traceparent
from runjournal.schemas import DURABLE_TYPES, Event, EventType, new_event_id, utcnow

if TYPE_CHECKING:
    from runjournal.producers._port import JournalPort
    from runjournal.producers.plan import RecoveryPlan

__all__ = ["RunHandle"]

log = logging.getLogger("runjournal.producers.handle")

_NOT_EMITTABLE = frozenset(
    {EventType.RUN_STARTED, EventType.RUN_RESUMED, EventType.RUN_SUCCEEDED, EventType.RUN_FAILED}
)
_TERMINAL = frozenset({EventType.RUN_SUCCEEDED, EventType.RUN_FAILED, EventType.RUN_CANCELLED})
_APPROVAL = {EventType.APPROVAL_REQUESTED: ApprovalStatus.PENDING, EventType.APPROVAL_GRANTED: ApprovalStatus.GRANTED,
             EventType.APPROVAL_DENIED: ApprovalStatus.DENIED}


class RunHandle(CallMixin):
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
        self._traceparent = traceparent
        self._fence_mark = journal.fence_count
        self._finished: EventType | None = None
        self._broken: DeliveryError | None = None
        self._node_stack: list[str] = []
        self._entries: dict[str, dict[str, int]] = {}
        self._call_counts: dict[str, int] = {}
        self._last_call: dict[str, LastCall] = {}
        self._calls: dict[str, PlannedCall] = dict(plan.calls) if plan is not None else {}
        """idempotency key -> what is known of the call: the plan's entries, then this handle's own outcomes."""
        self._approvals: dict[str, ApprovalStatus] = dict(plan.approvals) if plan is not None else {}
        self._pending: PendingOutcome | None = None
        self._reconcile_after: dict[str, float] = {}

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
        handle._publish(EventType.RUN_STARTED, payload, node_id=None, durable=False)
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
    def finished(self) -> bool:
        """True once RUN_SUCCEEDED / RUN_FAILED / RUN_CANCELLED was published through this handle."""
        return self._finished is not None

    @property
    def writable(self) -> bool:
        """False once finished, fenced, or broken by a lost event; every write would raise."""
        try:
            self._check_writable()
        except (RunClosedError, DeliveryError):
            return False
        return True

    def _check_writable(self) -> None:
        if self._finished is not None:
            raise RunClosedError(f"run {self.run_id} already ended ({self._finished})")
        if self.journal.fence_count != self._fence_mark:
            kind = LeaseLapsedError if self.journal.lapsed else ProducerFencedError
            raise kind(
                f"instance {self.producer_id} was fenced; run {self.run_id} now belongs to the recovery job"
            )
        if self._broken is not None:
            err = type(self._broken)(f"run {self.run_id} lost events and stopped: {self._broken}")
            err.retryable = False
            raise err from self._broken

    def _on_lost(self, error: DeliveryError) -> None:
        """Called by the journal (any thread) when an already-accepted event of this run was lost."""
        self._broken = error

    # -- publishing -------------------------------------------------------------------------------
    def _event(self, etype: EventType, payload: dict[str, Any], node_id: str | None) -> Event:
        """A new event of this run with the next seq (not yet published)."""
        return Event(  # positional, in the fields' order (event_id … traceparent): the cheapest call on this path
            new_event_id(), self.run_id, self.tenant_id, self._next_seq, self.epoch, self.producer_id, etype, utcnow(),
            payload, node_id, self._traceparent or current_traceparent.get(),
        )

    def _publish(
        self, etype: EventType, payload: dict[str, Any], *, node_id: str | None, durable: bool
    ) -> Event:
        self._check_writable()
        if self._pending is not None:
            self._flush_pending()  # a tool's outcome not yet durable goes first (runjournal.producers._outcomes)
        event = self._event(etype, payload, node_id)
        try:
            self.journal.publish(event, durable=durable, on_lost=self._on_lost)
        except DeliveryError as exc:
            if not exc.retryable and not isinstance(exc, ProducerFencedError):
                self._broken = exc  # the event may or may not be visible: its seq cannot be reused
            raise
        self._next_seq += 1
        if etype in _APPROVAL:
            self._approvals[payload["call_id"]] = _APPROVAL[etype]
        if etype in _TERMINAL:
            self._finished = etype
            self.journal.release_run(self.run_id)
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
            node_id: node path the event belongs to; default: the innermost open node.
            durable: None → durable iff ``type`` is in ``runjournal.schemas.DURABLE_TYPES``; True forces a commit
                (broker ack) before returning. False is refused for a durable type.

        Returns:
            The published :class:`~runjournal.schemas.Event`.

        Raises:
            ValueError: a reserved type, or ``durable=False`` for a durable type.
            InvalidEventError / EventTooLargeError: from the codec, before anything is sent.
            DeliveryError (and subclasses), RunClosedError, QueueFullError, PartitionCountChangedError.
        """
        etype = type if isinstance(type, EventType) else EventType(type)
        if etype in _NOT_EMITTABLE:
            raise ValueError(
                f"{etype} is published by start_run/resume/succeed/fail or the recovery job, not emit()"
            )
        if durable is False and etype in DURABLE_TYPES:
            raise ValueError(f"{etype} is always durable (DESIGN.md § The side-effect protocol)")
        return self._publish(
            etype,
            dict(payload),
            node_id=node_id or self.node_path,
            durable=bool(durable) or etype in DURABLE_TYPES,
        )

    # -- nodes --------------------------------------------------------------------------------------
    @contextmanager
    def node(self, name: str) -> Iterator[str]:
        """A node of the run: NODE_STARTED on entry, NODE_SUCCEEDED on exit, NODE_FAILED + re-raise on error.

        Args:
            name: node name; no ``/`` or ``#`` (they build paths).

        Yields:
            The node path (``outer/inner``, ``book#2`` for the second ``book`` under one parent).

        Raises:
            ValueError: a bad name. Publishing errors as :meth:`emit`. The block's own exception is re-raised.
        """
        path = enter_node(self._entries, self.node_path or "", name)
        attempt = (self.plan.node_attempts.get(path, 0) if self.plan else 0) + 1
        self._publish(
            EventType.NODE_STARTED, {"node_path": path, "attempt": attempt}, node_id=path, durable=False
        )
        self._node_stack.append(path)
        try:
            yield path
        except Exception as exc:
            self._node_stack.pop()
            if self.writable:
                retryable = bool(getattr(exc, "retryable", False))
                payload = {"node_path": path, "error": error_text(exc), "retryable": retryable}
                try:
                    self._publish(EventType.NODE_FAILED, payload, node_id=path, durable=False)
                except JournalError as publish_exc:  # keep the block's own exception; say why no NODE_FAILED
                    exc.add_note(f"NODE_FAILED of {path} was not published: {error_text(publish_exc)}")
            raise
        except BaseException:
            self._node_stack.pop()  # interrupted (KeyboardInterrupt, GeneratorExit): no outcome to state
            raise
        self._node_stack.pop()
        self._publish(EventType.NODE_SUCCEEDED, {"node_path": path}, node_id=path, durable=False)

    # -- other facts ------------------------------------------------------------------------------------
    def message(self, role: str, content: str, *, user_id: str | None = None) -> Event:
        """A transcript turn (MESSAGE; non-durable). Input for memory only — never for recovery."""
        payload = {"role": role, "content": content, "user_id": user_id}
        return self._publish(EventType.MESSAGE, payload, node_id=self.node_path, durable=False)

    def correction(self, subject: str, text: str, *, user_id: str | None = None) -> Event:
        """A user's correction (USER_CORRECTION; non-durable), for the memory extractor."""
        payload = {"subject": subject, "text": text, "user_id": user_id}
        return self._publish(EventType.USER_CORRECTION, payload, node_id=self.node_path, durable=False)

    def request_approval(self, call_id: str, reason: str, tool: str | None = None) -> Event:
        """APPROVAL_REQUESTED (durable) for ``call_id`` — e.g. an ``OutcomeUnknownError.call_id``."""
        payload = {"call_id": call_id, "reason": reason, "tool": tool}
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

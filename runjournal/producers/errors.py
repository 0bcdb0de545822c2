"""Named errors of the producer library, one base (:class:`JournalError`) with subclasses by failure kind.

Third-party errors (``confluent_kafka.KafkaException``, ``redis.RedisError``) are chained as
``__cause__``. Codec errors (``runjournal.schemas.EventTooLargeError``, ``runjournal.schemas.InvalidEventError``,
``NaiveDatetimeError``) pass through unchanged: they are raised before anything is sent. An id that breaks its rules
raises ``runjournal.core.ids.InvalidIdError`` (a ``RunjournalError`` and a ``ValueError``, not a ``JournalError``:
every package checks ids), also before anything is sent.

Hierarchy::

    RunjournalError
    └── JournalError
        ├── DeliveryError                 a publish was not acknowledged (nothing of it is visible)
        │   ├── TransactionAbortedError   abortable error: the transaction was aborted
        │   └── FatalProducerError        the producer hit a fatal error and was rebuilt
        │       └── ProducerFencedError   another producer took this transactional.id (zombie fencing)
        │           └── LeaseLapsedError  the instance's lease lapsed: it is fenced, restart it
        ├── QueueFullError                the local produce queue stayed full (backpressure)
        ├── PartitionCountChangedError    the events topic's partition count changed
        ├── TopicNotFoundError            the events topic does not exist
        ├── RunClosedError                the run already succeeded / failed on this handle
        ├── RunExistsError                start_run was given the id of an existing run
        ├── RunTooLongError               new work past the run's hard event limit (run_events_max)
        ├── NonCanonicalValueError        call arguments / a run's input have no exact canonical JSON form
        ├── NoRecoveryPlanError           resume() found no plan
        ├── PlanMismatchError             the resumed code reached a step recorded for another tool
        ├── OutcomeUnknownError           an intended side effect has no recorded outcome
        │   └── ApprovalDeniedError       a human denied re-running an unknown-outcome call
        ├── OutcomeNotDurableError        a tool ran; its outcome is not durable yet (call again: no re-run)
        ├── ArgumentsTooLargeError        call arguments over ``max_result_bytes`` (nothing published)
        └── ResultUnavailableError        a recorded result reference cannot be read back
            ├── ResultCorruptError        a large result's records do not reassemble to its digest
            └── UnrecordableResultError   a tool's result cannot be recorded faithfully (outcome is durable)
                └── ResultTooLargeError   the result is over ``max_result_bytes`` (outcome is durable)
"""

from __future__ import annotations

from runjournal.core.errors import RunjournalError

__all__ = [
    "ApprovalDeniedError",
    "ArgumentsTooLargeError",
    "DeliveryError",
    "FatalProducerError",
    "JournalError",
    "LeaseLapsedError",
    "NoRecoveryPlanError",
    "NonCanonicalValueError",
    "OutcomeNotDurableError",
    "OutcomeUnknownError",
    "PartitionCountChangedError",
    "PlanMismatchError",
    "ProducerFencedError",
    "RunSurrenderedError",
    "QueueFullError",
    "RecordedFailureError",
    "ResultCorruptError",
    "ResultTooLargeError",
    "ResultUnavailableError",
    "RunCancelledError",
    "RunClosedError",
    "RunExistsError",
    "RunTooLongError",
    "RunPausedError",
    "RunStoppedError",
    "RunWaitingError",
    "SignalTimeoutError",
    "TopicNotFoundError",
    "TransactionAbortedError",
    "UnrecordableResultError",
]


class JournalError(RunjournalError):
    """Base of every error raised by the ``producers`` package."""


class DeliveryError(JournalError):
    """A publish was not acknowledged by the broker; none of its events are visible to
    ``read_committed`` readers. The Kafka error is chained as ``__cause__``.

    Attributes:
        retryable: True when publishing again may succeed (the handle is still usable).
        ambiguous: True when the commit may have happened (a timed-out commit): the seq cannot be given to
            another event; publishing the *same* event again is safe (readers drop the copy by event_id).
        refused_keys: record keys the broker refused for themselves (e.g. MSG_SIZE_TOO_LARGE); sending
            the same bytes again will fail the same way.
    """

    retryable: bool = True
    ambiguous: bool = False
    refused_keys: frozenset[str] = frozenset()


class TransactionAbortedError(DeliveryError):
    """The open transaction hit an abortable error (e.g. a record's delivery failed) and was aborted.

    The failing durable event is not published and its ``seq`` is free again; non-durable events of
    the same transaction were re-produced (same ``event_id``/``seq``) into the next transaction.
    """


class FatalProducerError(DeliveryError):
    """The producer hit a fatal error (e.g. OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID) and
    was rebuilt with a fresh ``init_transactions()``. The publish that saw it did not happen."""


class ProducerFencedError(FatalProducerError):
    """Another producer called ``init_transactions()`` with this instance's ``transactional.id``
    (the recovery job fencing a presumed-dead instance; docs/design/protocol.md § Zombies: fence first, then read).

    The whole instance is done: every publish after the fence raises this error (its runs now belong
    to the recovery job). It never re-initialises the same ``transactional.id`` — that would bump the
    producer epoch back and un-fence the zombie behind the recovery job's read. Restart the process: a
    Journal started under the same ``producer_id`` is a new incarnation with its own ``transactional.id``.
    """

    retryable = False


class LeaseLapsedError(ProducerFencedError):
    """The instance's lease lapsed (its heartbeat found the key gone: it was paused or cut off from Redis past
    its TTL, and the recovery job may already have taken its runs). The instance is fenced for good: its
    heartbeat stops and every publish raises this error. Restart the process — it comes back as a new
    incarnation (``name#n``) and recovery resumes the earlier incarnation's runs. A lapsed lease is never
    revived (compare-and-set; docs/design/protocol.md "Decisions after the first build": leases)."""


class RunSurrenderedError(DeliveryError):
    """This instance gave the run up to the recovery job at this epoch (``Journal.surrender``: a handle of it lost
    an event and stopped); it writes nothing more of the run at that epoch. The recovery job resumes the run under
    a new epoch, possibly back to this instance (``Journal.resume``). docs/design/protocol.md § Surrender."""

    retryable = False


class QueueFullError(JournalError):
    """The local produce queue stayed full after bounded retries (``BufferError``); nothing was sent.

    Attributes:
        retry_after_s: a suggested wait in seconds before publishing again.
    """

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message)


#: What to do about a changed partition count (Kafka cannot remove partitions; runs are placed by their count).
PARTITIONS_REPAIR = ("Kafka cannot take partitions away and every run's events are placed by murmur2(run_id) mod "
                     "{expected}: move the journal to a new topic prefix created with {expected} partitions "
                     "(`runjournal topics create --partitions {expected}` under a new RUNJOURNAL_TOPIC_PREFIX) — "
                     "a projector rebuild cannot repair it (docs/design/protocol.md § Topic layout)")


class PartitionCountChangedError(JournalError):
    """The events topic's partition count differs from the one the journal was created with (stored with the
    projection's topic identity, ``rj:<prefix>:topic``) or from the one read at start.

    The run-to-partition map (murmur2(run_id) mod count) would change and split runs across
    partitions, so nothing is published or decided (docs/design/protocol.md § Topic layout: the count is fixed at
    creation).

    Attributes:
        expected: the count the journal was created with (or read at start).
        actual: the count now.
        repair: what fixes it (:data:`PARTITIONS_REPAIR`).
    """

    def __init__(self, *, topic: str, expected: int, actual: int, at_start: bool = False) -> None:
        self.expected = expected
        self.actual = actual
        self.repair = PARTITIONS_REPAIR.format(expected=expected)
        when = "was created with" if at_start else "had at start"
        super().__init__(
            f"topic {topic} {when} {expected} partitions and has {actual} now; nothing is published: {self.repair}"
        )


class TopicNotFoundError(JournalError):
    """The events topic does not exist (run ``runjournal topics create``)."""


class RunClosedError(JournalError):
    """The run already succeeded or failed through this handle; it takes no more events."""


class RunStoppedError(JournalError):
    """An operator asked this run to stop (``runjournal cancel`` / ``pause``, the console, ``runjournal.consumers.ops
    .control``) and the handle carried the request out at a step boundary: no new intent, node or approval is started
    through it. Calls already in flight end as usual (their outcomes are recorded). Let it propagate out of the run's
    code; a ``with run:`` block publishes no RUN_FAILED for it. docs/design/decisions/0047-operator-controls.md.

    Attributes:
        run_id, action (``cancel`` / ``pause``), requested_by, reason, request_id: the request.
    """

    retryable = False

    def __init__(self, message: str, *, run_id: str, action: str, requested_by: str, reason: str,
                 request_id: str) -> None:
        super().__init__(message)
        self.run_id, self.action, self.requested_by, self.reason, self.request_id = (
            run_id, action, requested_by, reason, request_id)


class RunCancelledError(RunStoppedError):
    """The run was cancelled by an operator: RUN_CANCELLED (with who and why) ends it — at once, or once the
    requests still in flight on other threads have returned. It is never resumed."""


class RunWaitingError(RunStoppedError):
    """The run waits (``RunHandle.sleep`` / ``wait_signal``) longer than the Journal's ``hold_after_s``: this instance
    gave it up and the recovery job holds it for nobody until ``until_ms`` (Redis's clock, ms) or the signal
    ``signal`` arrives, then resumes it on a live instance, whose re-executed code passes the wait
    (docs/design/decisions/0050-durable-waits.md). Let it propagate out of the run's code, like a pause.

    Attributes (besides :class:`RunStoppedError`'s): until_ms, signal.
    """

    until_ms: int | None = None
    signal: str | None = None


class SignalTimeoutError(JournalError):
    """``RunHandle.wait_signal``: the signal did not arrive before the wait's timeout (by Redis's clock). Raised the
    same way live and after a resume; ask with another signal name to wait again."""

    def __init__(self, message: str, *, run_id: str, signal: str) -> None:
        super().__init__(message)
        self.run_id, self.signal = run_id, signal


class RunPausedError(RunStoppedError):
    """The run was paused by an operator: this instance gave it up (``Journal.surrender``) and the recovery job
    holds it for nobody (a RUN_RESUMED with ``paused``) until ``runjournal resume RUN_ID`` hands it to a live
    instance under a new epoch, which continues it like any resumed run."""


class RunExistsError(JournalError):
    """``start_run`` was given the id of a run that already exists; nothing was published.

    Starting it again would write its keys ``{run_id}:1:1…`` a second time (compaction would replace the
    first run's events) and answer its requests with the first run's decisions. To continue a run that
    failed, use ``runjournal.consumers.recovery.continue_run`` (a new epoch, recorded results returned,
    recorded approvals honoured); otherwise pick a new run id.

    Attributes:
        run_id: the refused id.
        started_by: the instance that started it, when known.
    """

    def __init__(self, run_id: str, started_by: str | None) -> None:
        self.run_id = run_id
        self.started_by = started_by
        super().__init__(
            f"run {run_id} already exists (started by {started_by or 'an unknown instance'}); "
            "continue a failed run with runjournal.consumers.recovery.continue_run, or start a new run_id")


class RunTooLongError(JournalError):
    """The run reached its hard event limit (``Settings.run_events_max``) and the agent tried to start new work —
    a node, a tool call's intent, a message, an approval request. Raised before anything is published: no intent
    exists, so no effect can be left unrecorded. Outcomes, node ends and the run's end are never refused (the
    run may pass the limit by the calls it has in flight). End the run (``succeed``/``fail``) or raise the limit;
    README § Limits.

    Attributes:
        run_id: the run.
        events: the seq the refused event would have taken.
        limit: ``run_events_max``.
    """

    def __init__(self, run_id: str, events: int, limit: int) -> None:
        self.run_id = run_id
        self.events = events
        self.limit = limit
        super().__init__(
            f"run {run_id} reached its limit of {limit} events (RUNJOURNAL_RUN_EVENTS_MAX); new work is refused "
            f"before it is published — end the run (succeed/fail) or raise the limit")


class NonCanonicalValueError(JournalError, ValueError):
    """A value that enters a digest — a call's arguments (``args_digest``), a run's input — has no exact canonical
    JSON form (a set, bytes, a datetime, an object, NaN or infinity, a non-string key, an integer beyond 64 bits, a
    lone surrogate); nothing was published (``runjournal.producers._digest.canonical_value``).

    A ``ValueError`` too. Its text would differ between processes or equal another value's, so a resumed run's
    digest could differ from the live one's, or two calls share one.

    Attributes:
        what: ``args`` or ``input``.
        problem: the first offending place (``args['when']: a set has no exact JSON form``).
    """

    def __init__(self, message: str, *, what: str, problem: str) -> None:
        self.what = what
        self.problem = problem
        super().__init__(message)


class NoRecoveryPlanError(JournalError):
    """``Journal.resume(run_id)`` found no :class:`~runjournal.producers.plan.RecoveryPlan` for the run."""


class StalePlanError(NoRecoveryPlanError):
    """``Journal.resume(run_id)`` found a plan older than the run's newest epoch: a later recovery took the run
    (docs/operations/concurrency.md). Nothing was published; the run is not this instance's."""

    def __init__(self, message: str, *, plan_epoch: int, newest_epoch: int) -> None:
        super().__init__(message)
        self.plan_epoch = plan_epoch
        """The epoch the stored plan resumes under."""
        self.newest_epoch = newest_epoch
        """The run's newest epoch, as its projection shows it."""


class DuplicateSeqError(JournalError):
    """A second event at a seq this instance already published for the run (two writers of one run in one process,
    e.g. two handles of it). Refused before anything reached the topic (docs/operations/concurrency.md)."""

    def __init__(self, message: str, *, run_id: str, seq: int, published_seq: int) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.seq = seq
        """The refused event's seq."""
        self.published_seq = published_seq
        """The highest seq this instance has already published for the run."""


class PlanMismatchError(JournalError):
    """A resumed run reached a step whose idempotency key the plan records for a different tool:
    the agent code is not deterministic with respect to the recorded run. Nothing was executed."""


class OutcomeUnknownError(JournalError):
    """An intended side effect has no recorded outcome and could not be reconciled.

    docs/design/protocol.md § The side-effect protocol: INTENDED without an outcome is *outcome unknown* — not
    done, not "not done". The call is not re-run; request an approval (``request_approval``).

    Attributes:
        call_id: the call's id (its idempotency key).
        idempotency_key: the key the provider saw.
        tool: the tool's name.
        approval_id: the id to ask an approval under (``RunHandle.request_approval``, ``await_approval``):
            ``<call_id>@<attempt>``, so a grant authorises one re-run of this attempt and no later one
            (docs/design/protocol.md § The side-effect protocol). An approval under the bare ``call_id`` is
            honoured once as well (the re-run's intent uses it up).
    """

    def __init__(self, message: str, *, call_id: str, idempotency_key: str, tool: str,
                 approval_id: str | None = None) -> None:
        self.call_id = call_id
        self.idempotency_key = idempotency_key
        self.tool = tool
        self.approval_id = approval_id or call_id
        super().__init__(message)


class ApprovalDeniedError(OutcomeUnknownError):
    """A human denied re-running an unknown-outcome call; the call is not executed."""


class ResultUnavailableError(JournalError):
    """A recorded result is stored by reference (``result_ref``) and cannot be read back: an old ``sha256:`` reference
    whose Redis key is gone, or a ``kafka:`` reference whose records on ``{prefix}.payloads`` are missing (erased,
    or the topic was deleted) — ``runjournal.producers.results``."""


class ResultCorruptError(ResultUnavailableError):
    """The records a ``kafka:`` result reference names were read but do not make the recorded result: a record
    with another key where a chunk should be, or chunks whose reassembled text does not have the recorded sha256
    digest. Nothing is returned (a wrong result is never handed out as the recorded one)."""


class UnrecordableResultError(ResultUnavailableError):
    """A tool ran but its result cannot be recorded faithfully (a dict with non-string keys, a lone surrogate,
    NaN, a datetime or another value JSON cannot carry exactly, or Redis refused a large result).

    Raised only after the call's outcome is durable as TOOL_CALL_COMMITTED without a result (the effect
    happened; the call is never re-run). A resumed run reaching the call raises it too: the live caller
    and a resumed run receive the same thing. Return JSON values (str keys, finite floats, valid text).

    Attributes:
        call_id, tool: the call.
        reason: why the value cannot be recorded (names the offending place, e.g. ``result[1]``).
    """

    def __init__(self, message: str, *, call_id: str, tool: str, reason: str) -> None:
        self.call_id = call_id
        self.tool = tool
        self.reason = reason
        super().__init__(message)


class ResultTooLargeError(UnrecordableResultError):
    """A tool's result is larger than ``Settings.max_result_bytes`` (``RUNJOURNAL_MAX_RESULT_BYTES``): none of it was
    produced; the call is recorded as TOOL_CALL_COMMITTED without a result (the effect happened and is never run
    again) and this is raised — live, and as ``UnrecordableResultError`` on resume. Attributes as
    :class:`UnrecordableResultError` plus ``size`` and ``limit`` (bytes)."""

    def __init__(self, message: str, *, call_id: str, tool: str, reason: str, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(message, call_id=call_id, tool=tool, reason=reason)


class ArgumentsTooLargeError(JournalError, ValueError):
    """A call's arguments (canonical JSON) are larger than ``Settings.max_result_bytes``
    (``RUNJOURNAL_MAX_RESULT_BYTES``): refused before its TOOL_CALL_INTENDED, nothing was published and the tool
    did not run. A ``ValueError`` too."""


class OutcomeNotDurableError(JournalError):
    """A tool was invoked but the event stating its outcome could not be made durable (after bounded retries).

    The handle keeps that outcome event and publishes it again before anything else of the run: call the
    same tool with the same arguments again at the same step (the natural retry) and you get its result —
    the tool does not run again. If the run ends or the instance dies first, the call is left INTENDED
    and recovery reconciles it as OUTCOME_UNKNOWN; never a new attempt under a new key.

    Attributes:
        call_id, idempotency_key, tool: the call.
        tool_error: the tool's own exception when the outcome is a failure, else None.
    """

    retryable = True

    def __init__(self, message: str, *, call_id: str, idempotency_key: str, tool: str,
                 tool_error: BaseException | None = None) -> None:
        self.call_id = call_id
        self.idempotency_key = idempotency_key
        self.tool = tool
        self.tool_error = tool_error
        super().__init__(message)


class RecordedFailureError(JournalError):
    """A resumed step reached a call whose recorded attempt failed and was not retryable: the failure is
    raised again in its place (the tool does not run), so the run's code takes the same path it took
    before the crash (e.g. its fallback) instead of executing the effect a second time.

    Attributes:
        error: the recorded error text.
        call_id: the call.
        tool: the tool name.
    """

    def __init__(self, message: str, *, error: str | None, call_id: str, tool: str) -> None:
        super().__init__(message)
        self.error = error
        self.call_id = call_id
        self.tool = tool

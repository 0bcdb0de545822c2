"""Named errors of the producer library, one base (:class:`JournalError`) with subclasses by failure kind.

Third-party errors (``confluent_kafka.KafkaException``, ``redis.RedisError``) are chained as
``__cause__``. Codec errors (``runjournal.schemas.EventTooLargeError``, ``runjournal.schemas.InvalidEventError``,
``NaiveDatetimeError``) pass through unchanged: they are raised before anything is sent.

Hierarchy::

    RunjournalError
    └── JournalError
        ├── DeliveryError                 a publish was not acknowledged (nothing of it is visible)
        │   ├── TransactionAbortedError   abortable error: the transaction was aborted
        │   └── FatalProducerError        the producer hit a fatal error and was rebuilt
        │       └── ProducerFencedError   another producer took this transactional.id (zombie fencing)
        ├── QueueFullError                the local produce queue stayed full (backpressure)
        ├── PartitionCountChangedError    the events topic's partition count changed
        ├── TopicNotFoundError            the events topic does not exist
        ├── RunClosedError                the run already succeeded / failed on this handle
        ├── NoRecoveryPlanError           resume() found no plan
        ├── PlanMismatchError             the resumed code reached a step recorded for another tool
        ├── OutcomeUnknownError           an intended side effect has no recorded outcome
        ├── ApprovalDeniedError           a human denied re-running an unknown-outcome call
        └── ResultUnavailableError        a recorded result reference cannot be read back
"""

from __future__ import annotations

from runjournal.core.errors import RunjournalError

__all__ = [
    "ApprovalDeniedError",
    "DeliveryError",
    "FatalProducerError",
    "JournalError",
    "NoRecoveryPlanError",
    "OutcomeUnknownError",
    "PartitionCountChangedError",
    "PlanMismatchError",
    "ProducerFencedError",
    "QueueFullError",
    "RecordedFailureError",
    "ResultUnavailableError",
    "RunClosedError",
    "TopicNotFoundError",
    "TransactionAbortedError",
]


class JournalError(RunjournalError):
    """Base of every error raised by the ``producers`` package."""


class DeliveryError(JournalError):
    """A publish was not acknowledged by the broker; none of its events are visible to
    ``read_committed`` readers. The Kafka error is chained as ``__cause__``.

    Attributes:
        retryable: True when publishing again may succeed (the handle is still usable).
    """

    retryable: bool = True


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
    (the recovery job fencing a presumed-dead instance; DESIGN.md § Zombies: fence first, then read).

    The whole instance is done: every publish after the fence raises this error (its runs now belong
    to the recovery job). It never re-initialises the same ``transactional.id`` — that would bump the
    producer epoch back and un-fence the zombie behind the recovery job's read. Restart the process
    with a new ``producer_id``.
    """

    retryable = False


class QueueFullError(JournalError):
    """The local produce queue stayed full after bounded retries (``BufferError``); nothing was sent.

    Attributes:
        retry_after_s: a suggested wait in seconds before publishing again.
    """

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message)


class PartitionCountChangedError(JournalError):
    """The events topic's partition count differs from the one read at start.

    The run-to-partition map (murmur2(run_id) mod count) would change and split runs across
    partitions, so publishing stops (DESIGN.md § Topic layout: the count is fixed at creation).

    Attributes:
        expected: the count read at start.
        actual: the count now.
    """

    def __init__(self, *, topic: str, expected: int, actual: int) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"topic {topic} had {expected} partitions at start and has {actual} now; publishing stopped"
        )


class TopicNotFoundError(JournalError):
    """The events topic does not exist (run ``runjournal topics create``)."""


class RunClosedError(JournalError):
    """The run already succeeded or failed through this handle; it takes no more events."""


class NoRecoveryPlanError(JournalError):
    """``Journal.resume(run_id)`` found no :class:`~runjournal.producers.plan.RecoveryPlan` for the run."""


class PlanMismatchError(JournalError):
    """A resumed run reached a step whose idempotency key the plan records for a different tool:
    the agent code is not deterministic with respect to the recorded run. Nothing was executed."""


class OutcomeUnknownError(JournalError):
    """An intended side effect has no recorded outcome and could not be reconciled.

    DESIGN.md § The side-effect protocol: INTENDED without an outcome is *outcome unknown* — not
    done, not "not done". The call is not re-run; request an approval (``request_approval``).

    Attributes:
        call_id: the call's id (use it for ``RunHandle.request_approval``).
        idempotency_key: the key the provider saw.
        tool: the tool's name.
    """

    def __init__(self, message: str, *, call_id: str, idempotency_key: str, tool: str) -> None:
        self.call_id = call_id
        self.idempotency_key = idempotency_key
        self.tool = tool
        super().__init__(message)


class ApprovalDeniedError(OutcomeUnknownError):
    """A human denied re-running an unknown-outcome call; the call is not executed."""


class ResultUnavailableError(JournalError):
    """A recorded result is stored by reference (``result_ref``) and cannot be read back from Redis."""


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

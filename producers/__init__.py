"""The producer library agent instances embed: journal API, run-id partitioning, side-effect protocol.

Start here: :class:`Journal` (one per agent instance) → :meth:`Journal.start_run` /
:meth:`Journal.resume` → :class:`RunHandle` (``emit``, ``node``, ``call``, ``message``,
``correction``, ``request_approval``, ``succeed``, ``fail``). DESIGN.md § The side-effect
protocol, § Topic layout and § Zombies: fence first, then read are the rules implemented here.
"""

from runjournal.producers._digest import canonical_json, digest, enter_node, idempotency_key
from runjournal.producers.errors import (
    ApprovalDeniedError,
    DeliveryError,
    FatalProducerError,
    JournalError,
    LeaseLapsedError,
    NoRecoveryPlanError,
    OutcomeNotDurableError,
    OutcomeUnknownError,
    PartitionCountChangedError,
    PlanMismatchError,
    ProducerFencedError,
    QueueFullError,
    RecordedFailureError,
    ResultUnavailableError,
    RunClosedError,
    RunExistsError,
    TopicNotFoundError,
    TransactionAbortedError,
    UnrecordableResultError,
)
from runjournal.producers.fencing import fence_producer, transactional_id
from runjournal.producers.handle import RunHandle
from runjournal.producers.journal import Journal
from runjournal.producers.partitioner import partition_for
from runjournal.producers.plan import ApprovalStatus, CallStatus, PlannedCall, PlanStore, RecoveryPlan
from runjournal.producers.results import ResultStore
from runjournal.producers.tools import Outcome, Reconcilable, Tool, ToolOutcomeUnknownError
from runjournal.producers.tracing import current_traceparent, use_traceparent, valid_traceparent

__all__ = [
    "ApprovalDeniedError",
    "ApprovalStatus",
    "CallStatus",
    "DeliveryError",
    "FatalProducerError",
    "Journal",
    "JournalError",
    "LeaseLapsedError",
    "NoRecoveryPlanError",
    "Outcome",
    "OutcomeNotDurableError",
    "OutcomeUnknownError",
    "PartitionCountChangedError",
    "PlanMismatchError",
    "PlanStore",
    "PlannedCall",
    "ProducerFencedError",
    "QueueFullError",
    "RecordedFailureError",
    "Reconcilable",
    "RecoveryPlan",
    "ResultStore",
    "ResultUnavailableError",
    "RunClosedError",
    "RunExistsError",
    "RunHandle",
    "Tool",
    "ToolOutcomeUnknownError",
    "TopicNotFoundError",
    "TransactionAbortedError",
    "UnrecordableResultError",
    "canonical_json",
    "current_traceparent",
    "digest",
    "fence_producer",
    "enter_node",
    "idempotency_key",
    "partition_for",
    "transactional_id",
    "use_traceparent",
    "valid_traceparent",
]

"""The producer library agent instances embed: journal API, run-id partitioning, side-effect protocol.

Start here: :class:`Journal` (one per agent instance) → :meth:`Journal.start_run` /
:meth:`Journal.resume` → :class:`RunHandle` (``emit``, ``node``, ``call``, ``message``,
``correction``, ``request_approval``, ``succeed``, ``fail``). DESIGN.md § The side-effect
protocol, § Topic layout and § Zombies: fence first, then read are the rules implemented here.
"""

from producers._digest import canonical_json, digest, enter_node, idempotency_key
from producers.errors import (
    ApprovalDeniedError,
    DeliveryError,
    FatalProducerError,
    JournalError,
    NoRecoveryPlanError,
    OutcomeUnknownError,
    PartitionCountChangedError,
    PlanMismatchError,
    ProducerFencedError,
    QueueFullError,
    RecordedFailureError,
    ResultUnavailableError,
    RunClosedError,
    TopicNotFoundError,
    TransactionAbortedError,
)
from producers.fencing import fence_producer, transactional_id
from producers.handle import RunHandle
from producers.journal import Journal
from producers.partitioner import murmur2, partition_for, to_positive
from producers.plan import ApprovalStatus, CallStatus, PlannedCall, PlanStore, RecoveryPlan
from producers.results import ResultStore
from producers.tools import Outcome, Reconcilable, Tool
from producers.tracing import current_traceparent, use_traceparent, valid_traceparent

__all__ = [
    "ApprovalDeniedError",
    "ApprovalStatus",
    "CallStatus",
    "DeliveryError",
    "FatalProducerError",
    "Journal",
    "JournalError",
    "NoRecoveryPlanError",
    "Outcome",
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
    "RunHandle",
    "Tool",
    "TopicNotFoundError",
    "TransactionAbortedError",
    "canonical_json",
    "current_traceparent",
    "digest",
    "fence_producer",
    "enter_node",
    "idempotency_key",
    "murmur2",
    "partition_for",
    "to_positive",
    "transactional_id",
    "use_traceparent",
    "valid_traceparent",
]

"""The producer library agent instances embed: journal API, run-id partitioning, side-effect protocol.

Start here: :class:`Journal` (one per agent instance) → :meth:`Journal.start_run` /
:meth:`Journal.resume` → :class:`RunHandle` (``emit``, ``node``, ``call``, ``message``,
``correction``, ``request_approval``, ``succeed``, ``fail``). docs/design/protocol.md § The side-effect
protocol, § Topic layout and § Zombies: fence first, then read are the rules implemented here.
"""

import warnings
from typing import Any

from runjournal.core.errors import StackUnavailableError
from runjournal.core.ids import InvalidIdError
from runjournal.producers._digest import canonical_json, canonical_value, digest, enter_node, idempotency_key
from runjournal.producers.control import ControlRequest, stop_requested
from runjournal.producers.errors import (
    ApprovalDeniedError,
    DeliveryError,
    FatalProducerError,
    JournalError,
    LeaseLapsedError,
    NonCanonicalValueError,
    NoRecoveryPlanError,
    OutcomeNotDurableError,
    OutcomeUnknownError,
    PartitionCountChangedError,
    PlanMismatchError,
    ProducerFencedError,
    QueueFullError,
    RecordedFailureError,
    ResultUnavailableError,
    RunCancelledError,
    RunClosedError,
    RunExistsError,
    RunPausedError,
    RunStoppedError,
    RunSurrenderedError,
    TopicNotFoundError,
    TransactionAbortedError,
    UnrecordableResultError,
)
from runjournal.producers.fencing import fence_producer, transactional_id
from runjournal.producers.handle import RunHandle
from runjournal.producers.journal import Journal
from runjournal.producers.plan import ApprovalStatus, CallVerdict, PlannedCall, PlanStore, RecoveryPlan
from runjournal.producers.results import ResultStore
from runjournal.producers.tools import Outcome, Reconcilable, Tool, ToolOutcomeUnknownError
from runjournal.producers.tracing import current_traceparent, use_traceparent, valid_traceparent
from runjournal.schemas.keys import partition_for

__all__ = [
    "ApprovalDeniedError",
    "ApprovalStatus",
    "CallStatus",
    "CallVerdict",
    "ControlRequest",
    "DeliveryError",
    "FatalProducerError",
    "InvalidIdError",
    "Journal",
    "JournalError",
    "LeaseLapsedError",
    "NoRecoveryPlanError",
    "NonCanonicalValueError",
    "Outcome",
    "OutcomeNotDurableError",
    "OutcomeUnknownError",
    "PartitionCountChangedError",
    "PlanMismatchError",
    "PlanStore",
    "PlannedCall",
    "ProducerFencedError",
    "RunSurrenderedError",
    "QueueFullError",
    "RecordedFailureError",
    "Reconcilable",
    "RecoveryPlan",
    "ResultStore",
    "ResultUnavailableError",
    "RunCancelledError",
    "RunClosedError",
    "RunExistsError",
    "RunHandle",
    "RunPausedError",
    "RunStoppedError",
    "StackUnavailableError",
    "Tool",
    "ToolOutcomeUnknownError",
    "TopicNotFoundError",
    "TransactionAbortedError",
    "UnrecordableResultError",
    "canonical_json",
    "canonical_value",
    "current_traceparent",
    "digest",
    "fence_producer",
    "enter_node",
    "idempotency_key",
    "partition_for",
    "stop_requested",
    "transactional_id",
    "use_traceparent",
    "valid_traceparent",
]


def __getattr__(name: str) -> Any:
    """``CallStatus``: the deprecated name of :class:`CallVerdict` (kept for one release, CHANGELOG.md)."""
    if name == "CallStatus":
        warnings.warn("runjournal.producers.CallStatus is deprecated: use CallVerdict (the plan's verdict; the "
                      "execution record's status is runjournal.model.CallStatus)", DeprecationWarning, stacklevel=2)
        return CallVerdict
    raise AttributeError(f"module 'runjournal.producers' has no attribute {name!r}")

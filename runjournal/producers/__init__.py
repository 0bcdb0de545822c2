"""The producer library agent instances embed: journal API, run-id partitioning, side-effect protocol.

Start here: :class:`Journal` (one per agent instance) → :meth:`Journal.start_run` /
:meth:`Journal.resume` → :class:`RunHandle` (``emit``, ``node``, ``call``, ``message``,
``correction``, ``request_approval``, ``succeed``, ``fail``). docs/design/protocol.md § The side-effect
protocol, § Topic layout and § Zombies: fence first, then read are the rules implemented here.

Exports load on first use (``runjournal.core.lazy``): a reader that needs one module of the library — its errors
(``inspect``, the console, the recovery job's readers), the plan — does not import the journal, its transactional
producer and the run handle.
"""

import warnings
from typing import TYPE_CHECKING, Any

from runjournal.core.lazy import lazy_exports

_HOMES = {
    "InvalidIdError": "runjournal.core.ids",
    "StackUnavailableError": "runjournal.core.errors",
    **dict.fromkeys(["ControlRequest", "stop_requested"], "runjournal.producers.control"),
    **dict.fromkeys(["canonical_json", "canonical_value", "digest", "enter_node", "idempotency_key"],
                    "runjournal.producers._digest"),
    **dict.fromkeys(["ApprovalDeniedError", "DeliveryError", "FatalProducerError", "JournalError", "LeaseLapsedError",
                     "NonCanonicalValueError", "NoRecoveryPlanError", "OutcomeNotDurableError", "OutcomeUnknownError",
                     "PartitionCountChangedError", "PlanMismatchError", "ProducerFencedError", "QueueFullError",
                     "RecordedFailureError", "ResultUnavailableError", "RunCancelledError", "RunClosedError",
                     "RunExistsError", "RunPausedError", "RunStoppedError", "RunSurrenderedError", "RunWaitingError",
                     "RunTooLongError", "SignalTimeoutError",
                     "TopicNotFoundError", "TransactionAbortedError",
                     "UnrecordableResultError"], "runjournal.producers.errors"),
    **dict.fromkeys(["fence_producer", "transactional_id"], "runjournal.producers.fencing"),
    "RunHandle": "runjournal.producers.handle",
    "Journal": "runjournal.producers.journal",
    **dict.fromkeys(["ApprovalStatus", "CallVerdict", "PlannedCall", "PlanStore", "RecoveryPlan"],
                    "runjournal.producers.plan"),
    "ResultStore": "runjournal.producers.results",
    **dict.fromkeys(["Outcome", "Reconcilable", "Tool", "ToolOutcomeUnknownError"], "runjournal.producers.tools"),
    **dict.fromkeys(["current_traceparent", "use_traceparent", "valid_traceparent"], "runjournal.producers.tracing"),
    "partition_for": "runjournal.schemas.keys",
}
"""Exported name → the module that defines it (resolved on first use)."""

if TYPE_CHECKING:  # the names as the type checker sees them (at run time they resolve through __getattr__)
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
        RunTooLongError,
        RunWaitingError,
        SignalTimeoutError,
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
    "RunTooLongError",
    "RunHandle",
    "RunPausedError",
    "RunStoppedError",
    "RunWaitingError",
    "SignalTimeoutError",
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


_export, __dir__ = lazy_exports(__name__, _HOMES)


def __getattr__(name: str) -> Any:
    """An export, imported from its module on first use; ``CallStatus``: the deprecated name of
    :class:`CallVerdict` (kept for one release, CHANGELOG.md)."""
    if name == "CallStatus":
        warnings.warn("runjournal.producers.CallStatus is deprecated: use CallVerdict (the plan's verdict; the "
                      "execution record's status is runjournal.model.CallStatus)", DeprecationWarning, stacklevel=2)
        return _export("CallVerdict")
    return _export(name)

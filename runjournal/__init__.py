"""runjournal — the durable execution journal for AI agent runs, on Apache Kafka.

The public API an agent embeds::

    from runjournal import Journal, Settings

    with Journal(Settings.load(), producer_id="agent-7") as journal:
        run = journal.start_run("acme", "booking-agent", {"ask": "book SEA"}, user_id="u1")
        result = run.call(book_tool, {"flight": "HAT123"})
        run.succeed(result)

Packages, from the ground up (each imports only the ones below it; import-linter checks it):
``runjournal.core`` (settings, errors, logging, failpoints, Kafka client configuration) →
``runjournal.schemas`` (the event contract) → ``runjournal.model`` (run state, execution records,
the pure reducer) → ``runjournal.producers`` (the journal agents embed) → ``runjournal.consumers``
(projector, recovery, memory) and ``runjournal.deploy`` (the local stack) → ``runjournal.demo`` →
``runjournal.cli``.

Names resolve lazily (PEP 562): ``import runjournal`` costs nothing until a name is used.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__: str = version("runjournal")
except PackageNotFoundError:  # a checkout on sys.path without an install
    __version__ = "0.0.0+unknown"

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["ConfigError", "RunjournalError"], "runjournal.core.errors"),
    "Settings": "runjournal.core.settings",
    **dict.fromkeys(
        [
            "ApprovalDeniedError", "ApprovalStatus", "CallStatus", "DeliveryError", "FatalProducerError",
            "Journal", "JournalError", "LeaseLapsedError", "NoRecoveryPlanError", "Outcome",
            "OutcomeNotDurableError", "OutcomeUnknownError", "PartitionCountChangedError", "PlanMismatchError",
            "ProducerFencedError", "QueueFullError", "RecordedFailureError", "Reconcilable", "RecoveryPlan",
            "ResultUnavailableError", "RunClosedError", "RunExistsError", "RunHandle", "Tool",
            "ToolOutcomeUnknownError", "TopicNotFoundError", "TransactionAbortedError", "UnrecordableResultError",
            "idempotency_key", "partition_for",
        ],
        "runjournal.producers",
    ),
    **dict.fromkeys(["Event", "EventCodec", "EventType", "SchemaError"], "runjournal.schemas"),
    **dict.fromkeys(["RunState", "RunStatus", "ExecutionRecord", "apply", "fold"], "runjournal.model"),
}

__all__ = [
    "ApprovalDeniedError",
    "ApprovalStatus",
    "CallStatus",
    "ConfigError",
    "DeliveryError",
    "Event",
    "EventCodec",
    "EventType",
    "ExecutionRecord",
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
    "ProducerFencedError",
    "QueueFullError",
    "Reconcilable",
    "RecordedFailureError",
    "RecoveryPlan",
    "ResultUnavailableError",
    "RunClosedError",
    "RunExistsError",
    "RunHandle",
    "RunState",
    "RunStatus",
    "RunjournalError",
    "SchemaError",
    "Settings",
    "Tool",
    "ToolOutcomeUnknownError",
    "TopicNotFoundError",
    "TransactionAbortedError",
    "UnrecordableResultError",
    "__version__",
    "apply",
    "fold",
    "idempotency_key",
    "partition_for",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from runjournal.core.errors import ConfigError, RunjournalError
    from runjournal.core.settings import Settings
    from runjournal.model import ExecutionRecord, RunState, RunStatus, apply, fold
    from runjournal.producers import (
        ApprovalDeniedError,
        ApprovalStatus,
        CallStatus,
        DeliveryError,
        FatalProducerError,
        Journal,
        JournalError,
        LeaseLapsedError,
        NoRecoveryPlanError,
        Outcome,
        OutcomeNotDurableError,
        OutcomeUnknownError,
        PartitionCountChangedError,
        PlanMismatchError,
        ProducerFencedError,
        QueueFullError,
        Reconcilable,
        RecordedFailureError,
        RecoveryPlan,
        ResultUnavailableError,
        RunClosedError,
        RunExistsError,
        RunHandle,
        Tool,
        ToolOutcomeUnknownError,
        TopicNotFoundError,
        TransactionAbortedError,
        UnrecordableResultError,
        idempotency_key,
        partition_for,
    )
    from runjournal.schemas import Event, EventCodec, EventType, SchemaError


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'runjournal' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__

"""runjournal — the durable execution journal for AI agent runs, on Apache Kafka.

The public API an agent embeds (``AsyncJournal`` for asyncio, ``continue_run`` to take a run over,
``ContextManager`` to build a model's context, ``journaled`` for framework tools)::

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
from typing import TYPE_CHECKING, Any

__version__: str  # the installed version, read on first use: importing importlib.metadata takes tens of ms

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["ConfigError", "RunjournalError", "StackUnavailableError"], "runjournal.core.errors"),
    "Settings": "runjournal.core.settings",
    **dict.fromkeys(
        [
            "ApprovalDeniedError", "ApprovalStatus", "CallStatus", "CallVerdict", "DeliveryError", "FatalProducerError",
            "InvalidIdError", "Journal", "JournalError", "LeaseLapsedError", "NoRecoveryPlanError",
            "NonCanonicalValueError", "Outcome",
            "OutcomeNotDurableError", "OutcomeUnknownError", "PartitionCountChangedError", "PlanMismatchError",
            "ProducerFencedError", "QueueFullError", "RecordedFailureError", "Reconcilable", "RecoveryPlan",
            "ResultUnavailableError", "RunCancelledError", "RunClosedError", "RunExistsError", "RunHandle",
            "RunPausedError", "RunStoppedError", "RunTooLongError", "RunWaitingError", "SignalTimeoutError", "Tool",
            "ToolOutcomeUnknownError", "TopicNotFoundError", "TransactionAbortedError", "UnrecordableResultError",
            "idempotency_key", "partition_for", "stop_requested",
        ],
        "runjournal.producers",
    ),
    **dict.fromkeys(["AsyncJournal", "AsyncRunHandle"], "runjournal.producers.aio"),
    "ApprovalInbox": "runjournal.producers.approvals",
    **dict.fromkeys(["RunNotContinuableError", "continue_run"], "runjournal.consumers.recovery"),
    "ContextManager": "runjournal.consumers.context",
    **dict.fromkeys(["JournaledTool", "current_idempotency_key", "journaled"], "runjournal.adapters"),
    **dict.fromkeys(["Event", "EventCodec", "EventType", "SchemaError"], "runjournal.schemas"),
    **dict.fromkeys(["RunState", "RunStatus", "ExecutionRecord", "apply", "fold"], "runjournal.model"),
}

__all__ = [
    "ApprovalDeniedError",
    "ApprovalInbox",
    "ApprovalStatus",
    "AsyncJournal",
    "AsyncRunHandle",
    "CallStatus",
    "CallVerdict",
    "ConfigError",
    "ContextManager",
    "DeliveryError",
    "Event",
    "EventCodec",
    "EventType",
    "ExecutionRecord",
    "FatalProducerError",
    "InvalidIdError",
    "Journal",
    "JournalError",
    "JournaledTool",
    "LeaseLapsedError",
    "NoRecoveryPlanError",
    "NonCanonicalValueError",
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
    "RunCancelledError",
    "RunClosedError",
    "RunExistsError",
    "RunTooLongError",
    "RunHandle",
    "RunNotContinuableError",
    "RunPausedError",
    "RunState",
    "RunStatus",
    "RunStoppedError",
    "RunWaitingError",
    "RunjournalError",
    "SchemaError",
    "Settings",
    "SignalTimeoutError",
    "StackUnavailableError",
    "Tool",
    "ToolOutcomeUnknownError",
    "TopicNotFoundError",
    "TransactionAbortedError",
    "UnrecordableResultError",
    "__version__",
    "apply",
    "continue_run",
    "current_idempotency_key",
    "fold",
    "idempotency_key",
    "journaled",
    "partition_for",
    "stop_requested",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from runjournal.adapters import JournaledTool, current_idempotency_key, journaled
    from runjournal.consumers.context import ContextManager
    from runjournal.consumers.recovery import RunNotContinuableError, continue_run
    from runjournal.core.errors import ConfigError, RunjournalError
    from runjournal.core.settings import Settings
    from runjournal.model import ExecutionRecord, RunState, RunStatus, apply, fold
    from runjournal.producers import (
        ApprovalDeniedError,
        ApprovalStatus,
        CallStatus,
        CallVerdict,
        DeliveryError,
        FatalProducerError,
        InvalidIdError,
        Journal,
        JournalError,
        LeaseLapsedError,
        NonCanonicalValueError,
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
        RunCancelledError,
        RunClosedError,
        RunExistsError,
        RunHandle,
        RunPausedError,
        RunStoppedError,
        RunTooLongError,
        RunWaitingError,
        SignalTimeoutError,
        Tool,
        ToolOutcomeUnknownError,
        TopicNotFoundError,
        TransactionAbortedError,
        UnrecordableResultError,
        idempotency_key,
        partition_for,
        stop_requested,
    )
    from runjournal.producers.aio import AsyncJournal, AsyncRunHandle
    from runjournal.producers.approvals import ApprovalInbox
    from runjournal.schemas import Event, EventCodec, EventType, SchemaError


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("runjournal")
    except PackageNotFoundError:  # a checkout on sys.path without an install
        return "0.0.0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value: Any = _version()
    else:
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module 'runjournal' has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__

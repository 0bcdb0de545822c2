"""The public surface, pinned: ``__all__`` of ``runjournal`` and of every public subpackage and adapter module.

A name leaves the surface only through a deprecation (the old name kept as an alias for one release, see
CHANGELOG.md); a name is added here in the same commit that adds it. Moving a module behind a package — the
layout of ``docs/design/`` — changes nothing in this file: users import these names, never the files behind
them (as Temporal's SDK tests its export lists).
"""

from __future__ import annotations

import importlib
import inspect

import pytest

PINNED: dict[str, list[str]] = {
    "runjournal": [
        "ApprovalDeniedError", "ApprovalInbox", "ApprovalStatus", "AsyncJournal", "AsyncRunHandle", "CallStatus",
        "CallVerdict", "ConfigError", "ContextManager", "DeliveryError", "Event", "EventCodec", "EventType",
        "ExecutionRecord", "FatalProducerError", "InvalidIdError", "Journal", "JournalError", "JournaledTool",
        "LeaseLapsedError", "NoRecoveryPlanError", "NonCanonicalValueError", "Outcome", "OutcomeNotDurableError",
        "OutcomeUnknownError",
        "PartitionCountChangedError", "PlanMismatchError", "ProducerFencedError", "QueueFullError", "Reconcilable",
        "RecordedFailureError", "RecoveryPlan", "ResultUnavailableError", "RunCancelledError", "RunClosedError",
        "RunExistsError", "RunHandle", "RunNotContinuableError", "RunPausedError", "RunState", "RunStatus",
        "RunStoppedError", "RunTooLongError", "RunWaitingError", "RunjournalError", "SchemaError", "SignalTimeoutError",
        "Settings", "StackUnavailableError", "Tool", "ToolOutcomeUnknownError", "TopicNotFoundError",
        "TransactionAbortedError",
        "UnrecordableResultError", "__version__", "apply", "continue_run", "current_idempotency_key", "fold",
        "idempotency_key", "journaled", "partition_for", "stop_requested",
    ],
    "runjournal.adapters": [
        "FrameworkRecordStore", "GraphNodeJournal", "GraphSpendJournal", "JournalCheckpointSaver", "JournalRunHooks",
        "JournalRuns",
        "JournalSession", "JournaledTool", "ThreadNotOwnedError", "current_idempotency_key", "journal_function_tool",
        "journaled", "journaled_tool_node", "resume_agent", "run_agent",
    ],
    "runjournal.adapters.langgraph": ["GraphNodeJournal", "GraphSpendJournal", "JournalCheckpointSaver", "JournalRuns",
                                      "TaskStepError", "ThreadNotOwnedError", "journaled_tool_node"],
    "runjournal.adapters.openai_agents": ["JournalRunHooks", "JournalSession", "journal_function_tool",
                                          "resume_agent", "run_agent", "stream_agent"],
    "runjournal.cli": ["app", "main"],
    "runjournal.console": ["ConsoleConfig", "ConsoleData", "build_app"],
    "runjournal.consumers.cognition": ["CognitionOwner", "DISCOVERY_FILE", "KnowledgeReader", "MemoryReaderClient",
                                       "RemoteOwner", "open_memory_reader", "open_retriever", "read_discovery"],
    "runjournal.consumers.knowledge": ["DEFAULT_CORPUS", "DocumentError", "IngestReport", "KnowledgeError",
                                       "QdrantKnowledgeBase", "Section", "knowledge_collection", "passages",
                                       "split_markdown"],
    "runjournal.consumers.memory": [
        "AUTHORITY", "Draft", "Embedder", "EmbedderError", "EmbedderUnavailableError", "Evidence", "Extractor",
        "ExtractorStats", "IsolationError", "ItemKind", "MODEL_SHA256", "MemoryExtractor", "MemoryHit", "MemoryItem",
        "MemoryPlaneError", "MemoryReader", "MemoryStore", "MiniLMEmbedder", "ModelIntegrityError",
        "OwnerDroppedError", "Provenance", "QdrantMemoryStore", "Retriever", "RuleExtractor", "RunContext",
        "RunContexts", "Scope", "ScopeError", "Status", "StoreError", "StoreLockedError", "StoreUnavailableError",
        "StoreWriteError", "TOKENIZER_SHA256", "VectorSpaceError", "default_embedder", "memory_group",
        "scope_filter",
    ],
    "runjournal.consumers.projector": ["ApplyResult", "ProjectionStore", "Projector", "ProjectorStats",
                                       "partition_tag", "projector_group"],
    "runjournal.consumers.recovery": ["RunNotContinuableError", "continue_run"],
    "runjournal.model": [
        "ApprovalDecision", "CallStatus", "DUPLICATE_WINDOW", "Decision", "ExecutionRecord", "NodeState",
        "NodeStatus", "PendingApproval", "ReconciledOutcome", "ReducerError", "RunState", "RunStatus",
        "STATE_FORMAT_VERSION", "StateFormatError", "UnknownCallError", "WrongRunError", "apply", "block", "fold",
        "mark_outcome_unknown", "state_digest", "unsettled_calls",
    ],
    "runjournal.producers": [
        "ApprovalDeniedError", "ApprovalStatus", "CallStatus", "CallVerdict", "ControlRequest", "DeliveryError",
        "FatalProducerError", "InvalidIdError", "Journal", "JournalError", "LeaseLapsedError", "NoRecoveryPlanError",
        "NonCanonicalValueError", "Outcome", "OutcomeNotDurableError", "OutcomeUnknownError",
        "PartitionCountChangedError", "PlanMismatchError", "PlanStore", "PlannedCall",
        "ProducerFencedError", "QueueFullError", "Reconcilable", "RecordedFailureError", "RecoveryPlan",
        "ResultStore", "ResultUnavailableError", "RunCancelledError", "RunClosedError", "RunExistsError", "RunHandle",
        "RunPausedError", "RunStoppedError", "RunSurrenderedError", "RunTooLongError", "RunWaitingError",
        "SignalTimeoutError",
        "StackUnavailableError", "Tool",
        "ToolOutcomeUnknownError", "TopicNotFoundError", "TransactionAbortedError", "UnrecordableResultError",
        "canonical_json", "canonical_value", "current_traceparent", "digest", "enter_node", "fence_producer",
        "idempotency_key",
        "partition_for", "stop_requested", "transactional_id", "use_traceparent", "valid_traceparent",
    ],
    "runjournal.producers.aio": ["AsyncJournal", "AsyncRunHandle"],
    "runjournal.schemas": [
        "CONTROL_FLOW_TYPES", "CorruptEventError", "DEFAULT_MAX_EVENT_BYTES", "DURABLE_TYPES", "DecodeError",
        "Event", "EventCodec", "EventTooLargeError", "EventType", "InvalidEventError", "KNOWN_TYPES",
        "NaiveDatetimeError", "PAYLOAD_FIELDS", "RegistryError", "SchemaError", "SchemaVersion", "TombstoneError",
        "UnregisteredSchemaError", "UnsupportedSchemaError", "codec_from_settings", "current_version",
        "is_tombstone", "load_versions", "new_event_id", "utcnow",
    ],
    "runjournal.stores": [
        "AUTHORITY", "Authority", "Checkpoint", "CheckpointStore", "EventPosition", "EventStore", "Evidence",
        "ExecutionRecordStore", "ItemKind", "KnowledgeScope", "MemoryHit", "MemoryItem", "MemoryReader",
        "MemoryStore", "Plane", "PlaneError", "Provenance", "ProvenanceError", "ReadOnlyError", "Retriever", "Scope",
        "ScopeError", "StateStore", "Status", "StoreContractError", "StoredEvent", "require_plane",
    ],
}
"""Module → its ``__all__``, sorted. Edited only with a CHANGELOG.md entry."""

FACADE_HOMES = {
    "AsyncJournal": "runjournal.producers.aio", "AsyncRunHandle": "runjournal.producers.aio",
    "ContextManager": "runjournal.consumers.context", "continue_run": "runjournal.consumers.recovery",
    "RunNotContinuableError": "runjournal.consumers.recovery", "JournaledTool": "runjournal.adapters",
    "journaled": "runjournal.adapters", "current_idempotency_key": "runjournal.adapters",
    "Journal": "runjournal.producers", "RunHandle": "runjournal.producers", "CallVerdict": "runjournal.producers",
    "RunState": "runjournal.model", "Event": "runjournal.schemas", "Settings": "runjournal.core.settings",
}
"""Facade names and the public package each is re-exported from (the same object)."""


@pytest.mark.parametrize("module", sorted(PINNED))
def test_all_is_pinned_and_every_name_resolves(module: str) -> None:
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == sorted(PINNED[module])
    for name in mod.__all__:
        assert getattr(mod, name) is not None, f"{module}.{name}"


@pytest.mark.parametrize("name", sorted(FACADE_HOMES))
def test_facade_names_are_the_public_packages_objects(name: str) -> None:
    import runjournal

    assert getattr(runjournal, name) is getattr(importlib.import_module(FACADE_HOMES[name]), name)


def test_the_plan_verdict_and_the_record_status_are_distinct_names() -> None:
    """``CallVerdict`` (how recovery classified a call) is not the record's ``runjournal.model.CallStatus``; the
    producers' ``CallStatus`` is the verdict's deprecated alias, kept for one release."""
    import runjournal
    from runjournal import model, producers

    assert runjournal.CallVerdict is producers.CallVerdict
    assert producers.CallStatus is producers.CallVerdict
    assert model.CallStatus is not producers.CallVerdict
    assert inspect.isclass(producers.CallVerdict) and producers.CallVerdict.__name__ == "CallVerdict"


def test_the_one_line_imports_the_docs_promise() -> None:
    from runjournal import AsyncJournal, ContextManager, continue_run  # noqa: F401

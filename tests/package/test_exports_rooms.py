"""The surfaces of the rooms the layout issue created (consumers' runtime, ops, vectors, context; the testing kit),
pinned like the older packages' in test_exports.py (that file is kept unchanged across the layout change)."""

from __future__ import annotations

import importlib

import pytest

PINNED: dict[str, list[str]] = {
    "runjournal.consumers.runtime": [
        "DeadLetterError", "DeadLetters", "DependencyUnavailableError", "FailurePolicy", "FatalDependencyError",
        "StackUnavailableError", "TopicMismatchError", "TopicShape", "Verdict", "classify", "commit_pending",
        "events_partition_count", "partition_lags", "preflight", "read_ranges", "run_partition", "stops_consumer",
        "watermarks",
    ],
    "runjournal.consumers.ops": [
        "AgentReplay", "ApprovalRefusedError", "EraseError", "EraseReport", "ReplayDivergedError",
        "ReplayEndReachedError", "RunStillLiveError", "erase_run", "inspect_run", "read_run_events", "replay_run",
        "replay_state", "submit_decision",
    ],
    "runjournal.consumers.vectors": [
        "Embedder", "EmbedderError", "EmbedderUnavailableError", "IsolationError", "MODEL_SHA256", "MemoryPlaneError",
        "MiniLMEmbedder", "ModelIntegrityError", "OwnerDroppedError", "ScopeError", "SerialClient", "StoreError",
        "StoreLockedError", "StoreUnavailableError", "StoreWriteError", "TOKENIZER_SHA256", "VectorSpaceError",
        "default_embedder", "iso", "mapped", "open_client",
    ],
    "runjournal.consumers.context": ["ADVISORY_LABEL", "AdvisoryItem", "CallFact", "Context", "ContextManager",
                                     "ExecutionFacts"],
    "runjournal.schemas.keys": ["EventKey", "KeyFormatError", "event_key", "parse_event_key", "partition_for",
                                "run_id_of_key"],
    "runjournal.testing": ["EventStoreContract", "FoldingRunStore", "HashingEmbedder", "InMemoryEventStore",
                           "RunStoreContract", "contract_runs"],
}


@pytest.mark.parametrize("module", sorted(PINNED))
def test_all_is_pinned_and_every_name_resolves(module: str) -> None:
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == sorted(PINNED[module])
    for name in mod.__all__:
        assert getattr(mod, name) is not None, f"{module}.{name}"


def test_the_memory_plane_reexports_what_moved_to_its_ground() -> None:
    """memory's pinned names that now live in vectors (embedder, errors) are the same objects."""
    from runjournal.consumers import memory, vectors

    for name in ("Embedder", "MiniLMEmbedder", "default_embedder", "StoreError", "MemoryPlaneError"):
        assert getattr(memory, name) is getattr(vectors, name)

"""The design's six stores as named contracts, and the shapes that cross them.

:mod:`runjournal.stores.contracts` holds the Protocols (:class:`EventStore`, :class:`StateStore`,
:class:`ExecutionRecordStore`, :class:`CheckpointStore`, :class:`MemoryStore`, :class:`Retriever`), each
documented with the scope, consistency, mutability and authority rules it enforces. Implementations live in
``runjournal.consumers`` (execution stores, memory, knowledge). This package imports only the run model,
the event contract and the ground, so recovery and the execution stores may name every contract without
importing memory or knowledge (import-linter checks it).
"""

from runjournal.stores._cognition import (
    AUTHORITY,
    Evidence,
    ItemKind,
    KnowledgeScope,
    MemoryHit,
    MemoryItem,
    Provenance,
    Scope,
    Status,
)
from runjournal.stores._execution import Checkpoint, EventPosition, StoredEvent
from runjournal.stores.contracts import (
    Authority,
    CheckpointStore,
    EventStore,
    ExecutionRecordStore,
    MemoryReader,
    MemoryStore,
    Plane,
    Retriever,
    StateStore,
    require_plane,
)
from runjournal.stores.errors import PlaneError, ProvenanceError, ReadOnlyError, ScopeError, StoreContractError

__all__ = [
    "AUTHORITY",
    "Authority",
    "Checkpoint",
    "CheckpointStore",
    "EventPosition",
    "EventStore",
    "Evidence",
    "ExecutionRecordStore",
    "ItemKind",
    "KnowledgeScope",
    "MemoryHit",
    "MemoryItem",
    "MemoryReader",
    "MemoryStore",
    "Plane",
    "PlaneError",
    "Provenance",
    "ProvenanceError",
    "ReadOnlyError",
    "Retriever",
    "Scope",
    "ScopeError",
    "Status",
    "StateStore",
    "StoredEvent",
    "StoreContractError",
    "require_plane",
]

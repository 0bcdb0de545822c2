"""Memory extraction: events -> advisory long-term memory in Qdrant, off the critical path.

Memory tells the model what it may *know* (preferences, corrections, how prior runs ended). It is
never an execution fact: nothing here reads or exposes run state, and ``runjournal.consumers.recovery`` may
not import this package (import-linter contract). Every point is ``authority: "advisory"``.

Public API:

* :class:`MemoryExtractor` (``runjournal memory-extractor``): the consumer-group service;
  :func:`memory_group`, :class:`ExtractorStats`.
* :class:`MemoryStore` (port) and :class:`QdrantMemoryStore` (adapter): ``upsert``, ``search``,
  ``delete_by_run``; :class:`MemoryReader` (its read half); :class:`Retriever` and :class:`Evidence`
  (implemented in ``runjournal.consumers.knowledge``).
* :class:`Extractor` (port), :class:`RuleExtractor` (default rules), :class:`Draft`, :class:`RunContext`.
* :class:`Embedder` (port), :class:`MiniLMEmbedder` (default, int8 ONNX, 384-d), :func:`default_embedder`.
* :class:`Scope`, :class:`MemoryItem`, :class:`Provenance`, :class:`MemoryHit`, :class:`ItemKind`,
  :class:`Status`; :func:`scope_filter` (the one filter builder).
* Errors: :class:`MemoryPlaneError` and subclasses.
"""

from __future__ import annotations

import importlib
from typing import Any

# Exports resolve lazily (PEP 562): ``runjournal --help`` and the other commands must not pay for
# importing qdrant-client, onnxruntime and numpy (~1.5 s) unless memory is actually used.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["MODEL_SHA256", "TOKENIZER_SHA256", "Embedder", "MiniLMEmbedder", "default_embedder"],
                    "runjournal.consumers.vectors.embed"),
    **dict.fromkeys(["EmbedderError", "EmbedderUnavailableError", "IsolationError", "MemoryPlaneError",
                     "ModelIntegrityError", "OwnerDroppedError", "ScopeError", "StoreError", "StoreLockedError",
                     "StoreUnavailableError", "StoreWriteError", "VectorSpaceError"],
                    "runjournal.consumers.vectors.errors"),
    **dict.fromkeys(["Draft", "Extractor", "RuleExtractor", "RunContext", "RunContexts"],
                    "runjournal.consumers.memory.extract"),
    "scope_filter": "runjournal.consumers.memory.filters",
    **dict.fromkeys(["AUTHORITY", "ItemKind", "MemoryHit", "MemoryItem", "Provenance", "Scope", "Status"],
                    "runjournal.consumers.memory.items"),
    **dict.fromkeys(["Evidence", "MemoryReader", "MemoryStore", "Retriever"], "runjournal.consumers.memory.ports"),
    **dict.fromkeys(["ExtractorStats", "MemoryExtractor", "memory_group"], "runjournal.consumers.memory.service"),
    "QdrantMemoryStore": "runjournal.consumers.memory.store",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'runjournal.consumers.memory' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "AUTHORITY",
    "MODEL_SHA256",
    "TOKENIZER_SHA256",
    "Draft",
    "Embedder",
    "EmbedderError",
    "EmbedderUnavailableError",
    "Evidence",
    "Extractor",
    "ExtractorStats",
    "IsolationError",
    "ItemKind",
    "MemoryExtractor",
    "MemoryHit",
    "MemoryItem",
    "MemoryPlaneError",
    "MemoryReader",
    "MemoryStore",
    "MiniLMEmbedder",
    "ModelIntegrityError",
    "OwnerDroppedError",
    "Provenance",
    "QdrantMemoryStore",
    "Retriever",
    "RuleExtractor",
    "RunContext",
    "RunContexts",
    "Scope",
    "ScopeError",
    "Status",
    "StoreError",
    "StoreLockedError",
    "StoreUnavailableError",
    "StoreWriteError",
    "VectorSpaceError",
    "default_embedder",
    "memory_group",
    "scope_filter",
]

"""Knowledge: a shared corpus of external documents, served as ranked evidence with provenance.

The :class:`~runjournal.stores.Retriever` of the design. Knowledge is *advisory* like memory but a
different contract: it comes from documents (not from the journal), holds no tenant-private data, is
read-only at query time (only ``runjournal knowledge ingest`` writes it) and never writes memory. It
never states what a run has done.

Public API: :class:`QdrantKnowledgeBase` (``retrieve``, ``ingest``, ``stats``), :class:`IngestReport`,
:func:`split_markdown`, :class:`Section`, :class:`DocumentError`.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["DocumentError", "KnowledgeError"], "runjournal.consumers.knowledge.errors"),
    **dict.fromkeys(["Section", "passages", "split_markdown"], "runjournal.consumers.knowledge.sections"),
    **dict.fromkeys(["DEFAULT_CORPUS", "IngestReport", "QdrantKnowledgeBase", "knowledge_collection"],
                    "runjournal.consumers.knowledge.store"),
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'runjournal.consumers.knowledge' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = ["DEFAULT_CORPUS", "DocumentError", "IngestReport", "KnowledgeError", "QdrantKnowledgeBase", "Section",
           "knowledge_collection", "passages", "split_markdown"]

"""Ports of the cognition plane, re-exported from the named store contracts (:mod:`runjournal.stores`):
:class:`MemoryStore` (learned cross-run guidance, implemented by
:class:`~runjournal.consumers.memory.store.QdrantMemoryStore`), :class:`MemoryReader` (its read half) and
:class:`Retriever` (external knowledge evidence, implemented in ``runjournal.consumers.knowledge``).
Neither says anything about execution state — what a run *has done* comes from the execution stores only.
"""

from __future__ import annotations

from runjournal.stores import Evidence, MemoryReader, MemoryStore, Retriever

__all__ = ["Evidence", "MemoryReader", "MemoryStore", "Retriever"]

"""Ports of the cognition plane: :class:`MemoryStore` (learned cross-run guidance) and
:class:`Retriever` (external knowledge evidence). Two interfaces, deliberately: memory is what the
agent learned from its own journal; retrieval is evidence from outside. Neither says anything about
execution state — what a run *has done* comes from the journal's execution records only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from runjournal.consumers.memory.items import MemoryHit, MemoryItem, Scope

__all__ = ["Evidence", "MemoryStore", "Retriever"]


@runtime_checkable
class MemoryStore(Protocol):
    """Advisory long-term memory, scoped by tenant.

    Implementation: :class:`~runjournal.consumers.memory.store.QdrantMemoryStore`.
    """

    def upsert(self, items: Sequence[MemoryItem], vectors: np.ndarray | None = None) -> int:
        """Write ``items`` idempotently (ids derive from event id and item index) and settle supersession.

        Args:
            items: items to write; each needs a Scope with a tenant.
            vectors: ``(len(items), dimension)`` unit vectors, or None to embed ``item.text`` here.

        Returns:
            The number of points written.

        Raises:
            ScopeError: an item has no valid Scope.
            StoreUnavailableError: the store is unreachable (retryable).
            StoreWriteError, VectorSpaceError, EmbedderError: the write cannot succeed as is.
        """
        ...

    def search(self, scope: Scope, query: str, *, limit: int = 10, all_statuses: bool = False,
               where: Mapping[str, str] | None = None) -> list[MemoryHit]:
        """The ``limit`` items of ``scope`` nearest to ``query``, best first (active only unless ``all_statuses``).

        Raises:
            ScopeError: ``scope`` is not a Scope, or ``where`` names an identity key.
            StoreUnavailableError: the store is unreachable.
        """
        ...

    def delete_by_run(self, run_id: str) -> int:
        """Erase every item extracted from run ``run_id``, in every tenant (an admin operation).

        Returns:
            The number of points deleted.
        """
        ...


@dataclass(frozen=True, slots=True)
class Evidence:
    """One piece of external knowledge returned by a :class:`Retriever`."""

    text: str
    """The passage."""
    source: str
    """Where it comes from (URI or document id)."""
    score: float
    """Relevance to the query, higher is better (scale is the retriever's own)."""


@runtime_checkable
class Retriever(Protocol):
    """External knowledge evidence (documents, wikis, APIs): interface only; no implementation ships.

    Advisory, like memory: evidence may inform the model, it never states what a run has done.
    """

    def retrieve(self, scope: Scope, query: str, *, limit: int = 5) -> list[Evidence]:
        """Up to ``limit`` passages relevant to ``query`` that ``scope``'s tenant may see, best first."""
        ...

"""Named errors of the knowledge plane (``runjournal.consumers.knowledge``).

Qdrant failures reuse the store errors of :mod:`runjournal.consumers.vectors.errors` (``StoreUnavailableError``
is retryable, ``StoreWriteError`` is not); contract violations are :mod:`runjournal.stores.errors`
(``ProvenanceError``, ``PlaneError``, ``ScopeError``).
"""

from __future__ import annotations

from runjournal.core.errors import RunjournalError

__all__ = ["DocumentError", "KnowledgeError"]


class KnowledgeError(RunjournalError):
    """Base of the knowledge plane's own errors."""


class DocumentError(KnowledgeError, ValueError):
    """A document cannot be ingested: missing, unreadable, not UTF-8, or holding no section with text."""

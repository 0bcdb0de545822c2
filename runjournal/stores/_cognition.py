"""Shapes crossing the cognition stores' boundaries: memory scope, items and hits; knowledge scope and evidence.

Nothing here does I/O. Both kinds are *advisory*: memory is guidance learned from the journal (a stated
preference, a correction, how a prior run ended); knowledge is evidence from outside documents. Neither
is ever an execution fact — what a run has done is read from the execution stores only (docs/design/protocol.md).
These shapes live beside the store contracts (not in ``consumers.memory`` / ``consumers.knowledge``) so
that recovery and the execution stores can name the contracts without importing either plane's code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from runjournal.stores.errors import ScopeError

__all__ = ["AUTHORITY", "Evidence", "ItemKind", "KnowledgeScope", "MemoryHit", "MemoryItem", "Provenance", "Scope",
           "Status"]

#: Every memory point's and every evidence's ``authority``: it informs the model; it never decides what a run has done.
AUTHORITY = "advisory"


class ItemKind(StrEnum):
    """What a memory item says."""

    PREFERENCE = "preference"
    """The user likes or wants something ("I prefer window seats")."""
    CONSTRAINT = "constraint"
    """The user rules something in or out ("never book red-eye flights", "I don't want …")."""
    FACT = "fact"
    """Something about the user ("my home airport is SFO")."""
    CORRECTION = "correction"
    """A USER_CORRECTION event: the user corrected the agent on ``subject``."""
    RUN_OUTCOME = "run_outcome"
    """How a prior run of an agent ended (advisory lesson, not the run's state)."""


class Status(StrEnum):
    """Whether a memory item (or a knowledge section) is current."""

    ACTIVE = "active"
    SUPERSEDED = "superseded"


@dataclass(frozen=True, slots=True)
class Scope:
    """Who a memory item belongs to (its owner) and who may find it. The only input from which memory
    search and write filters are built.

    Raises:
        ScopeError: ``tenant_id`` is empty or not a string; ``user_id`` / ``agent_id`` is an empty string.
    """

    tenant_id: str
    """Owning tenant; required and non-empty. One tenant never sees another's memory."""
    user_id: str | None = None
    """The user the item is about; None: not narrowed by user (on a search) / no user (on an item)."""
    agent_id: str | None = None
    """The agent the item came from; None: not narrowed by agent (search) / unknown (item)."""

    def __post_init__(self) -> None:
        if not isinstance(self.tenant_id, str) or not self.tenant_id.strip():
            raise ScopeError(f"a memory scope needs a non-empty tenant_id (got {self.tenant_id!r})")
        for name in ("user_id", "agent_id"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ScopeError(f"{name} must be None or a non-empty string (got {value!r})")

    def as_payload(self) -> dict[str, str | None]:
        """``{"tenant_id", "user_id", "agent_id"}`` as stored in a point's ``scope``."""
        return {"tenant_id": self.tenant_id, "user_id": self.user_id, "agent_id": self.agent_id}


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a memory item came from: the journal record it was extracted from."""

    run_id: str
    """The run whose event produced the item (``delete_by_run`` erases by it)."""
    event_id: str
    """The source event's id (the point id derives from it)."""
    event_type: str
    """The source event's type (``MESSAGE``, ``USER_CORRECTION``, ``RUN_SUCCEEDED`` …)."""
    topic: str
    """Source topic."""
    partition: int
    """Source partition."""
    offset: int
    """Source offset."""
    schema: str
    """Writer schema of the record: ``avro-so:<crc64 hex>`` or ``registry:<schema id>``."""
    extractor: str
    """Extractor name and version, e.g. ``rules@1``."""
    item_index: int = 0
    """Index of the item among those extracted from the same event (0-based)."""
    event_key: str | None = None
    """The record key ``{run_id}:{epoch}:{seq}`` (a tombstone on it erases the item)."""


@dataclass(frozen=True, slots=True)
class MemoryItem:
    """One piece of advisory memory, before embedding."""

    text: str
    """What is remembered, in plain language (this is what gets embedded)."""
    kind: ItemKind
    """What sort of statement it is."""
    subject: str | None
    """Conflict key within a scope (``seat_preference``): a newer item on the same subject, tenant and
    user supersedes the older. None: never conflicts (run outcomes)."""
    scope: Scope
    """Owner; the tenant comes from the event envelope, never from the text or metadata."""
    provenance: Provenance
    """The journal record it came from."""
    created_at: datetime
    """When it was said: the source event's ``occurred_at`` (aware UTC)."""
    metadata: Mapping[str, str] = field(default_factory=dict)
    """Free extra strings, stored under the payload's ``metadata`` key; they can never override
    scope, status or provenance (those are separate payload keys)."""


@dataclass(frozen=True, slots=True)
class MemoryHit:
    """One memory search result."""

    id: str
    """Point id (uuid5 of event id and item index)."""
    score: float
    """Cosine similarity to the query, in [-1, 1] (higher is closer)."""
    text: str
    """The item's text."""
    kind: str
    """:class:`ItemKind` value."""
    subject: str | None
    """Conflict key, if any."""
    status: str
    """:class:`Status` value."""
    scope: dict[str, str | None]
    """``tenant_id``, ``user_id``, ``agent_id``."""
    provenance: dict[str, Any]
    """``run_id``, ``event_id``, ``topic``, ``partition``, ``offset``, ``schema``, ``extractor``,
    ``embedder_id``, ``dimension`` …"""
    freshness: dict[str, str | None]
    """``created_at`` and ``valid_until`` (ISO-8601 UTC, ms; valid_until None while active)."""
    superseded_by: str | None
    """Id of the item that superseded this one, if any."""
    authority: str = AUTHORITY
    """Always ``advisory``."""
    encrypted: str | None = None
    """None when :attr:`text` is the item's text; else the item is sealed (decision 0059) and this reader could
    not open it: :attr:`text` is ``encrypted`` and this names why (``KeyDestroyedError`` after ``runjournal erase
    --tenant T --subject U``, ``UnknownKeyError``, ``NoKeyGrant`` for a reader that holds no key …)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-able dict of every field (for ``--json`` output and the read API)."""
        return {"id": self.id, "score": round(self.score, 6), "text": self.text, "kind": self.kind,
                "subject": self.subject, "status": self.status, "scope": self.scope,
                "provenance": self.provenance, "freshness": self.freshness,
                "superseded_by": self.superseded_by, "authority": self.authority, "encrypted": self.encrypted}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryHit:
        """The inverse of :meth:`as_dict` (for readers over the HTTP API)."""
        return cls(id=str(data["id"]), score=float(data["score"]), text=data["text"], kind=data["kind"],
                   subject=data.get("subject"), status=data["status"], scope=dict(data["scope"]),
                   provenance=dict(data["provenance"]), freshness=dict(data["freshness"]),
                   superseded_by=data.get("superseded_by"), authority=data.get("authority", AUTHORITY),
                   encrypted=data.get("encrypted"))


@dataclass(frozen=True, slots=True)
class KnowledgeScope:
    """Which part of the shared knowledge corpus to search. Knowledge is never tenant-scoped: it holds
    no tenant-private data, so every tenant may read all of it; a scope only narrows by corpus/document.

    Raises:
        ScopeError: ``corpus`` is an empty string, or a memory :class:`Scope` was given instead.
    """

    corpus: str | None = None
    """Corpus name given at ingest (``runjournal knowledge ingest --corpus``); None: every corpus."""
    document: str | None = None
    """One document's path (as stored in provenance); None: every document."""

    def __post_init__(self) -> None:
        for name in ("corpus", "document"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ScopeError(f"{name} must be None or a non-empty string (got {value!r})")


@dataclass(frozen=True, slots=True)
class Evidence:
    """One ranked piece of knowledge evidence, with its provenance (all fields required: evidence
    without provenance is refused, :class:`~runjournal.stores.errors.ProvenanceError`)."""

    text: str
    """The best-matching passage of the section."""
    score: float
    """Cosine similarity of that passage to the query, in [-1, 1] (higher is closer)."""
    section: str
    """The section's heading (``Book flight``)."""
    heading_path: tuple[str, ...]
    """Headings from the document's top down to the section (``("Airline Agent Policy", "Book flight")``)."""
    path: str
    """The document's path as ingested (absolute)."""
    content_sha256: str
    """sha256 (hex) of the section's text as ingested: the exact content this evidence quotes."""
    document_version: str
    """``sha256:<first 16 hex>`` of the whole document as ingested."""
    ingested_at: str
    """When this section content was first ingested (ISO-8601 UTC, ms)."""
    corpus: str
    """The corpus it belongs to."""
    section_text: str = ""
    """The whole section (Markdown, without its heading line)."""
    authority: str = AUTHORITY
    """Always ``advisory``."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-able dict of every field."""
        return {"text": self.text, "score": round(self.score, 6), "section": self.section,
                "heading_path": list(self.heading_path), "path": self.path, "content_sha256": self.content_sha256,
                "document_version": self.document_version, "ingested_at": self.ingested_at, "corpus": self.corpus,
                "section_text": self.section_text, "authority": self.authority}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Evidence:
        """The inverse of :meth:`as_dict`."""
        return cls(text=data["text"], score=float(data["score"]), section=data["section"],
                   heading_path=tuple(data["heading_path"]), path=data["path"],
                   content_sha256=data["content_sha256"], document_version=data["document_version"],
                   ingested_at=data["ingested_at"], corpus=data["corpus"], section_text=data.get("section_text", ""),
                   authority=data.get("authority", AUTHORITY))

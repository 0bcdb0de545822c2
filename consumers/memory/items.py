"""The shapes of the memory plane: scope, memory items, provenance, search hits.

Nothing here does I/O. A memory item is *advisory* guidance learned from the journal (a stated
preference, a correction, how a prior run ended). It is never an execution fact: what a run has
done is read from the journal's execution records, never from here (DESIGN.md § Memory).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from runjournal.consumers.memory.errors import ScopeError

__all__ = ["AUTHORITY", "ItemKind", "MemoryHit", "MemoryItem", "Provenance", "Scope", "Status", "slug"]

#: Every point's ``authority``: memory informs the model; it never decides what a run has done.
AUTHORITY = "advisory"


class ItemKind(StrEnum):
    """What an item says."""

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
    """Whether an item is current guidance."""

    ACTIVE = "active"
    SUPERSEDED = "superseded"


@dataclass(frozen=True, slots=True)
class Scope:
    """Who an item belongs to and who may find it. The only input from which search and write
    filters are built (:func:`runjournal.consumers.memory.filters.scope_filter`).

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
    """Where an item came from: the journal record it was extracted from."""

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
    """One search result."""

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

    def as_dict(self) -> dict[str, Any]:
        """JSON-able dict of every field (for ``--json`` output)."""
        return {"id": self.id, "score": round(self.score, 6), "text": self.text, "kind": self.kind,
                "subject": self.subject, "status": self.status, "scope": self.scope,
                "provenance": self.provenance, "freshness": self.freshness,
                "superseded_by": self.superseded_by, "authority": self.authority}


_NON_WORD = re.compile(r"[^a-z0-9]+")


def slug(text: str, *, max_words: int = 4) -> str:
    """Lower-case ``text``, keep runs of ``[a-z0-9]`` joined by ``_``, at most ``max_words`` of them.

    ``"Seat Preference!"`` → ``"seat_preference"``. Empty when nothing is left.
    """
    words = [w for w in _NON_WORD.split(text.lower()) if w]
    return "_".join(words[:max_words])

"""The shapes of the memory plane: scope, memory items, provenance, search hits.

They are defined beside the store contracts, in :mod:`runjournal.stores` (so recovery and the execution
stores can name the contracts without importing this package), and re-exported here. A memory item is
*advisory* guidance learned from the journal (a stated preference, a correction, how a prior run ended).
It is never an execution fact: what a run has done is read from the journal's execution records, never
from here (docs/design/protocol.md § Memory).
"""

from __future__ import annotations

import re

from runjournal.stores import AUTHORITY, ItemKind, MemoryHit, MemoryItem, Provenance, Scope, Status

__all__ = ["AUTHORITY", "ItemKind", "MemoryHit", "MemoryItem", "Provenance", "Scope", "Status", "slug"]

_NON_WORD = re.compile(r"[^a-z0-9]+")


def slug(text: str, *, max_words: int = 4) -> str:
    """Lower-case ``text``, keep runs of ``[a-z0-9]`` joined by ``_``, at most ``max_words`` of them.

    ``"Seat Preference!"`` → ``"seat_preference"``. Empty when nothing is left.
    """
    words = [w for w in _NON_WORD.split(text.lower()) if w]
    return "_".join(words[:max_words])

"""Canonical JSON, digests and the idempotency key (pure functions, no I/O)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["canonical_json", "digest", "idempotency_key"]

#: Length of an idempotency key, hex characters (128 bits of sha256).
KEY_HEX_CHARS = 32


def canonical_json(value: Any) -> str:
    """``value`` as canonical JSON text: sorted keys, no whitespace, UTF-8 kept (not ``\\u`` escaped).

    A value JSON cannot represent (a datetime, a set, an object) is written as its ``repr`` string,
    so the fact that a tool returned *something* is never lost; a resumed run reads back that JSON.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr)


def digest(text: str) -> str:
    """``sha256`` hex (64 chars) of ``text`` encoded UTF-8."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def enter_node(entries: dict[str, dict[str, int]], parent: str, name: str) -> str:
    """The path of the next node ``name`` entered under ``parent`` (``""`` at the top), counting entries.

    The rule behind every idempotency key, shared by ``RunHandle`` and replay so both derive the
    same paths: ``outer/inner``; the k-th entry (k >= 2) of one name under one parent is ``name#k``.
    ``entries`` (parent -> name -> count) is updated in place.

    Raises:
        ValueError: ``name`` is empty or holds ``/`` or ``#`` (they build paths).
    """
    if not name or "/" in name or "#" in name:
        raise ValueError(f"node name must be non-empty without '/' or '#': {name!r}")
    counts = entries.setdefault(parent, {})
    counts[name] = counts.get(name, 0) + 1
    segment = name if counts[name] == 1 else f"{name}#{counts[name]}"
    return f"{parent}/{segment}" if parent else segment


def idempotency_key(run_id: str, node_path: str, call_index: int) -> str:
    """The idempotency key of the ``call_index``-th call (1-based) at ``node_path`` of ``run_id``.

    DESIGN.md § The side-effect protocol, step 1: derived only from (run_id, node path, call
    index), so every resume that reaches the same step derives the same key. Returns the first
    32 hex chars of sha256 over the three parts joined by a unit separator (``\\x1f``), so
    ``("a/b", 1)`` and ``("a", "b/1")``-like splits cannot collide.
    """
    if call_index < 1:
        raise ValueError(f"call_index is 1-based, got {call_index}")
    raw = f"runjournal.call.v1\x1f{run_id}\x1f{node_path}\x1f{call_index}"
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:KEY_HEX_CHARS]

"""The record key format of ``{prefix}.checkpoints`` (``Settings.checkpoints_topic``), shared by its writer and erase.

The framework adapters (``runjournal.adapters._checkpoints``) write every LangGraph checkpoint, channel blob,
pending write and Agents SDK session item as a record keyed ``<thread_id><SEP><kind><SEP><field>`` on the thread's
partition (murmur2(thread_id) mod the events topic's partition count: a thread is a run, ``run_id = thread_id``).
``runjournal erase`` (``runjournal.consumers.erase``) tombstones a run's records by the same key format; it lives
here, below both, because consumers may not import the adapters (import-linter layers).
"""

from __future__ import annotations

__all__ = ["KINDS", "SEP", "record_key", "thread_key_prefix"]

SEP = "\x1f"
"""Separator of a record key's parts and of a field's parts (ASCII unit separator: never in an id)."""
KINDS = ("cp", "blob", "w", "item", "state")
"""Record kinds: a checkpoint, a channel blob, a pending write, a session item, a paused ``RunState``."""


def record_key(thread_id: str, kind: str, field: str) -> str:
    """``<thread_id><SEP><kind><SEP><field>`` — the Kafka record key of one projected entry."""
    return f"{thread_id}{SEP}{kind}{SEP}{field}"


def thread_key_prefix(thread_id: str) -> bytes:
    """``<thread_id><SEP>`` as bytes: every record key of ``thread_id`` starts with it (and no other thread's)."""
    return f"{thread_id}{SEP}".encode()

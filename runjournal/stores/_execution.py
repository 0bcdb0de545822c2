"""Shapes crossing the execution stores' boundaries: stored events, their positions, checkpoints.

Offsets are Kafka partition offsets of ``{prefix}.events``; the state inside is the run model's
:class:`~runjournal.model.RunState` (execution records included).
"""

from __future__ import annotations

from dataclasses import dataclass

from runjournal.model import RunState
from runjournal.schemas.events import Event

__all__ = ["Checkpoint", "EventPosition", "StoredEvent"]


@dataclass(frozen=True, slots=True)
class EventPosition:
    """Where an appended event landed."""

    partition: int
    """Partition of ``{prefix}.events`` (murmur2 of the run id)."""
    offset: int
    """Offset in that partition."""


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One record of the events topic as read back."""

    partition: int
    """Its partition."""
    offset: int
    """Its offset."""
    key: str
    """The record key ``{run_id}:{epoch}:{seq}``."""
    event: Event | None
    """The decoded event; None for a tombstone (an erased event) or an undecodable record."""
    error: str | None = None
    """Why ``event`` is None when the record is not a tombstone (the decoder's message)."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A run's state snapshot plus the position and pending metadata it covers (where replay may start)."""

    run_id: str
    """The run."""
    state: RunState
    """The folded state at ``offset`` (execution records included)."""
    partition: int
    """The run's partition."""
    offset: int
    """The last offset of ``partition`` folded into ``state``: replay of this run resumes at ``offset + 1``."""
    partition_offset: int
    """The partition's applied offset when the checkpoint was read (≥ ``offset``): every record of the
    partition at or below it is reflected in the projection, this run's included."""
    pending_approvals: tuple[str, ...]
    """call_ids awaiting a human decision at ``offset``."""
    unsettled_calls: tuple[str, ...]
    """call_ids INTENDED or OUTCOME_UNKNOWN at ``offset`` (recovery must classify them, never skip them)."""

"""The shapes replay produces: a run's state as of a seq and the records folded (private; re-exported by
:mod:`runjournal.consumers.ops.replay`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TypedDict

from runjournal.model.reducer import RunState
from runjournal.schemas import Event

__all__ = ["ReplayedState", "TimelineRow"]


class TimelineRow(TypedDict, total=False):
    """One record of the run as replay folded it."""

    offset: int
    """Its offset in the run's partition."""
    key: str
    """Record key ``{run_id}:{epoch}:{seq}``."""
    seq: int | None
    """Event seq (None for a tombstone or an undecodable record)."""
    epoch: int | None
    """Event epoch (None as for seq)."""
    type: str
    """Event type, ``UNKNOWN`` (a newer writer's type), ``TOMBSTONE`` or ``UNDECODABLE``."""
    writer_type: str
    """UNKNOWN only: the type symbol the (newer) writer wrote."""
    node_id: str | None
    """Envelope ``node_id``."""
    error: str
    """UNDECODABLE only: the codec's error."""


@dataclass(frozen=True)
class ReplayedState:
    """A run's state as of a seq, rebuilt from the topic."""

    run_id: str
    """The run."""
    partition: int
    """Its partition of the events topic."""
    until_seq: int | None
    """The replay point asked for; None: the whole history."""
    state: RunState | None
    """The folded state (execution records included); None when the run has no event (or was erased)."""
    timeline: tuple[TimelineRow, ...]
    """The records folded, in offset order."""
    events: tuple[Event, ...]
    """The decoded events folded, in offset order."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-able: ``run_id``, ``partition``, ``until_seq``, ``state`` (``RunState.to_json`` as an object,
        or None), ``execution_records`` (sorted by intent offset) and ``timeline``."""
        state = json.loads(self.state.to_json()) if self.state is not None else None
        records = sorted((state or {}).get("records", {}).values(),
                         key=lambda r: (r["intended_offset"] is None, r["intended_offset"] or 0, r["call_id"]))
        return {"run_id": self.run_id, "partition": self.partition, "until_seq": self.until_seq, "state": state,
                "execution_records": records, "timeline": [dict(row) for row in self.timeline]}

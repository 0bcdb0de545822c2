"""Counters of one projector run (``runjournal projector --json``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ProjectorStats"]


@dataclass
class ProjectorStats:
    """Counters of one :meth:`Projector.run` (events are records handled, no-ops included)."""

    events: int = 0
    batches: int = 0
    dead_lettered: int = 0
    erased: int = 0
    conflicts: int = 0
    elapsed_s: float = 0.0
    parked_runs: set[str] = field(default_factory=set)
    blocked_runs: set[str] = field(default_factory=set)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able summary with ``events_per_s``."""
        rate = self.events / self.elapsed_s if self.elapsed_s > 0 else 0.0
        return {"events": self.events, "batches": self.batches, "dead_lettered": self.dead_lettered,
                "erased": self.erased, "conflicts": self.conflicts, "elapsed_s": round(self.elapsed_s, 3),
                "events_per_s": round(rate, 1), "parked_runs": sorted(self.parked_runs),
                "blocked_runs": sorted(self.blocked_runs)}

"""What one recovery pass did: per-run outcomes and totals (``runjournal recover --json``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runjournal.consumers.recovery.tail import PartitionRead

__all__ = ["RecoveryReport", "RunOutcome", "with_changes"]


@dataclass
class RunOutcome:
    """What recovery did with one run."""

    run_id: str
    """The run."""
    action: str = ""
    """``resumed``, ``handed_over`` (an earlier pass committed RUN_RESUMED and died before the hand-over:
    completed now, same epoch), ``finished`` (terminal: only disowned), ``parked`` (GAP/BLOCKED, or a run id that
    breaks the id rules: needs repair), ``deferred`` (a tool timeout has not passed), ``retry_later`` (its partition
    could not be read to the end, or the RUN_RESUMED transaction was aborted: nothing decided, the next pass retries),
    ``no_facts``, ``no_live_instance``, ``owner_alive`` (the journal shows a live instance owns it: left alone),
    ``not_ended`` (``reopen_failed``: the run to continue has not ended)."""
    owner: str | None = None
    """The dead instance it was taken from."""
    partition: int | None = None
    """Its partition."""
    previous_epoch: int | None = None
    """Epoch before recovery."""
    epoch: int | None = None
    """The new epoch (resumed runs)."""
    assigned_to: str | None = None
    """The live instance that takes it over."""
    calls: dict[str, int] = field(default_factory=dict)
    """Plan class -> count."""
    detail: str | None = None
    """Why, for non-resumed runs."""


@dataclass
class RecoveryReport:
    """Totals and per-run outcomes of one recovery pass."""

    runs: list[RunOutcome] = field(default_factory=list)
    fenced: list[str] = field(default_factory=list)
    partitions: list[PartitionRead] = field(default_factory=list)
    recovery_ms: float = 0.0

    def as_dict(self, *, with_runs: bool = True) -> dict[str, Any]:
        """JSON-able report: ``runs_recovered``, ``calls`` per class, ``offsets`` read, ``recovery_ms``, and
        (``with_runs``, default) ``runs``: every run's outcome."""
        totals: dict[str, int] = {}
        for r in self.runs:
            for k, v in r.calls.items():
                totals[k] = totals.get(k, 0) + v
        actions: dict[str, int] = {}
        for r in self.runs:
            actions[r.action] = actions.get(r.action, 0) + 1
        return {"runs_recovered": actions.get("resumed", 0), "actions": actions, "calls": totals,
                "fenced": self.fenced, "recovery_ms": round(self.recovery_ms, 1),
                "offsets": [vars(p) for p in self.partitions],
                **({"runs": [vars(r) for r in self.runs]} if with_runs else {})}


def with_changes(outcome: RunOutcome, **changes: Any) -> RunOutcome:
    """Set ``changes`` on ``outcome`` and return it."""
    for k, v in changes.items():
        setattr(outcome, k, v)
    return outcome

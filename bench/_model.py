"""Result shapes of the bench: one :class:`Row` per measured figure, each side summarised over rounds."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["PAIRS", "Row", "Summary", "goal_met", "paired_ratios", "percentile", "summarise"]

#: The bench's pairs, in the order they run (every one on the stack: pair 9's ``inspect RUN_ID`` reads a real run).
PAIRS = ("publish", "boundary", "projection", "recovery", "memory", "footprint", "console", "aio", "startup",
         "long", "event_cost", "payloads", "spend", "streams", "retention", "encryption")


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values`` by linear interpolation between closest ranks."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class Summary:
    """One side of a row over all rounds."""

    value: float
    """The headline figure: the median of the per-round values (or, for latency percentiles, the
    percentile over every sample of every round; see ``bench/README.md``)."""
    low: float
    """Smallest per-round value."""
    high: float
    """Largest per-round value."""
    rounds: tuple[float, ...]
    """Every per-round value, in round order."""


def summarise(per_round: Sequence[float], value: float | None = None) -> Summary:
    """A :class:`Summary` of ``per_round`` values; ``value`` overrides the median (pooled percentiles)."""
    vals = tuple(float(v) for v in per_round)
    headline = statistics.median(vals) if value is None else value
    return Summary(value=headline, low=min(vals), high=max(vals), rounds=vals)


@dataclass(frozen=True)
class Row:
    """One figure of one pair: our side next to its anchor, measured interleaved in the same run."""

    pair: str
    """Pair number and name, e.g. ``"1 publish"``."""
    metric: str
    """What is measured, with its unit (``"events/s"``, ``"ms p99"``)."""
    side: str
    """Our side's label."""
    ours: Summary
    """Our side."""
    anchor_side: str
    """The anchor's label."""
    anchor: Summary | None
    """The anchor (None for a figure without one, e.g. an absolute bound)."""
    goal: str | None = None
    """The goal on ``ratio`` (``"≥ 0.85"``) or on ``ours`` (``"≤ 10 s"``), None when only reported."""
    met: bool | None = None
    """Whether the goal was met (None without a goal)."""
    note: str = ""
    """What exactly was measured, when the label is not enough."""
    ratio_rounds: tuple[float, ...] = field(default=())
    """Per-round ratio ours/anchor (paired by round), for the ratio's min–max."""
    paired_headline: float | None = None
    """When set, the headline ratio instead of ``ours.value / anchor.value``: e.g. the median of the paired
    per-round ratios, for a pair whose sides are measured back to back within a round (pair 5)."""

    @property
    def ratio(self) -> float | None:
        """``paired_headline`` when set, else ``ours.value / anchor.value`` (None without an anchor or when the
        anchor is 0)."""
        if self.paired_headline is not None:
            return self.paired_headline
        if self.anchor is None or self.anchor.value == 0:
            return None
        return self.ours.value / self.anchor.value

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form with ``ratio`` and the ratio's per-round range."""
        out = asdict(self)
        out["ratio"] = None if self.ratio is None else round(self.ratio, 4)
        if self.ratio_rounds:
            out["ratio_low"] = round(min(self.ratio_rounds), 4)
            out["ratio_high"] = round(max(self.ratio_rounds), 4)
        return out


def paired_ratios(ours: Sequence[float], anchor: Sequence[float]) -> tuple[float, ...]:
    """Per-round ratios ``ours[i] / anchor[i]`` (rounds where the anchor is 0 are skipped)."""
    return tuple(o / a for o, a in zip(ours, anchor, strict=False) if a)


def goal_met(value: float | None, goal: str) -> bool | None:
    """Check ``value`` against a goal written ``"≥ x"`` or ``"≤ x"`` (a trailing unit is ignored)."""
    if value is None:
        return None
    op, num = goal.split()[0], float(goal.split()[1].rstrip("×"))
    return value >= num if op == "≥" else value <= num

"""Interleaved rounds: every side runs once per round, in a fixed order (A B A B …), after warm-up rounds."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Side", "interleave", "progress"]


@dataclass(frozen=True)
class Side:
    """One side of a pair: a label and a function measuring one round (returns a figure or samples)."""

    label: str
    """Shown in the table."""
    run: Callable[[], Any]
    """Measures one round; returns a float (e.g. events/s) or a list of samples (latencies)."""
    warmup: bool = True
    """Also run in warm-up rounds (False for a side whose every round starts a fresh process anyway)."""


def progress(text: str) -> None:
    """One progress line on stderr (stdout stays clean for ``--json``)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _fmt(value: Any) -> str:
    if isinstance(value, list):
        return f"{len(value)} samples, median {sorted(value)[len(value) // 2]:.2f}" if value else "0 samples"
    return f"{value:,.1f}" if isinstance(value, float) else str(value)


def interleave(pair: str, sides: Sequence[Side], *, rounds: int, warmup: int = 1,
               rotate: bool = False) -> dict[str, list[Any]]:
    """Run ``warmup + rounds`` rounds of every side in order; return each side's measured rounds.

    Warm-up rounds are run and discarded (cold broker paths, first transactions, imports, JIT-less
    caches such as the page cache of a topic). ``rotate`` starts round ``r`` at side ``r mod n``
    (A B C, B C A, C A B …) so that no side always runs right after the same other side.
    """
    results: dict[str, list[Any]] = {s.label: [] for s in sides}
    for r in range(warmup + rounds):
        tag = "warm-up" if r < warmup else f"round {r - warmup + 1}/{rounds}"
        line = []
        order = [*sides[r % len(sides):], *sides[:r % len(sides)]] if rotate else list(sides)
        for side in order:
            if r < warmup and not side.warmup:
                continue
            value = side.run()
            if r >= warmup:
                results[side.label].append(value)
            line.append(f"{side.label}={_fmt(value)}")
        progress(f"{pair} {tag}: " + ", ".join(line))
    return results

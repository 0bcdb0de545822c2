"""The projector's in-memory copy of the run states it wrote, valid while Redis's applied offset is unchanged.

Without it, every batch reloads (``MGET``) and parses (``RunState.from_json``) the state of every run
it touches, though the projector itself wrote that state one batch earlier. With it, a partition's
cached states are used only when they were written at exactly the applied offset the next batch
folds from (``expected_offset``); anything else — a conflict or a duplicate answer from the apply
script, a rebalance, a re-seek — drops the partition's cache and states are read from Redis again.
The apply script still refuses a batch folded from a stale view, so a stale cache can never be
written: it would fail exactly as a stale ``MGET`` would (DESIGN.md § Projector).

Bounded: at most ``max_runs`` states in all; terminal runs are dropped at once (they rarely see
another event), the least recently touched runs of the partition being written go first.
"""

from __future__ import annotations

from collections.abc import Mapping

from runjournal.model.reducer import RunState

__all__ = ["StateCache"]


class StateCache:
    """Per-partition ``run_id -> RunState`` valid at one applied offset.

    Args:
        max_runs: most states kept over all partitions (0 disables the cache).
    """

    def __init__(self, max_runs: int = 10_000) -> None:
        self.max_runs = max_runs
        self._parts: dict[int, tuple[int, dict[str, RunState]]] = {}
        self.hits = 0
        """States served from memory."""
        self.misses = 0
        """States the caller had to load from Redis."""

    def valid(self, partition: int, offset: int) -> dict[str, RunState]:
        """The states of ``partition`` valid at applied offset ``offset`` (empty when none are)."""
        entry = self._parts.get(partition)
        return entry[1] if entry is not None and entry[0] == offset else {}

    def split(self, partition: int, offset: int, run_ids: set[str]) -> tuple[dict[str, RunState], list[str]]:
        """``(cached states of run_ids, run_ids to load from Redis)`` for a batch folded from ``offset``."""
        cached = self.valid(partition, offset)
        found = {r: cached[r] for r in run_ids if r in cached}
        missing = [r for r in run_ids if r not in found]
        self.hits += len(found)
        self.misses += len(missing)
        return found, missing

    def advance(self, partition: int, from_offset: int, to_offset: int,
                states: Mapping[str, RunState | None]) -> None:
        """Record ``states`` (None = erased) as written by the batch that moved ``from_offset`` → ``to_offset``."""
        if self.max_runs <= 0:
            return
        entry = self._parts.get(partition)
        cache = entry[1] if entry is not None and entry[0] == from_offset else {}
        for run_id, state in states.items():
            cache.pop(run_id, None)  # re-inserted last: dict order is least recently touched first
            if state is not None and not state.terminal:
                cache[run_id] = state
        others = sum(len(c) for p, (_o, c) in self._parts.items() if p != partition)
        while cache and len(cache) + others > self.max_runs:
            del cache[next(iter(cache))]
        self._parts[partition] = (to_offset, cache)

    def drop(self, partition: int | None = None) -> None:
        """Forget ``partition``'s states (all partitions when None)."""
        if partition is None:
            self._parts.clear()
        else:
            self._parts.pop(partition, None)

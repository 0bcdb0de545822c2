"""The projector's in-memory copy of the run states it wrote, valid while Redis's applied offset is unchanged.

Without it, every batch reloads (``HGETALL`` of each run's hash) and parses
(``runjournal.model.stored.state_from_fields``) the state of every run it touches, though the projector itself
wrote that state one batch earlier. With it, a partition's
cached states are used only when they were written at exactly the applied offset the next batch
folds from (``expected_offset``); anything else — a conflict or a duplicate answer from the apply
script, a rebalance, a re-seek — drops the partition's cache and states are read from Redis again.
The apply script still refuses a batch folded from a stale view, so a stale cache can never be
written: it would fail exactly as a stale read would (docs/design/protocol.md § Projector).

It also knows, per partition, which runs Redis may hold at that offset (:meth:`StateCache.know`: the partition's
runs set ``rj:{P.p}:runs`` read at assignment, then every run the projector wrote or erased): a run outside it has
no state in Redis, so a batch's new runs cost no read — which, with a write in flight, would wait behind that
write's script in Redis. Sound because only the projector's apply script adds runs to Redis, and only with the
partition's applied offset moving in the same script: a write by anyone else moves the offset, and the next batch of
this projector is refused (then the cache goes) — ``erase`` only deletes, which leaves the knowledge a superset.

Bounded: at most ``max_runs`` states in all; terminal runs are dropped at once (they rarely see
another event), the least recently touched runs of the partition being written go first. The run ids known
are bounded by ``max_known`` per partition (beyond it the partition loads every miss, as without the knowledge).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from runjournal.model.reducer import RunState

__all__ = ["StateCache"]


@dataclass
class _Part:
    offset: int
    """The applied offset the entry is valid at."""
    states: dict[str, RunState] = field(default_factory=dict)
    """run_id -> its state at ``offset`` (least recently touched first)."""
    known: set[str] | None = None
    """Every run Redis may hold for the partition at ``offset``; None: not known (every miss is loaded)."""


class StateCache:
    """Per-partition ``run_id -> RunState`` valid at one applied offset.

    Args:
        max_runs: most states kept over all partitions (0 disables the cache, and the known runs with it).
        max_known: most run ids known per partition (default 200,000, ~20 MB); a partition with more runs in Redis
            loads every cache miss.
    """

    def __init__(self, max_runs: int = 10_000, *, max_known: int = 200_000) -> None:
        self.max_runs = max_runs
        self.max_known = max_known
        self._parts: dict[int, _Part] = {}
        self.hits = 0
        """States served from memory."""
        self.misses = 0
        """States the caller had to load from Redis."""
        self.absent = 0
        """Misses known to have no state in Redis (not loaded)."""

    def valid(self, partition: int, offset: int) -> dict[str, RunState]:
        """The states of ``partition`` valid at applied offset ``offset`` (empty when none are)."""
        entry = self._parts.get(partition)
        return entry.states if entry is not None and entry.offset == offset else {}

    def know(self, partition: int, offset: int, run_ids: Iterable[str]) -> None:
        """Start ``partition`` at applied offset ``offset`` with no states and ``run_ids``, every run Redis holds for it
        there (its runs set, read with the offset); ignored when the cache is off or there are over ``max_known``."""
        ids = set(run_ids)
        if self.max_runs > 0 and len(ids) <= self.max_known:
            self._parts[partition] = _Part(offset, {}, ids)

    def split(self, partition: int, offset: int, run_ids: set[str]) -> tuple[dict[str, RunState], list[str]]:
        """``(cached states of run_ids, run_ids to load from Redis)`` for a batch folded from ``offset``; a run known
        to have no state in Redis is in neither (it has none)."""
        entry = self._parts.get(partition)
        valid = entry is not None and entry.offset == offset
        cached = entry.states if entry is not None and valid else {}
        found = {r: cached[r] for r in run_ids if r in cached}
        missing = [r for r in run_ids if r not in found]
        known = entry.known if entry is not None and valid else None
        if known is not None and missing:
            load = [r for r in missing if r in known]
            self.absent += len(missing) - len(load)
            missing = load
        self.hits += len(found)
        self.misses += len(missing)
        return found, missing

    def advance(self, partition: int, from_offset: int, to_offset: int,
                states: Mapping[str, RunState | None]) -> None:
        """Record ``states`` (None = erased) as written by the batch that moved ``from_offset`` → ``to_offset``."""
        if self.max_runs <= 0:
            return
        entry = self._parts.get(partition)
        if entry is None or entry.offset != from_offset:
            entry = _Part(from_offset)
        cache, known = entry.states, entry.known
        for run_id, state in states.items():
            cache.pop(run_id, None)  # re-inserted last: dict order is least recently touched first
            if state is not None and not state.terminal:
                cache[run_id] = state
            if known is not None:
                if state is None:
                    known.discard(run_id)
                else:
                    known.add(run_id)
        if known is not None and len(known) > self.max_known:
            entry.known = None
        others = sum(len(p.states) for n, p in self._parts.items() if n != partition)
        while cache and len(cache) + others > self.max_runs:
            del cache[next(iter(cache))]
        entry.offset = to_offset
        self._parts[partition] = entry

    def drop(self, partition: int | None = None) -> None:
        """Forget ``partition``'s states and known runs (all partitions when None)."""
        if partition is None:
            self._parts.clear()
        else:
            self._parts.pop(partition, None)

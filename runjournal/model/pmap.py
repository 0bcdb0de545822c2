"""Persistent maps for a run's growing state: one entry set in O(log n), the old map unchanged.

A run's ``records``, ``nodes``, ``pending_approvals`` and ``approvals`` grow with the run. A ``dict`` copied on each
event (``{**records, k: v}``) made one event cost O(n) and a run O(n²) (issue 29: 24.5 ms per event at 10,000
events). :class:`PMap` wraps ``immutables.Map`` (a HAMT in C: ``set`` ≈ 0.3-0.7 µs at 50k entries) and adds what the
projector needs (docs/design/decisions/0051-a-hash-per-run.md):

* **Equality with any mapping**: ``PMap({'a': 1}) == {'a': 1}`` (``immutables.Map`` alone says False), so states
  built from plain dicts (tests, JSON) compare as before.
* **What changed since an ancestor** (:meth:`PMap.changed_since`): each map derived by :meth:`PMap.set` /
  :meth:`PMap.delete` keeps a chain of the keys it set, back to the map it was built from; walking the chain from
  a batch's after-map to its before-map gives the keys the batch changed, in O(changes). Bounded
  (:data:`CHAIN_LIMIT` links); past it, or for maps not derived from one another, it compares every entry by
  identity (O(n), no serialisation) — always right, only slower.
* :class:`RecordMap` also counts its records by status (O(1) per set), so the runs index entry needs no scan.

Treat every instance as immutable: there is no mutating method.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import immutables

__all__ = ["CHAIN_LIMIT", "PMap", "RecordMap", "as_pmap"]

K = TypeVar("K")
V = TypeVar("V")

CHAIN_LIMIT = 4096
"""Most links of a map's change chain; a longer history starts a new chain (a diff across it scans the map)."""


class _Link:
    """One set/delete in a map's history (``prev`` None: the root of a chain, the map was built whole)."""

    __slots__ = ("depth", "key", "prev")

    def __init__(self, prev: _Link | None, key: Any, depth: int) -> None:
        self.prev = prev
        self.key = key
        self.depth = depth


class PMap(Mapping[K, V], Generic[K, V]):
    """An immutable mapping with O(log n) :meth:`set` / :meth:`delete` (module docstring).

    Args:
        items: the entries (any mapping or iterable of pairs); copied.
    """

    __slots__ = ("_link", "_m")

    _m: immutables.Map[K, V]
    _link: _Link

    def __init__(self, items: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        self._m = immutables.Map(items)
        self._link = _Link(None, None, 0)

    @classmethod
    def _derived(cls, base: PMap[K, V], m: immutables.Map[K, V], link: _Link) -> Any:
        new = object.__new__(cls)
        new._m = m
        new._link = link
        return new

    # -- Mapping ---------------------------------------------------------------------------------------------
    def __getitem__(self, key: K) -> V:
        return self._m[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._m)

    def __len__(self) -> int:
        return len(self._m)

    def __contains__(self, key: object) -> bool:
        return key in self._m

    def get(self, key: K, default: Any = None) -> Any:
        return self._m.get(key, default)

    def keys(self) -> Any:
        return self._m.keys()

    def values(self) -> Any:
        return self._m.values()

    def items(self) -> Any:
        return self._m.items()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PMap):
            return self._m == other._m
        if isinstance(other, Mapping):
            return len(self._m) == len(other) and all(k in other and other[k] == v for k, v in self._m.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self._m.items())!r})"

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return type(self), (dict(self._m.items()),)  # the chain is not pickled (a copy diffs by scanning)

    # -- persistent updates ----------------------------------------------------------------------------------
    def _next(self, key: K) -> _Link:
        link = self._link
        depth = link.depth + 1
        return _Link(link, key, depth) if depth <= CHAIN_LIMIT else _Link(None, None, 0)

    def set(self, key: K, value: V) -> Any:
        """A new map with ``key`` -> ``value`` (O(log n)); this one is unchanged."""
        return self._derived(self, self._m.set(key, value), self._next(key))

    def delete(self, key: K) -> Any:
        """A new map without ``key`` (this map itself when it has no ``key``)."""
        if key not in self._m:
            return self
        return self._derived(self, self._m.delete(key), self._next(key))

    def update(self, changes: Mapping[K, V]) -> Any:
        """A new map with every entry of ``changes`` set (this map itself when ``changes`` is empty)."""
        out = self
        for key, value in changes.items():
            out = out.set(key, value)
        return out

    def forget_history(self) -> None:
        """Drop the chain of keys set before this map (only its memory: the entries are unchanged). A diff of a map
        derived from this one against this one stays O(changes); against an older map it scans (O(len)).

        The projector calls it on each state it has written (``ProjectionStore.prepare_batch``): the next batch is
        diffed against that state, never an older one, so a cached run keeps no history of its events.
        """
        self._link = _Link(None, None, 0)

    # -- diff ------------------------------------------------------------------------------------------------
    def changed_since(self, before: Mapping[K, V] | None) -> builtins.set[K]:
        """Keys whose entry differs from ``before`` (set, replaced or removed).

        O(changes) when this map was derived from ``before`` by :meth:`set` / :meth:`delete` within
        :data:`CHAIN_LIMIT` steps; otherwise every entry is compared by identity (O(len)). A key set again to the
        very same value object may be reported (harmless: it is written again).

        Args:
            before: an earlier map (None or empty: every key of this map).
        """
        if before is self:
            return set()
        if before is None:
            return set(self._m.keys())
        if isinstance(before, PMap):
            target = before._link  # noqa: SLF001 - another map of the same class
            keys: builtins.set[K] = builtins.set()
            link = self._link
            while link is not target:
                if link.prev is None:
                    break
                keys.add(link.key)
                link = link.prev
            else:
                return keys
        mine = self._m
        keys = {k for k, v in mine.items() if before.get(k, _MISSING) is not v}
        keys.update(k for k in before if k not in mine)
        return keys


_MISSING = object()

_UNKNOWN = "OUTCOME_UNKNOWN"
_RECONCILED = "RECONCILED"


def _tally(record: Any) -> tuple[int, int]:
    status = record.status
    return (1, 0) if status == _UNKNOWN else (0, 1) if status == _RECONCILED else (0, 0)


class RecordMap(PMap[K, V]):
    """A :class:`PMap` of execution records that counts its OUTCOME_UNKNOWN and RECONCILED records (O(1) per set):
    what the runs index entry shows (``runjournal.consumers.projector.index.summary_json``)."""

    __slots__ = ("unknown", "reconciled")

    unknown: int
    """Records whose status is OUTCOME_UNKNOWN."""
    reconciled: int
    """Records whose status is RECONCILED."""

    def __init__(self, items: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        super().__init__(items)
        unknown = reconciled = 0
        for record in self._m.values():
            u, r = _tally(record)
            unknown += u
            reconciled += r
        self.unknown = unknown
        self.reconciled = reconciled

    def set(self, key: K, value: V) -> Any:
        """A new map with ``key`` -> ``value`` (O(log n)), counts kept; this one is unchanged."""
        new = self._derived(self, self._m.set(key, value), self._next(key))
        u, r = _tally(value)
        old = self._m.get(key)
        if old is not None:
            ou, orr = _tally(old)
            u, r = u - ou, r - orr
        new.unknown = self.unknown + u
        new.reconciled = self.reconciled + r
        return new

    def delete(self, key: K) -> Any:
        """A new map without ``key`` (this map itself when it has no ``key``), counts kept."""
        old = self._m.get(key)
        if old is None:
            return self
        new = self._derived(self, self._m.delete(key), self._next(key))
        u, r = _tally(old)
        new.unknown = self.unknown - u
        new.reconciled = self.reconciled - r
        return new


_P = TypeVar("_P", bound=PMap[Any, Any])


def as_pmap(value: Mapping[K, V], cls: type[_P] = PMap) -> _P:  # type: ignore[assignment,unused-ignore]
    """``value`` itself when it is already a ``cls``, else a ``cls`` copy of it (O(n): plain dicts from callers)."""
    if type(value) is cls:
        return value
    return cls(value)

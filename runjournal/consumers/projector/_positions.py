"""What one projector member knows of each partition it is assigned: where its next batch folds from, which view
of the partition its records were fetched under, the group offset it may commit, and a re-seek that is due.

A partition's *view* is a number that changes at every (re)assignment and every re-seek: records fetched under an
older view (before the consumer was re-seeked) are dropped unfolded, and a batch folded from a view that changed
before its write was submitted is dropped unwritten; the records come again from the offset Redis holds
(``runjournal.consumers.projector._writebehind``, rule 4).
"""

from __future__ import annotations

import itertools

from runjournal.consumers.projector._cache import StateCache

__all__ = ["Positions"]


class Positions:
    """Per-partition positions of one member (every method runs on the projector's main thread).

    Args:
        cache: the member's state cache (a partition's cache goes whenever its view changes).
    """

    def __init__(self, cache: StateCache) -> None:
        self.cache = cache
        self.applied: dict[int, int] = {}
        """Assigned partition -> the offset its next batch folds from (the end of the write in flight, if any)."""
        self.views: dict[int, int] = {}
        """Assigned partition -> its current view."""
        self.pending_commit: dict[int, int] = {}
        """Partition -> group offset to commit (last applied + 1), set only from an applied write."""
        self.reseek_due: dict[int, int | None] = {}
        """Partition -> the applied offset Redis holds, to re-seek to (None: read it from Redis first)."""
        self._ids = itertools.count(1)

    def assign(self, partition: int, stored: int, known: set[str] | None) -> None:
        """``partition`` is (re)assigned, with ``stored`` the applied offset Redis holds (-1: none) and ``known`` the
        runs Redis holds for it (read after the offset; None: not read)."""
        self.forget(partition)
        self.applied[partition] = stored
        self.views[partition] = next(self._ids)
        if known is not None:
            self.cache.know(partition, stored, known)

    def forget(self, partition: int) -> None:
        """``partition`` is revoked or lost: drop its offset, view, cache and a due re-seek (not its commit)."""
        self.applied.pop(partition, None)
        self.views.pop(partition, None)
        self.reseek_due.pop(partition, None)
        self.cache.drop(partition)

    def _commit_stored(self, partition: int, stored: int | None) -> None:
        """The group offset to commit after a write that was not applied by this member: Redis's applied offset + 1
        when it is known — Redis holds the truth, whichever write of whichever member put it there — else nothing
        (read at the re-seek). One rule for every outcome of a write (applied, already applied, refused, failed),
        so no outcome leaves the group offset behind what Redis holds (the lag would never reach 0)."""
        if stored is not None and stored >= 0:
            self.pending_commit[partition] = stored + 1
        else:
            self.pending_commit.pop(partition, None)

    def void(self, partition: int, stored: int | None) -> None:
        """A write of ``partition`` was not applied: what was folded after it is void, a re-seek to ``stored`` (None:
        Redis's applied offset, to be read) is due, and the group offset to commit is Redis's
        (:meth:`_commit_stored`)."""
        self.views[partition] = next(self._ids)
        self.cache.drop(partition)
        self._commit_stored(partition, stored)
        self.reseek_due[partition] = stored

    def reseeked(self, partition: int, stored: int, known: set[str] | None) -> None:
        """The consumer was re-seeked to ``stored + 1``: records fetched before are void, folding goes on from
        ``stored``, with ``known`` the runs Redis holds for it (read after the offset; None: not read)."""
        self.reseek_due.pop(partition, None)
        self.applied[partition] = stored
        self.views[partition] = next(self._ids)
        self.cache.drop(partition)
        self._commit_stored(partition, stored)
        if known is not None:
            self.cache.know(partition, stored, known)

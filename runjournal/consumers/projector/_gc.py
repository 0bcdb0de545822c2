"""Python's cyclic garbage collector, paused while the projector works through a backlog.

The projector's heap is large, long-lived and acyclic (states, records, the cache) and a rebuild allocates fast:
collections triggered by a batch's allocations traverse the batch's surviving states again and again, though the
next batch replaces most of them (with a collection after every poll, ~3 % of a pair-3 rebuild; with none paused,
~10 %). Reference counting frees the objects as ever; only cycles (an exception's traceback) wait for the collector,
which runs again between polls every ``every`` busy polls and whenever a poll comes back empty.
"""

from __future__ import annotations

import gc

__all__ = ["GcPause"]


class GcPause:
    """Pauses the collector for busy polls; never turns on a collector it did not turn off.

    Args:
        every: busy polls between two runs of the collector (default 16, ~1 s of a rebuild here).
    """

    def __init__(self, every: int = 16) -> None:
        self.every = every
        self._busy = 0
        self._paused = False

    def busy(self) -> None:
        """A poll with records is about to be handled."""
        self._busy += 1
        if not self._paused and gc.isenabled():
            gc.disable()
            self._paused = True

    def handled(self) -> None:
        """The busy poll is handled: the collector runs again (until the next busy poll) every ``every`` polls."""
        if self._busy % self.every == 0:
            self.resume()

    def resume(self) -> None:
        """The collector on again, if this pause turned it off (an idle poll, the end of the run)."""
        if self._paused:
            self._paused = False
            gc.enable()

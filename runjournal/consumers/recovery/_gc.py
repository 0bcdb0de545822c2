"""The cyclic garbage collector paused for the length of one recovery pass.

A pass allocates hundreds of thousands of small objects (states, execution records, plans, events) that live
until it ends; each full collection walks them all, again and again as the heap grows — a third of a 10k-run
pass (issue 20 profile). They hold no reference cycles, so reference counting frees them without the collector;
cyclic garbage made meanwhile (a caught exception's traceback) waits for the first collection after the pass.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Pause", "collector_paused"]


class Pause:
    """One pause of the collector; :meth:`lifted` lets it run again for a while (a long wait inside the pass)."""

    def __init__(self, enabled_before: bool) -> None:
        self.enabled_before = enabled_before
        """Whether the collector was enabled when the pause began (only then is it enabled again)."""

    @contextmanager
    def lifted(self) -> Iterator[None]:
        """The collector enabled inside the block (when the pause disabled it), paused again after."""
        if not self.enabled_before:
            yield
            return
        gc.enable()
        try:
            yield
        finally:
            gc.disable()


@contextmanager
def collector_paused() -> Iterator[Pause]:
    """Disable the cyclic collector inside the block; re-enable it after, if it was enabled before.

    Process-wide (the collector has no per-thread switch): another thread's cyclic garbage also waits for the end
    of the block — or for a :meth:`Pause.lifted` stretch. Nested or concurrent blocks never leave it disabled:
    only the block that found it enabled enables it again.
    """
    pause = Pause(gc.isenabled())
    gc.disable()
    try:
        yield pause
    finally:
        if pause.enabled_before:
            gc.enable()

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

__all__ = ["collector_paused"]


@contextmanager
def collector_paused() -> Iterator[None]:
    """Disable the cyclic collector inside the block; re-enable it after, if it was enabled before.

    Process-wide (the collector has no per-thread switch): another thread's cyclic garbage also waits for the end
    of the block. Nested or concurrent blocks never leave it disabled: only the block that found it enabled
    enables it again.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()

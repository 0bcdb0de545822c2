"""The memory extractor waits for idle CPU before each batch (``RUNJOURNAL_MEMORY_HEADROOM_CORES``).

Priority alone does not isolate the critical path. Under ``SCHED_IDLE`` the extractor runs only on CPU time no
normal thread wants, yet on 2 cores a projector rebuild beside it still ran at 0.86-0.90 of its speed (bench
pair 5, 120k events): the extractor took ~75 % of its solo rate out of the gaps the projector, the broker and
Redis leave, and the projector's own CPU per event rose 6-13 % — shared caches and memory bandwidth, which no
scheduler policy divides. So the extractor also yields *work*: before it consumes a batch it measures how much
CPU the rest of the host used since the last look (``/proc/stat`` through psutil, minus its own process time)
and, while fewer than ``cores`` cores were left idle, waits in steps of ``step_s``, for at most ``max_wait_s``
per batch — the bound keeps memory moving (one batch per ``max_wait_s`` under sustained load, a few % of one
core) and stays far below the consumer's ``max.poll.interval.ms``. On a quiet host it never waits.
Memory may lag by design (docs/design/protocol.md § Memory); the projector, recovery and agents must not.
"""

from __future__ import annotations

import threading
import time
from typing import NamedTuple

import psutil

__all__ = ["CpuHeadroom"]

_BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")  # guest time is already inside user/nice


class _Sample(NamedTuple):
    wall_s: float
    host_busy_s: float  # CPU-seconds busy over every core of the host
    own_s: float  # this process's CPU-seconds (every thread)


def _sample() -> _Sample:
    times = psutil.cpu_times()
    busy = sum(getattr(times, f, 0.0) for f in _BUSY_FIELDS)
    return _Sample(time.monotonic(), busy, time.process_time())


class CpuHeadroom:
    """Gate run before each batch: wait while the rest of the host leaves fewer than ``cores`` cores idle.

    Args:
        cores: idle cores (CPU-seconds per second) the rest of the host must leave for the extractor to go on;
            0 turns the gate off. Capped at ``cpu_count - 0.5`` so a 1-core host still runs between bursts.
        max_wait_s: longest wait before one batch, seconds (the extractor then handles one batch anyway).
        step_s: how often the host's CPU is looked at while waiting, seconds (``/proc/stat`` counts in 10 ms ticks).

    Attributes:
        waited_s: seconds waited in total; ``waits``: batches that waited at all.

    Raises:
        ValueError: a negative ``cores``, ``max_wait_s`` or a non-positive ``step_s``.
    """

    def __init__(self, cores: float, max_wait_s: float, *, step_s: float = 0.1) -> None:
        if cores < 0 or max_wait_s < 0 or step_s <= 0:
            raise ValueError(f"CpuHeadroom(cores={cores}, max_wait_s={max_wait_s}, step_s={step_s}): cores and "
                             "max_wait_s must be >= 0, step_s > 0")
        self.cpus = psutil.cpu_count() or 1
        self.cores = min(cores, self.cpus - 0.5)
        self.max_wait_s = max_wait_s
        self.step_s = step_s
        self.waited_s = 0.0
        self.waits = 0
        self._last = _sample()

    @property
    def enabled(self) -> bool:
        """False when ``cores`` or ``max_wait_s`` is 0: :meth:`wait` returns at once."""
        return self.cores > 0 and self.max_wait_s > 0

    def idle_cores(self) -> float:
        """Cores the rest of the host left idle since the previous call (0 … ``cpus``; this process's CPU counts
        as idle: the question is what *others* need)."""
        now, then = _sample(), self._last
        self._last = now
        wall = now.wall_s - then.wall_s
        if wall <= 0:
            return float(self.cpus)
        others = max(0.0, (now.host_busy_s - then.host_busy_s) - (now.own_s - then.own_s)) / wall
        return max(0.0, self.cpus - others)

    def wait(self, stop: threading.Event | None = None) -> float:
        """Block until the last ``step_s`` left ``cores`` idle cores, ``max_wait_s`` passed or ``stop`` is set.

        The first look covers the time since the previous call (the batch just handled), so a busy host is seen
        without a wait of its own.

        Returns:
            Seconds waited (0.0 when there was headroom or the gate is off).
        """
        if not self.enabled:
            return 0.0
        stop = stop or threading.Event()
        started = time.monotonic()
        waited = False
        while self.idle_cores() < self.cores:
            left = self.max_wait_s - (time.monotonic() - started)
            if left <= 0 or stop.is_set():
                break
            stop.wait(min(self.step_s, left))
            waited = True
        if not waited:
            return 0.0
        seconds = time.monotonic() - started
        self.waited_s += seconds
        self.waits += 1
        return seconds

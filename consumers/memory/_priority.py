"""The memory extractor's process yields the CPU: its niceness is raised before it starts any thread.

Memory is off the critical path (DESIGN.md § Memory): on a host it shares with the projector, the broker or
agents it may lag, they must not wait. On Linux niceness belongs to a thread and threads inherit their
creator's: it is raised for every thread the process has (one may have been started at import) and in the
main thread before the consumer (librdkafka's threads), the embedder (onnxruntime) and the read server start,
so every later thread inherits it. Measured on
``make bench`` pair 5: see bench/README.md.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = ["yield_cpu"]

log = logging.getLogger("runjournal.consumers.memory")


def yield_cpu(nice: int) -> int:
    """Raise this thread's niceness to ``nice`` (0 … 19; never lowered: that needs privileges).

    Args:
        nice: target niceness (``Settings.memory_nice``, env ``RUNJOURNAL_MEMORY_NICE``); 0 leaves it as is.

    Returns:
        The niceness now.
    """
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if nice <= current:
        return current
    tasks = Path("/proc/self/task")
    threads = [int(t) for t in os.listdir(tasks)] if tasks.is_dir() else [0]  # Linux: per thread; else: process
    for tid in threads:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:
            continue  # the thread ended meanwhile
        except OSError as exc:  # a sandbox may forbid it: run anyway, at the priority it has
            log.warning("could not lower the CPU priority", extra={"nice": nice, "error": str(exc)})
            break
    return os.getpriority(os.PRIO_PROCESS, 0)

"""The memory extractor's process yields the CPU: its niceness (and, with ``RUNJOURNAL_MEMORY_SCHED=idle``, its
scheduling policy) is set before it starts any thread.

Memory is off the critical path (docs/design/protocol.md § Memory): on a host it shares with the projector, the
broker or agents it may lag, they must not wait. On Linux niceness belongs to a thread and threads inherit their
creator's: it is raised for every thread the process has (one may have been started at import) and in the
main thread before the consumer (librdkafka's threads), the embedder (onnxruntime) and the read server start,
so every later thread inherits it. Measured on
``make bench`` pair 5: see bench/README.md.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = ["SCHED_POLICIES", "yield_cpu"]

log = logging.getLogger("runjournal.consumers.memory")

#: ``RUNJOURNAL_MEMORY_SCHED`` values -> Linux scheduling policy (``sched(7)``). ``idle`` (``SCHED_IDLE``): the
#: thread runs only on CPU time no normal thread wants — CFS gives it a weight of 3 against 15 for nice 19 and
#: 1024 for nice 0, and a waking normal thread preempts it at once; any process may move itself there, no
#: privilege needed. ``other``: the default time-sharing policy, bounded by niceness alone.
SCHED_POLICIES = {"idle": getattr(os, "SCHED_IDLE", None), "other": getattr(os, "SCHED_OTHER", None)}


def _threads() -> list[int]:
    tasks = Path("/proc/self/task")
    return [int(t) for t in os.listdir(tasks)] if tasks.is_dir() else [0]  # Linux: per thread; else: process


def yield_cpu(nice: int, sched: str = "other") -> int:
    """Raise every thread's niceness to ``nice`` (0 … 19; never lowered: that needs privileges) and, with
    ``sched="idle"``, move every thread to ``SCHED_IDLE``. Threads started later inherit both.

    Args:
        nice: target niceness (``Settings.memory_nice``, env ``RUNJOURNAL_MEMORY_NICE``); 0 leaves it as is.
        sched: ``"idle"`` or ``"other"`` (``Settings.memory_sched``, env ``RUNJOURNAL_MEMORY_SCHED``, see
            :data:`SCHED_POLICIES`); where the platform has no ``SCHED_IDLE``, niceness alone bounds it (logged).

    Returns:
        The niceness now.
    """
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if nice > current:
        for tid in _threads():
            try:
                if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                    os.setpriority(os.PRIO_PROCESS, tid, nice)
            except ProcessLookupError:
                continue  # the thread ended meanwhile
            except OSError as exc:  # a sandbox may forbid it: run anyway, at the priority it has
                log.warning("could not lower the CPU priority", extra={"nice": nice, "error": str(exc)})
                break
    if sched == "idle":
        _idle_policy()
    return os.getpriority(os.PRIO_PROCESS, 0)


def _idle_policy() -> None:
    policy = SCHED_POLICIES["idle"]
    if policy is None or not hasattr(os, "sched_setscheduler"):
        log.warning("SCHED_IDLE is not available here: the extractor is bounded by its niceness alone")
        return
    for tid in _threads():
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(0))
        except ProcessLookupError:
            continue
        except OSError as exc:
            log.warning("could not move the extractor to SCHED_IDLE", extra={"error": str(exc)})
            return

"""Failpoints for crash tests: ``RJ_FAILPOINTS="name=N[,name=N:stop]"`` SIGKILLs (or, with ``:stop``,
SIGSTOPs — a paused zombie) this process at the Nth hit of ``name``.

Production code calls :func:`hit` at the points a crash matters (e.g. ``projector.before_write``).
With the variable unset — always, outside tests — a hit is one dict lookup. The process kills
itself with SIGKILL (no cleanup, no atexit, no flush), exactly like an OOM kill or ``kill -9``.
"""

from __future__ import annotations

import os
import signal

__all__ = ["hit"]


def _parse(spec: str) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, rest = part.partition("=")
        count, _, action = rest.partition(":")
        out[name] = (int(count or 1), int(signal.SIGSTOP if action == "stop" else signal.SIGKILL))
    return out


_ARMED: dict[str, tuple[int, int]] = _parse(os.environ.get("RJ_FAILPOINTS", ""))
_HITS: dict[str, int] = {}


def hit(name: str) -> None:
    """Count a pass through failpoint ``name``; SIGKILL (or SIGSTOP) this process at its armed count."""
    if not _ARMED or name not in _ARMED:
        return
    _HITS[name] = _HITS.get(name, 0) + 1
    count, sig = _ARMED[name]
    if _HITS[name] == count:
        os.kill(os.getpid(), sig)

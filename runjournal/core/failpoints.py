"""Failpoints for crash tests: ``RJ_FAILPOINTS="name=N[,name=N:stop]"`` SIGKILLs (or, with ``:stop``,
SIGSTOPs — a paused zombie) this process at the Nth hit of ``name``.

Production code calls :func:`hit` at the points a crash matters (e.g. ``projector.before_write``).
With the variable unset — always, outside tests — a hit is one dict lookup. The process kills
itself with SIGKILL (no cleanup, no atexit, no flush), exactly like an OOM kill or ``kill -9``.
"""

from __future__ import annotations

import os
import signal

__all__ = ["REGISTRY", "hit"]

REGISTRY: dict[str, str] = {
    "producers.call.before_intent_commit": "a side effect's TOOL_CALL_INTENDED produced, its commit not acknowledged",
    "producers.call.after_intent": "the intent acknowledged, the tool not yet invoked",
    "producers.call.before_send": "a side effect's intent acknowledged and its owner's lease checked, the request "
                                  "not yet sent (read-only calls never pass here)",
    "producers.call.after_tool": "the tool returned, its outcome not yet published",
    "producers.call.after_outcome": "the outcome published (acknowledged, or riding the next commit in group mode)",
    "producers.result.before_payload_commit": "a large result's records produced on the payloads topic, their "
                                              "transaction not committed (its TOOL_CALL_COMMITTED not produced)",
    "producers.txn.after_outcome_commit": "a commit that acknowledged a deferred (group-mode) outcome returned",
    "producers.surrender.after_flush": "a surrendering instance committed its open transaction; the run not yet "
                                       "moved from its owned set to its surrendered hash",
    "projector.before_write": "a batch folded, its Redis write not yet sent",
    "projector.write_in_flight": "a batch's Redis write sent (write-behind), not yet answered",
    "projector.after_write": "a batch written to Redis, the group offset not yet committed",
    "recovery.after_fence": "the dead instances fenced (and the recovery producer initialised), nothing read",
    "recovery.after_read": "the partitions' tails folded, nothing published",
    "recovery.after_commit": "RUN_RESUMED committed, nothing of the hand-over written",
    "recovery.inside_handover": "before each batch of the hand-over",
    "recovery.handover.after_plan": "a batch's plans stored, not yet assigned",
    "recovery.handover.after_assign": "a batch assigned, the dead owner's sets not yet cleared",
    "archive.after_write": "a run's Parquet object written and verified (rows, digest), its manifest not yet written",
    "archive.after_manifest": "the manifest written, no tombstone yet",
    "archive.after_tombstones": "the run's keys tombstoned in the three topics, its Redis state not yet removed",
}
"""Every failpoint production code hits, and where: the crash matrices arm each one
(tests/faults/test_registry.py fails on a hit missing here, or on one no test arms)."""


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

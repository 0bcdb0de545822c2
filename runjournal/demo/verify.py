"""End-of-demo verification from independent sources.

* the topic (a fresh read_committed read and a fresh fold) — events, resumes, reconciles;
* Redis (the projection) — compared run by run with that fresh fold;
* the provider's SQLite ledger — how many times each side effect really ran;
* Qdrant — memory items and their provenance.
"""

from __future__ import annotations

import sqlite3
import statistics
from pathlib import Path
from typing import Any

from runjournal.consumers.inspect import read_all_events
from runjournal.consumers.projector.store import ProjectionStore
from runjournal.core import redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.demo.provider import ledger_stats
from runjournal.demo.workload import RunScript
from runjournal.model.reducer import RunStatus, fold, state_digest
from runjournal.producers.partitioner import partition_for
from runjournal.schemas import EventType

__all__ = ["verify"]

_TERMINAL = {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED}


def _percentile(values: list[int], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def verify(settings: Settings, scripts: list[RunScript], ledger_path: Path, partitions: int) -> dict[str, Any]:
    """The demo's summary figures (keys as ``runjournal demo --json`` prints them, without fleet counts)."""
    by_run = read_all_events(settings)
    client = redis_client.client(settings)
    store = ProjectionStore(client, settings.topic_prefix)
    completed = matches = mismatches = 0
    per_run: dict[str, dict[str, Any]] = {}
    for script in scripts:
        events = by_run.get(script.run_id, [])
        ref = fold(events)
        state = store.get(partition_for(script.run_id, partitions), script.run_id)
        same = (ref is None and state is None) or (
            ref is not None and state is not None and state_digest(ref) == state_digest(state))
        mismatches += 0 if same else 1
        done = state is not None and state.status in _TERMINAL
        completed += done
        ok = done and (state.status == RunStatus.SUCCEEDED) == script.succeeded
        matches += ok
        per_run[script.run_id] = {"status": state.status.value if state else None, "epoch": state.epoch if state else 0,
                                  "events": len(events), "projection_matches": same, "outcome_matches": ok,
                                  "calls": _call_classes(events)}
    resumed = {rid for rid, evs in by_run.items() if any(e.type == EventType.RUN_RESUMED for e, _, _ in evs)}
    reconciled = sum(1 for evs in by_run.values() for e, _, _ in evs if e.type == EventType.TOOL_CALL_RECONCILED)
    db = sqlite3.connect(str(ledger_path))
    ledger = ledger_stats(db)
    db.close()
    samples = [tuple(int(v) for v in x.decode().split(":"))
               for x in client.lrange(RedisKeys(settings.topic_prefix).projector_lag(), 0, -1)]
    lags = [lag for _, lag in samples]
    return {
        "runs_total": len(scripts),
        "runs_completed": completed,
        "runs_outcome_matches_input": matches,
        "events_published": sum(len(v) for v in by_run.values()),
        "runs_recovered": len(resumed),
        "side_effects_expected": sum(s.side_effects for s in scripts),
        "side_effects_executed": ledger["executions"],
        "side_effect_duplicates": sum(n - 1 for n in ledger["duplicates"].values()),
        "outcome_unknown_reconciled": reconciled,
        "projection_mismatches": mismatches,
        "projector_lag_ms_p50": _percentile(lags, 0.5),
        "projector_lag_ms_p99": _percentile(lags, 0.99),
        "projector_lag_ms_mean": round(statistics.fmean(lags), 1) if lags else None,
        "per_run": per_run,
        "series": {"events_per_s": _events_per_s(by_run), "lag_ms": sorted(samples)},
    }


def _call_classes(events: list[tuple[Any, int, int]]) -> list[dict[str, Any]]:
    """Each tool call of a run with its class: committed / reconciled / re-run safely / failed / unknown."""
    calls: dict[str, dict[str, Any]] = {}
    for e, _, _off in events:
        if not e.type.startswith("TOOL_CALL_"):
            continue
        c = calls.setdefault(e.payload["call_id"], {"call_id": e.payload["call_id"], "tool": e.payload["tool"],
                                                    "intents": 0, "epochs": set(), "first_seq": e.seq})
        c["epochs"].add(e.epoch)
        if e.type == EventType.TOOL_CALL_INTENDED:
            c["intents"] += 1
        elif e.type == EventType.TOOL_CALL_RECONCILED:
            c["reconciled"] = e.payload.get("outcome")
        elif e.type == EventType.TOOL_CALL_COMMITTED:
            c["committed"] = True
        elif e.type == EventType.TOOL_CALL_FAILED:
            c["failed"] = True
    out = []
    for c in calls.values():
        if c.get("reconciled") == "COMMITTED":
            cls = "reconciled"
        elif c.get("committed") and c["intents"] > 1:
            cls = "re-run safely"
        elif c.get("committed"):
            cls = "committed"
        else:
            cls = "failed" if c.get("failed") else "unknown"
        out.append({"call_id": c["call_id"][:12], "tool": c["tool"], "class": cls, "epochs": sorted(c["epochs"]),
                    "seq": c["first_seq"]})
    return sorted(out, key=lambda c: c["seq"])


def _events_per_s(by_run: dict[str, list[tuple[Any, int, int]]]) -> list[tuple[int, int]]:
    """``[(unix second, events)]`` from the events' ``occurred_at``."""
    buckets: dict[int, int] = {}
    for evs in by_run.values():
        for e, _, _ in evs:
            sec = int(e.occurred_at.timestamp())
            buckets[sec] = buckets.get(sec, 0) + 1
    return sorted(buckets.items())

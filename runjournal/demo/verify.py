"""End-of-demo verification from independent sources.

* the topic (a fresh read_committed read and a fresh fold) — events, resumes, reconciles;
* Redis (the projection) — compared run by run with that fresh fold;
* the input trajectories — each run's projected status and its committed calls (tool names and argument
  digests, in order) against the recorded run, computed here from the input (not from what agents reported);
* the agents' ack logs (``<workdir>/acks/*.jsonl``, written from the broker's delivery reports of committed
  transactions) — every acknowledged event must be in the topic at its partition and offset;
* Redis bookkeeping — no run unfinished, parked (GAP / BLOCKED / parked set) or orphaned (not terminal and in
  nobody's owned set, assignment list, claimed list or the queue: nobody would ever finish it);
* the provider's SQLite ledger — how many times each side effect really ran;
* Qdrant — memory items and their provenance (``runjournal.demo.memory_check``).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import statistics
from pathlib import Path
from typing import Any

from runjournal.consumers.ops.inspect import read_all_events
from runjournal.consumers.projector.store import ProjectionStore
from runjournal.core import redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.demo.agent import DemoKeys
from runjournal.demo.provider import ledger_stats
from runjournal.demo.workload import RunScript, turns
from runjournal.model.reducer import RunStatus, fold, state_digest
from runjournal.schemas import EventType
from runjournal.schemas.keys import partition_for

__all__ = ["verify"]

_TERMINAL = {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED}


def _percentile(values: list[int], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def verify(settings: Settings, scripts: list[RunScript], workdir: Path, partitions: int) -> dict[str, Any]:
    """The demo's summary figures (keys as ``runjournal demo --json`` prints them, without fleet counts).

    Args:
        settings: the demo's settings (its topic prefix).
        scripts: the input runs.
        workdir: the demo's folder (``ledger.db``, ``acks/``).
        partitions: the events topic's partition count.
    """
    by_run = read_all_events(settings)
    client = redis_client.client(settings)
    store = ProjectionStore(client, settings.topic_prefix)
    completed = matches = mismatches = 0
    per_run: dict[str, dict[str, Any]] = {}
    states: dict[str, Any] = {}
    for script in scripts:
        events = by_run.get(script.run_id, [])
        ref = fold(events)
        state = states[script.run_id] = store.get(partition_for(script.run_id, partitions), script.run_id)
        same = (ref is None and state is None) or (
            ref is not None and state is not None and state_digest(ref) == state_digest(state))
        mismatches += 0 if same else 1
        done = state is not None and state.status in _TERMINAL
        completed += done
        why = outcome_differs(script, state)
        matches += why is None
        per_run[script.run_id] = {"status": state.status.value if state else None, "epoch": state.epoch if state else 0,
                                  "events": len(events), "projection_matches": same, "outcome_matches": why is None,
                                  "outcome_differs": why, "calls": _call_classes(events)}
    resumed = {rid for rid, evs in by_run.items() if any(e.type == EventType.RUN_RESUMED for e, _, _ in evs)}
    reconciled = sum(1 for evs in by_run.values() for e, _, _ in evs if e.type == EventType.TOOL_CALL_RECONCILED)
    db = sqlite3.connect(str(workdir / "ledger.db"))
    ledger = ledger_stats(db)
    db.close()
    samples = [tuple(int(v) for v in x.decode().split(":"))
               for x in client.lrange(RedisKeys(settings.topic_prefix).projector_lag(), 0, -1)]
    lags = [lag for _, lag in samples]
    return {
        "runs_total": len(scripts),
        "runs_completed": completed,
        "runs_outcome_matches_input": matches,
        **_bookkeeping(client, settings.topic_prefix, states),
        **acked_events(workdir / "acks", by_run),
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


def args_digest(args: Any) -> str:
    """sha256 hex of the arguments' canonical JSON (sorted keys, no whitespace, UTF-8 kept) — the journal
    contract's ``args_digest``, computed here from the input, not by the code under test."""
    text = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def outcome_differs(script: RunScript, state: Any) -> str | None:
    """Why the projected run differs from the input trajectory, or None when it matches: the status (SUCCEEDED
    for reward 1, FAILED otherwise) and the committed calls — tool name and argument digest, in journal order
    — against the input's tool steps in order. Calls one model turn asks for at once (consecutive tool steps: the
    graph agent runs them in parallel, ``runjournal.demo.graph.turns``) may commit in any order among themselves;
    every turn must follow the one before."""
    if state is None:
        return "not in the projection"
    want_status = "SUCCEEDED" if script.succeeded else "FAILED"
    if str(state.status.value) != want_status:
        return f"status {state.status.value}, input says {want_status}"
    want = [(s.tool, args_digest(s.args)) for s in script.steps if s.kind == "tool"]
    got = [(rec.tool, rec.args_digest) for rec in sorted(state.records.values(), key=_journal_order)
           if _committed(rec)]
    if len(got) == len(want):
        got, want = _by_turn(script, got), _by_turn(script, want)
    if got != want:
        first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
        return f"committed calls differ at #{first}: {len(got)} committed, input has {len(want)}"
    return None


def _by_turn(script: RunScript, calls: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``calls`` (one per tool step) sorted within each model turn of ``script``, turns kept in order."""
    out: list[tuple[str, str]] = []
    at = 0
    for turn in turns(script):
        out += sorted(calls[at:at + len(turn)])
        at += len(turn)
    return out + calls[at:]


def _committed(rec: Any) -> bool:
    status = str(getattr(rec.status, "value", rec.status))
    outcome = str(getattr(rec.reconciled_outcome, "value", rec.reconciled_outcome))
    return status == "COMMITTED" or (status == "RECONCILED" and outcome == "COMMITTED")


def _journal_order(rec: Any) -> tuple[int, str]:
    offset = rec.intended_offset if rec.intended_offset is not None else rec.outcome_offset
    return (offset if offset is not None else 1 << 62, rec.call_id)


def acked_events(acks_dir: Path, by_run: dict[str, list[tuple[Any, int, int]]]) -> dict[str, int]:
    """``{"acked_events", "acked_events_missing"}``: acknowledgements in the agents' ack logs, and how many of
    them the topic (read_committed) does not hold — at the acked partition and offset with the acked key
    (by key alone when the delivery report's offset was not served)."""
    at = {(p, o): e.key for evs in by_run.values() for e, p, o in evs}
    keys = set(at.values())
    acked = missing = 0
    for log_file in sorted(acks_dir.glob("*.jsonl")) if acks_dir.is_dir() else []:
        for line in log_file.read_text().splitlines():
            try:
                ack = json.loads(line)
            except ValueError:
                continue  # a torn last line: that acknowledgement was never complete
            acked += 1
            found = at.get((ack["p"], ack["o"])) == ack["k"] if ack["o"] >= 0 else ack["k"] in keys
            missing += 0 if found else 1
    return {"acked_events": acked, "acked_events_missing": missing}


def _bookkeeping(client: Any, prefix: str, states: dict[str, Any]) -> dict[str, int]:
    """``runs_unfinished`` (not terminal), ``runs_parked`` (GAP / BLOCKED, or in ``rj:P:parked``) and
    ``runs_orphaned`` (not terminal and in no owned set, assignment list, claimed list or the queue)."""
    keys = DemoKeys(prefix)  # the journal's and the demo's own key functions: they follow the key layout
    held: set[str] = set()
    for key in redis_client.scan_keys(client, keys.owned_glob()):
        held |= {m.decode() for m in client.smembers(key)}
    for pattern in (keys.assign_glob(), keys.claimed_glob(), keys.queue):
        for key in redis_client.scan_keys(client, pattern):
            if client.type(key) == b"list":
                held |= {m.decode() for m in client.lrange(key, 0, -1)}
    parked_set = {m.decode() for m in client.smembers(RedisKeys(prefix).parked())}
    unfinished = [rid for rid, st in states.items() if st is None or st.status not in _TERMINAL]
    parked = [rid for rid, st in states.items()
              if rid in parked_set or (st is not None and st.status.value in ("GAP", "BLOCKED"))]
    return {"runs_unfinished": len(unfinished), "runs_parked": len(parked),
            "runs_orphaned": sum(1 for rid in unfinished if rid not in held)}


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

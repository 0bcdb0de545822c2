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

With the ``controls`` fault (``runjournal.demo.controls``) each operator action is checked against its rule from the
topic and the ledger (:func:`control_checks`): a cancelled run ends CANCELLED with no intent after its RUN_CANCELLED,
none without an outcome, and exactly the side effects the journal records committed executed, once each; the paused
and resumed run ends as its input says with each side effect once; a fork performs only the effects its dry run
listed in ``may_repeat`` and ends as its source's input says. A cancelled run's expected outcome is CANCELLED after
a prefix of its input's calls, and the expected side effects count what cancels and forks change; every other run
is held to its input as before.
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
from runjournal.demo.provider import ledger_by_run, ledger_stats
from runjournal.demo.workload import RunScript, turns
from runjournal.model.reducer import RunStatus, fold, state_digest
from runjournal.producers import idempotency_key
from runjournal.producers.spend import DIMS, SpendLedger, fold_spend, reconciled_charge
from runjournal.producers.tools import is_builtin
from runjournal.schemas import EventType
from runjournal.schemas.keys import partition_for

__all__ = ["control_checks", "outcome_differs", "verify"]

_TERMINAL = {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED}


def _percentile(values: list[int], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def verify(settings: Settings, scripts: list[RunScript], workdir: Path, partitions: int,
           controls: list[dict[str, Any]] | None = None, *, archive: dict[str, Any] | None = None) -> dict[str, Any]:
    """The demo's summary figures (keys as ``runjournal demo --json`` prints them, without fleet counts).

    Args:
        settings: the demo's settings (its topic prefix).
        scripts: the input runs.
        workdir: the demo's folder (``ledger.db``, ``acks/``).
        partitions: the events topic's partition count.
        controls: the ``controls`` faults' operator actions (``ControlAction.as_dict``), each checked here against
            its rule (:func:`control_checks`); returned as ``controls`` with ``checks`` and ``held``.
        archive: with the ``archiver`` fault, its last ``--until-caught-up`` pass (``rc``, ``stats``): a run gone
            from Redis and the topic is read from the demo's archive (``runjournal.demo.archive_check``) — its
            archived events join the topic's for every check, its state is their fold — and the archiver's own
            rules are returned as ``archive`` (None: no archiver ran).
    """
    controls = controls or []
    cancelled = {a["run_id"] for a in controls if a["action"] == "cancel" and a["outcome"] == "cancelled"}
    forks = {a["fork_run_id"]: a for a in controls if a["action"] == "fork" and a["outcome"] == "forked"}
    by_script = {s.run_id: s for s in scripts}
    by_run = read_all_events(settings)
    view = None
    if archive is not None:
        from runjournal.demo.archive_check import merge_events, read_archive

        view = read_archive(settings)
        by_run = merge_events(by_run, view)
    client = redis_client.client(settings)
    store = ProjectionStore(client, settings.topic_prefix)
    hot: dict[str, Any] = {}
    completed = matches = mismatches = 0
    per_run: dict[str, dict[str, Any]] = {}
    states: dict[str, Any] = {}
    checked = [(s.run_id, s, None) for s in scripts] + [(fid, by_script[a["run_id"]], a["run_id"])
                                                          for fid, a in sorted(forks.items())]
    for run_id, script, fork_of in checked:
        events = by_run.get(run_id, [])
        ref = fold(events)
        state = hot[run_id] = store.get(partition_for(run_id, partitions), run_id)
        if state is None and view is not None and run_id in view.events:  # archived: its state is the archive's
            state = fold(view.events[run_id])
        states[run_id] = state
        same = (ref is None and state is None) or (
            ref is not None and state is not None and state_digest(ref) == state_digest(state))
        mismatches += 0 if same else 1
        why = outcome_differs(script, state, cancelled=run_id in cancelled)
        if fork_of is None:
            completed += state is not None and state.status in _TERMINAL
            matches += why is None
        per_run[run_id] = {"status": state.status.value if state else None, "epoch": state.epoch if state else 0,
                           "events": len(events), "projection_matches": same, "outcome_matches": why is None,
                           "outcome_differs": why, "calls": _call_classes(events),
                           **({"expected": "CANCELLED (cancelled by an operator)"} if run_id in cancelled else {}),
                           **({"fork_of": fork_of} if fork_of else {}),
                           **({"archived": view.manifests[run_id]["object_url"]}
                              if view is not None and run_id in view.manifests else {})}
    resumed = {rid for rid, evs in by_run.items() if any(e.type == EventType.RUN_RESUMED for e, _, _ in evs)}
    reconciled = sum(1 for evs in by_run.values() for e, _, _ in evs if e.type == EventType.TOOL_CALL_RECONCILED)
    db = sqlite3.connect(str(workdir / "ledger.db"))
    ledger, executed = ledger_stats(db), ledger_by_run(db)
    db.close()
    samples = [tuple(int(v) for v in x.decode().split(":"))
               for x in client.lrange(RedisKeys(settings.topic_prefix).projector_lag(), 0, -1)]
    lags = [lag for _, lag in samples]
    checked_controls = control_checks(controls, by_script, by_run, states, per_run, executed)
    spend = spend_checks(settings, client, checked, states)
    archived = None
    if view is not None:
        from runjournal.demo.archive_check import archive_checks

        archived = {**archive_checks(settings, client, view, [rid for rid, _s, _f in checked], hot, archive),
                    "final": archive}
    return {
        "runs_total": len(scripts),
        "runs_completed": completed,
        "runs_outcome_matches_input": matches,
        **_bookkeeping(client, settings.topic_prefix, states),
        **acked_events(workdir / "acks", by_run),
        "events_published": sum(len(v) for v in by_run.values()),
        "runs_recovered": len(resumed),
        "side_effects_expected": _expected_effects(scripts, cancelled, forks, by_run),
        "side_effects_executed": ledger["executions"],
        "side_effect_duplicates": sum(n - 1 for n in ledger["duplicates"].values()),
        "outcome_unknown_reconciled": reconciled,
        "projection_mismatches": mismatches,
        "projector_lag_ms_p50": _percentile(lags, 0.5),
        "projector_lag_ms_p99": _percentile(lags, 0.99),
        "projector_lag_ms_mean": round(statistics.fmean(lags), 1) if lags else None,
        "spend": spend,
        "spend_mismatches": len(spend["mismatches"]),
        "runs_cancelled": len(cancelled),
        "runs_forked": len(forks),
        "controls": checked_controls,
        "controls_ok": all(c["held"] for c in checked_controls),
        "archive": archived,
        "per_run": per_run,
        "series": {"events_per_s": _events_per_s(by_run), "lag_ms": sorted(samples)},
    }


def _expected_effects(scripts: list[RunScript], cancelled: set[str], forks: dict[str, dict[str, Any]],
                      by_run: dict[str, list[tuple[Any, int, int]]]) -> int:
    """Side effects that must have executed: every input run's, from its input — but a cancelled run's are those
    its journal records committed (its ledger rows are checked against them, :func:`control_checks`) — plus, for
    each fork, the effects its dry run listed in ``may_repeat`` (it ends as its source's input says, so it reaches
    each once under its own new key)."""
    total = sum(s.side_effects for s in scripts if s.run_id not in cancelled)
    total += sum(len(_effects(_in_order(by_run.get(rid, [])))[1]) for rid in cancelled)
    return total + sum(len(a["may_repeat"]) for a in forks.values())


def args_digest(args: Any) -> str:
    """sha256 hex of the arguments' canonical JSON (sorted keys, no whitespace, UTF-8 kept) — the journal
    contract's ``args_digest``, computed here from the input, not by the code under test."""
    text = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def outcome_differs(script: RunScript, state: Any, *, cancelled: bool = False) -> str | None:
    """Why the projected run differs from the input trajectory, or None when it matches: the status (SUCCEEDED
    for reward 1, FAILED otherwise) and the committed calls — tool name and argument digest, in journal order
    — against the input's tool steps in order. Calls one model turn asks for at once (consecutive tool steps: the
    graph agent runs them in parallel, ``runjournal.demo.graph.turns``) may commit in any order among themselves;
    every turn must follow the one before. A run an operator ``cancelled`` must be CANCELLED, its committed calls a
    prefix of the input's (a turn cut short: any of its calls)."""
    if state is None:
        return "not in the projection"
    want_status = "CANCELLED" if cancelled else "SUCCEEDED" if script.succeeded else "FAILED"
    if str(state.status.value) != want_status:
        return f"status {state.status.value}, {'an operator cancelled it' if cancelled else 'input says'} " \
               f"{want_status}"
    want = [(s.tool, args_digest(s.args)) for s in script.steps if s.kind == "tool"]
    got = [(rec.tool, rec.args_digest) for rec in sorted(state.records.values(), key=_journal_order)
           if _committed(rec) and not is_builtin(rec.tool)]  # spend steps are the journal's, not the script's
    if cancelled and len(got) <= len(want):
        return _prefix_differs(script, got, want)
    if len(got) == len(want):
        got, want = _by_turn(script, got), _by_turn(script, want)
    if got != want:
        first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
        return f"committed calls differ at #{first}: {len(got)} committed, input has {len(want)}"
    return None


def _prefix_differs(script: RunScript, got: list[tuple[str, str]], want: list[tuple[str, str]]) -> str | None:
    """Why ``got`` (committed calls in journal order) is not a prefix of ``want`` (the input's), turn by turn: each
    whole turn the same calls in any order, the last (cut) turn a part of its calls."""
    at = 0
    for turn in turns(script):
        part = got[at:at + len(turn)]
        if not part:
            return None
        expected = want[at:at + len(turn)]
        if len(part) == len(turn) and sorted(part) != sorted(expected):
            return f"committed calls differ in the turn at call #{at}"
        if len(part) < len(turn):
            rest = list(expected)
            for call in part:
                if call not in rest:
                    return f"committed call #{at + part.index(call)} is not one of its turn's"
                rest.remove(call)
            return None  # a cut turn is the last: got ends inside it
        at += len(turn)
    return None if at >= len(got) else f"{len(got)} committed, input has {len(want)}"


def control_checks(controls: list[dict[str, Any]], scripts: dict[str, RunScript],
                   by_run: dict[str, list[tuple[Any, int, int]]], states: dict[str, Any],
                   per_run: dict[str, dict[str, Any]], executed: dict[str, dict[str, int]]) -> list[dict[str, Any]]:
    """Each operator action of the ``controls`` faults with the rule it must hold, checked from the topic
    (``by_run``: a fresh read), the projection (``states``, ``per_run``) and the provider's ledger (``executed``:
    run id -> key -> executions): the action's dict plus ``checks`` (``{check, held, observed}``: the live checks
    made as it happened, then these) and ``held`` (every check held). See the module docstring for the rules."""
    out = []
    for action in controls:
        checks = [{"check": name, "held": bool(ok), "observed": "as it happened"}
                  for name, ok in action.get("live", {}).items()]
        run_id = action["run_id"]
        events = _in_order(by_run.get(run_id, []))
        if action["action"] == "cancel" and action["outcome"] == "cancelled":
            checks += _cancel_rules(events, per_run.get(run_id, {}), executed.get(run_id, {}))
        elif action["action"] == "pause" and action["outcome"] == "paused":
            paused = [e for e in events if e.type == EventType.RUN_RESUMED and e.payload.get("paused")]
            checks.append(_check("the journal holds its pause (RUN_RESUMED paused, no owner)", bool(paused),
                                 f"{len(paused)} RUN_RESUMED paused"))
        elif action["action"] == "resume" and action["outcome"] == "resumed":
            checks += _resume_rules(events, scripts[run_id], per_run.get(run_id, {}), executed.get(run_id, {}))
        elif action["action"] == "fork" and action["outcome"] == "forked":
            fork_id = action["fork_run_id"]
            checks += _fork_rules(action, _in_order(by_run.get(fork_id, [])), scripts[run_id],
                                  per_run.get(fork_id, {}), states.get(fork_id), executed.get(fork_id, {}))
        out.append({**action, "checks": checks, "held": bool(checks) and all(c["held"] for c in checks)})
    return out


def _check(name: str, held: bool, observed: str) -> dict[str, Any]:
    return {"check": name, "held": bool(held), "observed": observed}


def _in_order(events: list[tuple[Any, int, int]]) -> list[Any]:
    """A run's events in journal order (one partition: by offset)."""
    return [e for e, _p, _o in sorted(events, key=lambda x: (x[1], x[2]))]


def _effects(events: list[Any]) -> tuple[set[str], set[str]]:
    """(keys of the run's side-effect intents, keys of those the journal records committed — COMMITTED or
    RECONCILED with outcome COMMITTED)."""
    intended = {e.payload["idempotency_key"] for e in events
                if e.type == EventType.TOOL_CALL_INTENDED and e.payload.get("side_effect")
                and not is_builtin(e.payload["tool"])}  # a spend step's effect is on the ledger, not the provider
    committed = {e.payload["call_id"] for e in events if e.type == EventType.TOOL_CALL_COMMITTED
                 or (e.type == EventType.TOOL_CALL_RECONCILED and e.payload.get("outcome") == "COMMITTED")}
    return intended, intended & committed


def _cancel_rules(events: list[Any], info: dict[str, Any], ran: dict[str, int]) -> list[dict[str, Any]]:
    """A cancelled run: CANCELLED, no intent after RUN_CANCELLED, none without an outcome, each side effect executed
    at most once and exactly when the journal records it committed (the ledger is the witness)."""
    types = [e.type for e in events]
    at = types.index(EventType.RUN_CANCELLED) if EventType.RUN_CANCELLED in types else None
    late = [e.seq for e in events[at + 1:] if e.type == EventType.TOOL_CALL_INTENDED] if at is not None else []
    open_calls: dict[str, int] = {}
    for e in events:
        if e.type == EventType.TOOL_CALL_INTENDED:
            open_calls[e.payload["call_id"]] = e.seq
        elif e.type in (EventType.TOOL_CALL_COMMITTED, EventType.TOOL_CALL_FAILED, EventType.TOOL_CALL_RECONCILED):
            open_calls.pop(e.payload["call_id"], None)
    _intended, committed = _effects(events)
    twice = {k: n for k, n in ran.items() if n > 1}
    return [
        _check("ended CANCELLED after a prefix of its input's calls", info.get("outcome_matches", False)
               and at is not None, f"status {info.get('status')}; {info.get('outcome_differs') or 'calls a prefix'}"),
        _check("no intent after its RUN_CANCELLED", at is not None and not late,
               f"RUN_CANCELLED at seq {events[at].seq if at is not None else None}; intents after: {late}"),
        _check("no intent without an outcome", not open_calls, f"open: {sorted(open_calls.values())}"),
        _check("each side effect executed at most once, exactly those the journal records committed",
               not twice and set(ran) == committed,
               f"ledger {len(ran)} key(s), journal {len(committed)} committed, executed twice: {len(twice)}, "
               f"ledger only: {len(set(ran) - committed)}, journal only: {len(committed - set(ran))}"),
    ]


def _resume_rules(events: list[Any], script: RunScript, info: dict[str, Any],
                  ran: dict[str, int]) -> list[dict[str, Any]]:
    """The paused and resumed run: its resume in the journal after its pause, ended as its input says, each side
    effect once."""
    pauses = [i for i, e in enumerate(events) if e.type == EventType.RUN_RESUMED and e.payload.get("paused")]
    resumes = [i for i, e in enumerate(events) if e.type == EventType.RUN_RESUMED and not e.payload.get("paused")
               and e.payload.get("requested_by") and pauses and i > pauses[0]]
    _intended, committed = _effects(events)
    return [
        _check("the journal holds its resume after its pause", bool(resumes),
               f"pause at #{pauses[:1]}, resumes requested after it at #{resumes[:1]}"),
        _check("ended as its input says", info.get("outcome_matches", False),
               f"status {info.get('status')}; {info.get('outcome_differs') or 'as recorded'}"),
        _check("each side effect executed once", set(ran) == committed and all(n == 1 for n in ran.values())
               and len(ran) == script.side_effects,
               f"ledger {sum(ran.values())} execution(s) of {len(ran)} key(s), input has {script.side_effects}"),
    ]


def _fork_rules(action: dict[str, Any], events: list[Any], script: RunScript, info: dict[str, Any], state: Any,
                ran: dict[str, int]) -> list[dict[str, Any]]:
    """A fork: its RUN_STARTED names its source and point, it ends as its source's input says, and the effects it
    performed (the ledger's rows under its run id) are only those its dry run listed in ``may_repeat`` — a call
    keyed by step ``step<i>`` (the demo agents' keys) runs under the fork's key of that step, so the listed source
    keys name the fork's keys allowed."""
    source, fork_id = action["run_id"], action["fork_run_id"]
    listed = set(action["may_repeat"])
    allowed = {idempotency_key(fork_id, f"#step{i}", 1) for i in range(len(script.steps))
               if idempotency_key(source, f"#step{i}", 1) in listed}
    started = events[0].payload if events and events[0].type == EventType.RUN_STARTED else {}
    unlisted = sorted(set(ran) - allowed)
    return [
        _check("its RUN_STARTED names its source and fork point",
               started.get("forked_from") == source and started.get("forked_at_seq") == action["at_seq"],
               f"forked_from {started.get('forked_from')}, at seq {started.get('forked_at_seq')}"),
        _check("ended as its source's input says", info.get("outcome_matches", False)
               and info.get("projection_matches", False) and state is not None,
               f"status {info.get('status')}; {info.get('outcome_differs') or 'as recorded'}"),
        _check("performed only effects its dry run listed in may_repeat", not unlisted,
               f"{len(ran)} executed under {fork_id}, {len(listed)} listed, not listed: {len(unlisted)}"),
        _check("each of its effects executed once", all(n == 1 for n in ran.values()),
               f"executed twice: {sum(1 for n in ran.values() if n > 1)}"),
    ]


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


def spend_checks(settings: Settings, client: Any, checked: list[tuple[str, RunScript, str | None]],
                 states: dict[str, Any]) -> dict[str, Any]:
    """Model spend charged exactly once (docs/design/decisions/0053-spend-ledger.md): for every run, the ledger's
    run scope equals the fold of its projected records (settled + open, a fork's copied spend included), and each
    tenant's ledger equals the sum of its runs' (``used - base``: a fork's copied spend is never charged again).

    Returns ``{"currency", "tenants": {tenant: {"used", "open", "limit"}}, "runs_with_spend", "mismatches": [...]}``
    (amounts in base units: tokens, calls, micro-units of the currency).
    """
    ledger = SpendLedger(client, settings.topic_prefix, settings.spend_policy())
    mismatches: list[str] = []
    sums: dict[str, dict[str, int]] = {}
    with_spend = 0
    keys = RedisKeys(settings.topic_prefix)
    for run_id, _script, fork_of in checked:
        state = states.get(run_id)
        if state is None:
            continue
        tenant = state.tenant_id or ""
        # the journal's fold; a step whose outcome it does not record (its owner died inside it and the run ended
        # without a resume) is answered by the ledger by key, as a resume's reconcile would
        folded = reconciled_charge(fold_spend(state.records.values()), ledger, tenant, run_id)
        scope = ledger.scope(tenant, "run", run_id)
        used = {d: scope["used"].get(d, 0) for d in DIMS}
        if fork_of and client.hget(keys.spend_run(tenant, run_id), "init") is None:
            # a fork that took no step of its own after its fork point: its ledger scope never started (it starts at
            # a run's first reserve or settle, from the recorded spend: producers.spend), so its spend is all copied
            # — its base, never charged to the tenant
            scope = {**scope, "base": dict(folded)}
            used = dict(folded)
        if used != folded:
            mismatches.append(f"run {run_id}: ledger {used} != journal {folded}")
        with_spend += any(folded.values())
        total = sums.setdefault(tenant, dict.fromkeys(DIMS, 0))
        for d in DIMS:
            total[d] += used[d] - scope["base"].get(d, 0)
    tenants: dict[str, Any] = {}
    for tenant, total in sorted(sums.items()):
        scope = ledger.scope(tenant)
        used = {d: scope["used"].get(d, 0) for d in DIMS}
        if used != total:
            mismatches.append(f"tenant {tenant}: ledger {used} != its runs' {total}")
        tenants[tenant] = {"used": used, "open": {d: scope["open"].get(d, 0) for d in DIMS},
                           "limit": scope["limit"]}
    return {"currency": settings.spend_currency, "tenants": tenants, "runs_with_spend": with_spend,
            "mismatches": mismatches[:20]}

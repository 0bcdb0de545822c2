"""``runjournal demo``: the agent fleet, the fault campaign, recovery and verification in one command.

Numbered as in :func:`run_demo`:

1. A fresh topic prefix (``demo-<utc time>-<seed>``): its own topics, Redis keys, Qdrant collection and,
   with a schema registry, its own subject (registered like ``schemas publish`` does).
2. The workload (tau-bench JSON files, or a generated one with approvals) is written for the agents.
3. Services: the provider (its ledger is the witness), the projector, the memory extractor, the recovery
   service (``runjournal.demo.recoverer``, a process of its own: stale passes every 0.5 s), the approver.
4. The work queue is filled; N agent instances start taking runs.
5. Until every run is terminal in the projection: the fault campaign (``runjournal.demo.faults``) injects
   its seeded schedule by progress — agent SIGKILLs (``--kills``, or ``--kill-every`` by clock), zombies,
   restarts under the same producer_id, projector kills and stalls, the events leader broker, Redis,
   the recovery service at a step of a pass, the memory extractor, Qdrant and the registry away for a
   window, operators pausing, resuming, cancelling and forking runs — and replacements start (some armed to
   die inside a tool call).
6. Quiesce: agents finish, the projector and the memory extractor catch up.
7. Verify from independent sources (topic, projection, ledger, the agents' ack logs, Qdrant) and report.
8. Unless ``--keep``: remove what step 1 created (``runjournal.demo.cleanup``).

Before step 1 the stack is checked (``preflight``): no broker or no Redis is reported within 5 s with the
command that fixes it (``runjournal stack up``), not a 30 s hang and a raw KafkaException; a fault the stack
cannot take (``broker`` on one node, ``registry`` without one) is refused before anything starts.
"""

from __future__ import annotations

import importlib.util
import logging
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from runjournal.consumers.projector import Projector
from runjournal.consumers.projector.store import ProjectionStore
from runjournal.consumers.runtime.topic_identity import preflight
from runjournal.core import redis_client
from runjournal.core.errors import RunjournalError
from runjournal.core.settings import Settings
from runjournal.demo import services
from runjournal.demo.agent import DemoKeys
from runjournal.demo.cleanup import remove_demo
from runjournal.demo.faults import ARCHIVE_RETENTION_S, KINDS, Campaign, Scheduled, parse_faults, schedule
from runjournal.demo.fleet import Fleet, write_workload
from runjournal.demo.spend import with_spend_defaults
from runjournal.demo.stackctl import StackControl, StackControlError
from runjournal.demo.verify import verify
from runjournal.demo.workload import RunScript, WorkloadError, generated_workload, load_tau_bench
from runjournal.deploy.procs import free_port
from runjournal.deploy.topics import create_topics
from runjournal.model.reducer import RunStatus
from runjournal.schemas.keys import partition_for

__all__ = ["DemoOptionError", "DemoOptions", "plan_faults", "run_demo"]

log = logging.getLogger("runjournal.demo")
_TERMINAL = {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED}
_STACK_KINDS = {"broker", "broker_stall", "redis", "registry"}


class DemoOptionError(RunjournalError, ValueError):
    """A ``runjournal demo`` option out of range, or an ``--input`` that is not a readable tau-bench trajectory
    file: named before anything is created (no topic, no process)."""


@dataclass
class DemoOptions:
    """``runjournal demo`` options (see the CLI help). :meth:`check` validates them (``run_demo`` calls it first)."""

    inputs: list[Path] = field(default_factory=list)
    agents: int = 4
    kills: int = 10
    kill_every_s: float | None = None
    seed: int = 1
    provider_idempotency: bool = False
    partitions: int = 6
    generated_runs: int = 60
    provider_latency_ms: float = 20.0
    memory: bool = True
    knowledge: list[Path] = field(default_factory=list)
    timeout_s: float = 900.0
    arm_fraction: float = 0.3
    keep: bool = False
    faults: str = "agents,projector"
    """``--faults``: ``all``, ``none`` or kinds (``runjournal.demo.faults.KINDS``)."""
    fault_times: int = 1
    """``--fault-times``: each kind at least this many times (agent kills: ``max(kills, fault_times)``)."""
    outcome_commit: str | None = None
    """``--outcome-commit``: the agents' ``group`` or ``strict`` outcome mode; None: the settings'
    (``RUNJOURNAL_OUTCOME_COMMIT``, default ``group``)."""


    def check(self) -> list[RunScript]:
        """Validate every option and load the workload, before anything is created; returns the run scripts.

        Raises:
            DemoOptionError: a count below its minimum (``--agents``, ``--runs``, ``--partitions``,
                ``--fault-times`` ≥ 1; ``--kills`` ≥ 0), an interval or timeout not > 0 (``--kill-every``), an
                ``--input`` that cannot be read or is not a tau-bench trajectory array, or one with no run.
        """
        for name, value, least in (("--agents", self.agents, 1), ("--runs", self.generated_runs, 1),
                                   ("--partitions", self.partitions, 1), ("--fault-times", self.fault_times, 1),
                                   ("--kills", self.kills, 0)):
            if value < least:
                raise DemoOptionError(f"{name} must be at least {least}, got {value}")
        for name, seconds in (("--kill-every", self.kill_every_s), ("timeout_s", self.timeout_s)):
            if seconds is not None and not seconds > 0:
                raise DemoOptionError(f"{name} must be > 0 seconds, got {seconds}")
        if not self.inputs:
            return generated_workload(self.generated_runs, seed=self.seed)
        scripts: list[RunScript] = []
        for path in self.inputs:
            try:
                loaded = load_tau_bench(path)
            except OSError as exc:
                raise DemoOptionError(f"--input {path}: cannot be read ({exc.strerror or exc})") from exc
            except WorkloadError as exc:
                raise DemoOptionError(f"--input {exc}: give a tau-bench trajectory JSON array "
                                      "(../shared/data/trajectories/)") from exc
            if not loaded:
                raise DemoOptionError(f"--input {path}: the array holds no run")
            scripts.extend(loaded)
        return scripts


def _load(opts: DemoOptions) -> list[RunScript]:
    return opts.check()


def plan_faults(opts: DemoOptions, settings: Settings) -> tuple[list[Scheduled], dict[str, str], StackControl | None]:
    """The seeded fault schedule for ``opts`` on this stack: ``(plan, kinds left out of all with why, stack)``.

    Raises:
        FaultSpecError: ``--faults`` names an unknown kind or one this stack cannot take.
    """
    try:
        stack: StackControl | None = StackControl(settings)
        no_stack = None
    except StackControlError as exc:
        stack, no_stack = None, str(exc)
    allowed: dict[str, str | None] = dict.fromkeys(KINDS)
    for kind in _STACK_KINDS:
        allowed[kind] = no_stack
    if stack is not None:
        allowed["broker"] = allowed["broker_stall"] = None if stack.brokers >= 3 else \
            "needs a replicated cluster: `runjournal stack up --brokers 3`"
        allowed["registry"] = None if stack.has_registry else \
            "no schema registry in use (`runjournal stack up --registry`)"
    if importlib.util.find_spec("pyarrow") is None or importlib.util.find_spec("fsspec") is None:
        allowed["archiver"] = "the archive is not installed (pip install 'runjournal[archive]')"
    if importlib.util.find_spec("langgraph") is None:
        allowed["graph"] = "LangGraph is not installed (pip install 'runjournal[langgraph]')"
    if not opts.memory:
        allowed["memory"] = allowed["qdrant"] = "the demo runs without memory (--no-memory)"
    elif settings.qdrant_url:
        allowed["qdrant"] = "a Qdrant server (RUNJOURNAL_QDRANT_URL) is not the demo's to stop"
    kinds, skipped = parse_faults(opts.faults, allowed=allowed)
    plan = schedule(kinds, times=max(1, opts.fault_times), kills=0 if opts.kill_every_s else opts.kills,
                    rng=random.Random(opts.seed))
    return plan, skipped, stack


def _completed(store: ProjectionStore, scripts: list[RunScript], partitions: int,
               archived: Callable[[str], bool] | None = None) -> int | None:
    """Runs terminal in the projection, plus (``archived``: the archiver is on) runs gone from it that the archive
    holds; None while Redis is away (the campaign may have killed it)."""
    by_p: dict[int, list[str]] = {}
    for s in scripts:
        by_p.setdefault(partition_for(s.run_id, partitions), []).append(s.run_id)
    try:
        done = 0
        for p, ids in by_p.items():
            states = store.load(p, ids)
            done += sum(1 for st in states.values() if st.status in _TERMINAL)
            if archived is not None:
                done += sum(1 for rid in ids if rid not in states and archived(rid))
        return done
    except redis.RedisError:
        return None


def _archive_probe(settings: Settings) -> Callable[[str], bool]:
    """``run_id -> True`` when the demo's archive holds the run's manifest (decision 0056)."""
    from runjournal.consumers.archive.store import manifest_path
    from runjournal.stores.object_store import filesystem

    fs, root = filesystem(settings)
    return lambda run_id: bool(fs.exists(manifest_path(root, run_id)))


def run_demo(opts: DemoOptions, *, progress: Any = None,
             on_plan: Callable[[list[Scheduled], dict[str, str]], None] | None = None) -> dict[str, Any]:
    """Run the demo end to end; returns the summary dict (``ok`` says whether every check held).

    Args:
        opts: the options.
        progress: called ``(done, total, fleet)`` about every 0.2 s.
        on_plan: called once with the fault schedule (and the kinds ``all`` left out, with why) before the
            fleet starts — the CLI prints it.

    Raises:
        StackUnavailableError: no broker or no Redis answers (within 5 s; the message says ``runjournal stack up``).
        FaultSpecError: ``--faults`` names an unknown kind or one this stack cannot take.
        StoreLockedError: another process holds the embedded Qdrant directory (memory on); nothing was created.
        DemoOptionError: an option out of range or a bad ``--input`` (:meth:`DemoOptions.check`); nothing was
            created.
        Anything that fails once it has started: without ``keep`` its topics, keys and work folder are removed
        first, and every process it started is stopped.
    """
    started, started_wall = time.monotonic(), time.time()
    opts.check()  # every option and input, before anything is created
    rng = random.Random(opts.seed)
    base = Settings.load()
    preflight(base, need_topic=False)
    prefix = f"demo-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}-{opts.seed}"
    settings = base.model_copy(update={"topic_prefix": prefix, "partitions": opts.partitions,  # 1
                                       "outcome_commit": opts.outcome_commit or base.outcome_commit})
    settings = with_spend_defaults(settings)  # budgets on: every model turn reserved and settled (demo/spend.py)
    if settings.encryption == "on" and not settings.memory_key_grant:  # the demo's extractor is its operator's own:
        settings = settings.model_copy(update={"memory_key_grant": "*"})  # granted, so sealed runs make memory too
    if opts.memory:
        _check_qdrant(settings)
    plan, skipped, stack = plan_faults(opts, settings)
    if on_plan:
        on_plan(plan, skipped)
    workdir = settings.stack_dir / "demo" / prefix
    if any(s.kind == "archiver" for s in plan):  # a short retention, an archive of the demo's own (in its workdir)
        settings = settings.model_copy(update={"retention_s": ARCHIVE_RETENTION_S, "retention_overrides": {},
                                               "archive_url": f"file://{workdir / 'archive'}"})
    previous = _interrupt_on_termination()
    try:
        return _run(opts, settings, (plan, skipped, stack), rng, (started, started_wall), progress, workdir)
    except BaseException:
        if not opts.keep:  # what it created goes with a failure too (unless --keep)
            _remove_after_failure(settings, workdir)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _interrupt_on_termination() -> dict[int, Any]:
    """SIGTERM and SIGHUP (a supervisor, a closed terminal) stop the demo as Ctrl-C does — its children run in their
    own sessions, so only the demo can stop them; the previous handlers, to put back (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    return {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}


def _check_qdrant(settings: Settings) -> None:
    """Before anything is created: the embedded Qdrant directory must be free for the demo's memory extractor.

    Raises:
        StoreLockedError: another process holds it (a ``runjournal memory-extractor`` of your own?) — the demo
            would run its whole fleet and fail at the end.
    """
    if settings.qdrant_url or importlib.util.find_spec("qdrant_client") is None:
        return
    from runjournal.consumers.vectors.errors import StoreLockedError
    from runjournal.consumers.vectors.qdrant import open_client

    try:
        client, _ = open_client(settings, wait_s=0)
    except StoreLockedError as exc:
        raise StoreLockedError(
            f"the embedded Qdrant directory {settings.effective_qdrant_path} is held by another process (a running "
            "`runjournal memory-extractor`?): stop it, run the demo with --no-memory, or point it elsewhere with "
            "RUNJOURNAL_QDRANT_PATH / RUNJOURNAL_QDRANT_URL") from exc
    client.close()


def _remove_after_failure(settings: Settings, workdir: Path) -> None:
    try:
        left = remove_demo(settings, workdir)["cleanup_errors"]
    except Exception as exc:  # noqa: BLE001 - the demo's own failure is what the caller must see
        left = [f"{type(exc).__name__}: {exc}"]
    if left:
        log.warning("the failed demo's data was not all removed", extra={"prefix": settings.topic_prefix,
                                                                         "errors": left})


def _run(opts: DemoOptions, settings: Settings, faults_plan: tuple[list[Scheduled], dict[str, str], Any],
         rng: random.Random, clocks: tuple[float, float], progress: Any, workdir: Path) -> dict[str, Any]:
    """The demo once its settings and fault plan are fixed (steps 1-8 of the module docstring)."""
    plan, skipped, stack = faults_plan
    started, started_wall = clocks
    prefix = settings.topic_prefix
    create_topics(settings, opts.partitions)
    registered = services.register_subject(settings)
    scripts = _load(opts)  # 2
    workdir.mkdir(parents=True, exist_ok=True)
    write_workload(workdir / "workload.json", scripts)
    env = services.child_env(settings)
    port = free_port()  # 3
    provider = subprocess.Popen([sys.executable, "-m", "runjournal.demo.provider", "--db", str(workdir / "ledger.db"),
                                 "--port", str(port), "--idempotency", "on" if opts.provider_idempotency else "off",
                                 "--latency-ms", str(opts.provider_latency_ms)], env=env,
                                start_new_session=True)  # a Ctrl-C reaches the demo, which stops it
    fleet = Fleet(env=env, workdir=workdir, workload_path=workdir / "workload.json",
                  provider_url=f"http://127.0.0.1:{port}", rng=rng)
    approver: services.Approver | None = None
    campaign: Campaign | None = None
    try:  # every process it starts is stopped, whatever fails (a locked Qdrant directory, a broker gone …)
        services.wait_http(f"http://127.0.0.1:{port}/health")
        fleet.start_projector()
        knowledge = services.ingest_knowledge(settings, opts.knowledge) if opts.memory else []
        fleet.advice = opts.memory and services.start_memory(fleet, settings)
        fleet.start_recoverer()
        if any(s.kind == "archiver" for s in plan):
            fleet.start_archiver()
        approver = services.Approver(settings)
        keys = DemoKeys(prefix)
        r = redis_client.client(settings, socket_timeout=10)
        campaign = Campaign(fleet, settings, plan, rng, stack=stack,
                            restart_memory=fleet.start_memory if fleet.memory is not None else None)
        held = set(campaign.hold_bait(scripts, keys.queue, keys.bait, keys.controls))
        r.rpush(keys.queue, *[s.run_id for s in scripts if s.run_id not in held])  # 4
        for _ in range(opts.agents):
            fleet.spawn_agent(arm_failpoint=False)
        done = _chaos_loop(opts, settings, scripts, fleet, campaign, rng, progress)  # 5
        campaign.close()
        _wait_redis(r)
        r.set(keys.done, "1")  # 6
        _quiesce(fleet)
        fleet.stop_all()
        approver.close()
        Projector(settings).run(until_caught_up=True, idle_timeout_s=120)
        archiver_final = services.finish_archiver(fleet, env) if fleet.archiver is not None else None
        memory_report = services.finish_memory(fleet, env) if fleet.memory is not None else {}
    finally:
        if approver is not None:
            approver.stop.set()
        if campaign is not None:  # a fault still running restores what it broke and starts nothing more
            campaign.abort()
        fleet.stop_all()
        provider.terminate()
        provider.wait(10)
    summary = verify(settings, scripts, workdir, opts.partitions, campaign.controls,  # 7
                     archive=archiver_final)
    recoveries, recovery_errors = services.read_recoveries(workdir / "recovery.jsonl", fleet, started_wall)
    summary.update(services.contexts_summary(r, keys, summary["per_run"]), knowledge_documents=knowledge)
    requested = {s.kind for s in plan}
    faults = campaign.counts()
    summary.update(
        agents=fleet.generation, crashes_injected=fleet.crashes_injected, projector_kills=fleet.projector_kills,
        recovery_passes=len(recoveries), approvals_granted=approver.granted, recovery_errors=recovery_errors[:5],
        faults_injected=faults, faults_requested={k: _wanted(k, opts) for k in sorted(requested)},
        faults_skipped=skipped, fault_errors=campaign.errors, fault_schedule=[vars(s) for s in plan],
        service_exits=fleet.service_exits, registry_subject=registered, archiver_kills=fleet.archiver_kills,
        elapsed_s=round(time.monotonic() - started, 1), topic_prefix=prefix, finished_in_time=done,
        provider_idempotency="on" if opts.provider_idempotency else "off", workdir=str(workdir),
        outcome_commit=settings.outcome_commit, **memory_report)
    summary["faults_ok"] = all(faults.get(k, 0) >= _wanted(k, opts) for k in requested) and summary["controls_ok"]
    summary["checks"] = _checks(summary, memory=fleet.memory is not None)
    summary["ok"] = all(c["held"] for c in summary["checks"])
    summary["timeline"] = fleet.timeline()
    summary["recoveries"] = recoveries
    summary["kept"] = opts.keep
    if not opts.keep:  # 8
        summary["cleanup"] = remove_demo(settings, workdir)
    return summary


def _wanted(kind: str, opts: DemoOptions) -> int:
    times = max(1, opts.fault_times)
    return max(0 if opts.kill_every_s else opts.kills, times) if kind == "agents" else times


def _checks(summary: dict[str, Any], *, memory: bool) -> list[dict[str, Any]]:
    """Every check of the run (README "The fault campaign"), in the report's order: ``{"check", "held",
    "observed"}`` each; the demo is ok when every one held."""
    total = summary["runs_total"]
    g = summary.get
    rows = [
        ("every run ended within the timeout", summary["finished_in_time"] and summary["runs_completed"] == total,
         f"{summary['runs_completed']} of {total} completed"),
        ("every run ended as its input says", summary["runs_outcome_matches_input"] == total,
         f"{summary['runs_outcome_matches_input']} of {total}"),
        ("every side effect executed exactly once", summary["side_effects_executed"] == summary[
            "side_effects_expected"] and summary["side_effect_duplicates"] == 0,
         f"{summary['side_effects_executed']} of {summary['side_effects_expected']}, "
         f"{summary['side_effect_duplicates']} duplicate(s)"),
        ("model spend charged exactly once (the ledger equals the journal's fold)",
         g("spend_mismatches", 0) == 0, _spend_observed(g("spend", {}))),
        ("the projection equals a fold of the topic", summary["projection_mismatches"] == 0,
         f"{summary['projection_mismatches']} mismatch(es)"),
        ("every acknowledged event is in the topic", summary["acked_events_missing"] == 0 < summary["acked_events"],
         f"{summary['acked_events_missing']} of {summary['acked_events']} missing"),
        ("no run left unfinished, parked or orphaned",
         summary["runs_unfinished"] == summary["runs_parked"] == summary["runs_orphaned"] == 0,
         f"{summary['runs_unfinished']} unfinished, {summary['runs_parked']} parked, "
         f"{summary['runs_orphaned']} orphaned"),
        ("every requested fault was injected", summary["faults_ok"],
         ", ".join(f"{k} {v}" for k, v in sorted(g("faults_injected", {}).items())) or "none requested"),
        ("every operator action held its rule", g("controls_ok", True),
         ", ".join(f"{c['action']} {c['run_id']}: {'held' if c['held'] else 'FAILED'}" for c in g("controls", []))
         or "none requested"),
        *([("every finished run hot or archived exactly once, none half-removed, none unfinished archived",
            g("archive")["ok"], _archive_observed(g("archive")))] if g("archive") else []),
        ("memory items carry provenance", (not memory or g("memory_items_written", 0) > 0)
         and g("memory_items_without_provenance", 0) == 0,
         f"{g('memory_items_written', 0)} written, {g('memory_items_without_provenance', 0)} without"),
        ("knowledge passages carry provenance", g("knowledge_passages_without_provenance", 0) == 0,
         f"{g('knowledge_passages_without_provenance', 0)} without"),
    ]
    return [{"check": name, "held": bool(held), "observed": observed} for name, held, observed in rows]


def _archive_observed(archive: dict[str, Any]) -> str:
    """One line: runs archived and hot, then each rule's count (and the first violation)."""
    text = (f"{archive['runs_archived']} archived, {archive['runs_hot']} hot; {archive['archived_twice']} archived "
            f"twice, {archive['archive_stray_objects']} stray object(s), {archive['runs_half_removed']} half-removed, "
            f"{archive['runs_archived_unfinished']} unfinished archived, {archive['runs_lost']} lost, "
            f"{archive['archive_unreadable']} unreadable; last pass exit {archive['archive_final_rc']}")
    return text + (f"; {archive['violations'][0]}" if archive["violations"] else "")


def _spend_observed(spend: dict[str, Any]) -> str:
    """One line: each tenant's model calls, money spent next to its budget, and what is still open."""
    parts = []
    for tenant, t in spend.get("tenants", {}).items():
        cost, limit = t["used"].get("cost_micros", 0) / 1e6, t["limit"].get("cost_micros")
        budget = f" of {limit / 1e6:.2f}" if limit is not None else ""
        parts.append(f"{tenant}: {t['used'].get('model_calls', 0)} model calls, {cost:.2f}{budget} "
                     f"{spend.get('currency', '')}, {t['open'].get('model_calls', 0)} open")
    mism = spend.get("mismatches", [])
    return "; ".join(parts + ([f"{len(mism)} mismatch(es): {mism[0]}"] if mism else [])) or "no spend"


def _chaos_loop(opts: DemoOptions, settings: Settings, scripts: list[RunScript], fleet: Fleet, campaign: Campaign,
                rng: random.Random, progress: Any) -> bool:
    """Step 5: until every run is terminal and every planned fault was injected (or the timeout)."""
    store = ProjectionStore(redis_client.client(settings, socket_timeout=5), settings.topic_prefix)
    archived = _archive_probe(settings) if fleet.archiver is not None else None
    total = len(scripts)
    next_clock_kill = time.monotonic() + (opts.kill_every_s or 0)
    deadline = time.monotonic() + opts.timeout_s
    done = 0
    while time.monotonic() < deadline:
        now_done = _completed(store, scripts, opts.partitions, archived)
        done = done if now_done is None else now_done
        if progress:
            progress(done, total, fleet)
        holding = campaign.holding
        campaign.tick(min(1.0, done / max(1, total - holding)))  # held runs wait for their fault
        if done >= total - holding and holding and campaign.settled:
            campaign.release_held()  # every fault ran and none took them
        if done >= total:
            campaign.drain()  # faults the runs outpaced still happen (and are checked)
            if campaign.settled:
                return True
        if opts.kill_every_s and time.monotonic() >= next_clock_kill:
            if campaign.kill_agent("SIGKILL by chaos (--kill-every)"):
                campaign.injected["agents"] = campaign.injected.get("agents", 0) + 1
            next_clock_kill = time.monotonic() + opts.kill_every_s
        fleet.reap()
        fleet.reap_services()
        while len(fleet.agents) < opts.agents:
            fleet.spawn_agent(arm_failpoint=rng.random() < opts.arm_fraction)
        time.sleep(0.2)
    return False


def _wait_redis(r: redis.Redis, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            r.ping()
            return
        except redis.RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _quiesce(fleet: Fleet, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while fleet.agents and time.monotonic() < deadline:
        fleet.reap()
        time.sleep(0.2)

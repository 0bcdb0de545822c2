"""``runjournal demo``: the agent fleet, chaos, recovery and verification in one command.

Numbered as in :func:`run_demo`:

1. A fresh topic prefix (``demo-<utc time>``): its own topics, Redis keys and Qdrant collection.
2. The workload (tau-bench JSON files, or a generated one with approvals) is written for the agents.
3. Services: the provider (its ledger is the witness), the projector, the memory extractor.
4. The work queue is filled; N agent instances start taking runs.
5. Until every run is terminal in the projection: chaos kills agents by progress (``--kills``) or
   by clock (``--kill-every``), replacements start (some armed to die inside a tool call), the
   projector is killed once at half way, the recovery job sweeps stale leases, an approver
   grants pending approvals.
6. Quiesce: agents finish, the projector and the memory extractor catch up.
7. Verify from independent sources (topic, projection, ledger, Qdrant) and report.
8. Unless ``--keep``: remove what step 1 created — topics, consumer groups, Redis keys, the Qdrant
   collection and the work folder (``runjournal.demo.cleanup``).

Before step 1 the stack is checked (``preflight``): no broker or no Redis is reported within 5 s with the
command that fixes it (``runjournal stack up``), not a 30 s hang and a raw KafkaException.
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import redis

from runjournal.consumers.projector import Projector
from runjournal.consumers.projector.store import ProjectionStore
from runjournal.consumers.recovery.job import RecoveryError, RecoveryJob
from runjournal.consumers.topic_identity import preflight
from runjournal.core.settings import Settings
from runjournal.demo.agent import DemoKeys
from runjournal.demo.cleanup import remove_demo
from runjournal.demo.fleet import Fleet, write_workload
from runjournal.demo.verify import verify
from runjournal.demo.workload import RunScript, generated_workload, load_tau_bench
from runjournal.deploy.procs import free_port
from runjournal.deploy.topics import create_topics
from runjournal.model.reducer import RunStatus
from runjournal.producers.approvals import ApprovalInbox
from runjournal.producers.fencing import fence_producer
from runjournal.producers.partitioner import partition_for

__all__ = ["DemoOptions", "run_demo"]

log = logging.getLogger("runjournal.demo")
_TERMINAL = {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED}


@dataclass
class DemoOptions:
    """``runjournal demo`` options (see the CLI help)."""

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


def _load(opts: DemoOptions) -> list[RunScript]:
    if not opts.inputs:
        return generated_workload(opts.generated_runs, seed=opts.seed)
    return [s for path in opts.inputs for s in load_tau_bench(path)]


def _env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNJOURNAL_")}
    env.update(settings.as_env())  # Kafka security and pass-through included: children connect like the parent
    return env


class _Background:
    """Recovery sweeps and the approver, in threads of the demo process."""

    def __init__(self, settings: Settings, fleet: Fleet, keys: DemoKeys) -> None:
        self.settings, self.fleet, self.keys = settings, fleet, keys
        self.stop = threading.Event()
        self.r = redis.Redis.from_url(settings.redis_url)
        self.inbox = ApprovalInbox(self.r, settings.topic_prefix)
        self.reports: list[dict[str, Any]] = []
        self.approvals = 0
        self.errors: list[str] = []

    def recovery_loop(self) -> None:
        job = RecoveryJob(self.settings, max_wait_s=10)
        while not self.stop.wait(0.5):
            try:
                report = job.recover(stale=True).as_dict()
                if report["runs"]:
                    self.reports.append(report)
                    for r in report["runs"]:
                        self.fleet.note("recovery", r["run_id"], f"{r['action']} {r.get('previous_epoch')}→"
                                         f"{r.get('epoch')} to {r.get('assigned_to')} {r['calls']}")
                        self._settle(r["run_id"], r["owner"], r["action"])
                self._sweep_claimed(job)
            except Exception as exc:  # noqa: BLE001 - keep sweeping; reported at the end
                self.errors.append(repr(exc))
                log.exception("recovery pass failed")
        job.close()

    def _sweep_claimed(self, job: RecoveryJob) -> None:
        """Runs a dead agent took from the queue but never durably started go back to the queue.

        A run in some instance's owned set is the recovery job's (it was started: RUN_STARTED follows
        the SADD); only a run in no owned set can have been lost between the queue and ``start_run``.
        Such a run is checked against the journal (recover without force: its folded state decides)
        and requeued only when the journal has no fact of it.
        """
        live = job.instances.live()
        owned: set[str] = set()
        for okey in self.r.scan_iter(match=f"{self.keys.prefix}:owned:*"):
            owned |= {m.decode() for m in self.r.smembers(okey)}
        for key in self.r.scan_iter(match=f"{self.keys.prefix}:demo:claimed:*"):
            owner = key.decode().rsplit(":", 1)[1]
            if owner in live or owner in self.fleet.agents:
                continue
            # Runs still in an owned set are left to the stale pass (it settles them, see _settle).
            orphans = [x.decode() for x in self.r.lrange(key, 0, -1) if x.decode() not in owned]
            if not orphans:
                continue
            fence_producer(self.settings, owner)
            for run_id in orphans:
                try:
                    (outcome,) = job.recover(runs=[run_id]).runs
                except RecoveryError:  # the projection shows a live owner: it is running, not lost
                    self.r.lrem(key, 0, run_id)
                    continue
                self._settle(run_id, owner, outcome.action)

    def _settle(self, run_id: str, owner: str | None, action: str) -> None:
        """After recovery decided a run: a run with no fact at all goes back to the queue (it never durably
        started); any decided run leaves its dead owner's claimed list."""
        if action in {"deferred", "no_live_instance", "retry_later"}:
            return  # undecided: the next pass takes it again
        if action == "no_facts":
            self.r.rpush(self.keys.queue, run_id)
        if owner:
            self.r.lrem(self.keys.claimed(owner), 0, run_id)

    def approver_loop(self) -> None:
        while not self.stop.wait(0.2):
            for run_id, call_id in self.inbox.pending():
                self.inbox.decide(run_id, call_id, granted=True, approver="demo-approver")
                self.approvals += 1


def _completed(store: ProjectionStore, scripts: list[RunScript], partitions: int) -> int:
    by_p: dict[int, list[str]] = {}
    for s in scripts:
        by_p.setdefault(partition_for(s.run_id, partitions), []).append(s.run_id)
    return sum(1 for p, ids in by_p.items() for st in store.load(p, ids).values() if st.status in _TERMINAL)


def run_demo(opts: DemoOptions, *, progress: Any = None) -> dict[str, Any]:
    """Run the demo end to end; returns the summary dict (``ok`` says whether every check held).

    Raises:
        StackUnavailableError: no broker or no Redis answers (within 5 s; the message says ``runjournal stack up``).
    """
    started = time.monotonic()
    rng = random.Random(opts.seed)
    base = Settings.load()
    preflight(base, need_topic=False)
    prefix = f"demo-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}-{opts.seed}"
    settings = base.model_copy(update={"topic_prefix": prefix, "partitions": opts.partitions})  # 1
    create_topics(settings, opts.partitions)
    scripts = _load(opts)  # 2
    workdir = settings.stack_dir / "demo" / prefix
    workdir.mkdir(parents=True, exist_ok=True)
    write_workload(workdir / "workload.json", scripts)
    env = _env(settings)
    port = free_port()  # 3
    provider = subprocess.Popen([sys.executable, "-m", "runjournal.demo.provider", "--db", str(workdir / "ledger.db"),
                                 "--port", str(port), "--idempotency", "on" if opts.provider_idempotency else "off",
                                 "--latency-ms", str(opts.provider_latency_ms)], env=env)
    _wait_http(f"http://127.0.0.1:{port}/health")
    fleet = Fleet(env=env, workdir=workdir, workload_path=workdir / "workload.json",
                  provider_url=f"http://127.0.0.1:{port}", rng=rng)
    fleet.start_projector()
    knowledge = _ingest_knowledge(settings, opts.knowledge) if opts.memory else []
    memory = _start_memory(env, workdir, settings) if opts.memory else None
    fleet.advice = memory is not None
    keys = DemoKeys(prefix)
    r = redis.Redis.from_url(settings.redis_url)
    r.rpush(keys.queue, *[s.run_id for s in scripts])  # 4
    for _ in range(opts.agents):
        fleet.spawn_agent(arm_failpoint=False)
    bg = _Background(settings, fleet, keys)
    threads = [threading.Thread(target=bg.recovery_loop, daemon=True),
               threading.Thread(target=bg.approver_loop, daemon=True)]
    for t in threads:
        t.start()
    try:
        done = _chaos_loop(opts, settings, scripts, fleet, rng, progress)  # 5
        r.set(keys.done, "1")  # 6
        _quiesce(fleet)
        bg.stop.set()
        for t in threads:
            t.join(30)
        Projector(settings).run(until_caught_up=True, idle_timeout_s=120)
        memory_report = _finish_memory(memory, env) if memory else {}
    finally:
        bg.stop.set()
        fleet.stop_all()
        provider.terminate()
        provider.wait(10)
    summary = verify(settings, scripts, workdir / "ledger.db", opts.partitions)  # 7
    summary.update(_contexts(r, keys, summary), knowledge_documents=knowledge)
    summary.update(
        agents=fleet.generation, crashes_injected=fleet.crashes_injected, projector_kills=fleet.projector_kills,
        recovery_passes=len(bg.reports), approvals_granted=bg.approvals, recovery_errors=bg.errors[:5],
        elapsed_s=round(time.monotonic() - started, 1), topic_prefix=prefix, finished_in_time=done,
        provider_idempotency="on" if opts.provider_idempotency else "off", workdir=str(workdir), **memory_report)
    summary["ok"] = bool(
        done and summary["runs_completed"] == summary["runs_total"]
        and summary["runs_outcome_matches_input"] == summary["runs_total"]
        and summary["side_effects_executed"] == summary["side_effects_expected"]
        and summary["side_effect_duplicates"] == 0 and summary["projection_mismatches"] == 0
        and summary.get("memory_items_without_provenance", 0) == 0
        and summary.get("knowledge_passages_without_provenance", 0) == 0)
    summary["timeline"] = fleet.timeline()
    summary["recoveries"] = bg.reports
    summary["kept"] = opts.keep
    if not opts.keep:  # 8
        summary["cleanup"] = remove_demo(settings, workdir)
    return summary


def _chaos_loop(opts: DemoOptions, settings: Settings, scripts: list[RunScript], fleet: Fleet,
                rng: random.Random, progress: Any) -> bool:
    store = ProjectionStore(redis.Redis.from_url(settings.redis_url), settings.topic_prefix)
    total = len(scripts)
    kill_at = sorted(rng.uniform(0.05, 0.8) for _ in range(opts.kills)) if not opts.kill_every_s else []
    next_clock_kill = time.monotonic() + (opts.kill_every_s or 0)
    projector_killed = False
    deadline = time.monotonic() + opts.timeout_s
    while time.monotonic() < deadline:
        done = _completed(store, scripts, opts.partitions)
        frac = done / total
        if progress:
            progress(done, total, fleet)
        while kill_at and frac >= kill_at[0] and fleet.kill_random_agent():
            kill_at.pop(0)  # a kill due while no agent is alive waits for the next tick
        if done >= total:
            return True
        if opts.kill_every_s and time.monotonic() >= next_clock_kill:
            fleet.kill_random_agent()
            next_clock_kill = time.monotonic() + opts.kill_every_s
        if not projector_killed and frac >= 0.5:
            fleet.kill_projector()
            projector_killed = True
        fleet.reap()
        while len(fleet.agents) < opts.agents:
            fleet.spawn_agent(arm_failpoint=rng.random() < opts.arm_fraction)
        time.sleep(0.2)
    return False


def _quiesce(fleet: Fleet, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while fleet.agents and time.monotonic() < deadline:
        fleet.reap()
        time.sleep(0.2)
    fleet.stop_all()


def _wait_http(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"provider did not answer at {url}")


def _start_memory(env: dict[str, str], workdir: Path, settings: Settings) -> subprocess.Popen | None:
    """Start the memory extractor; it owns the Qdrant directory and serves the agents' memory and knowledge
    reads, so agents start only once it serves (or after 60 s, reading facts only if it never does)."""
    import importlib.util

    if importlib.util.find_spec("qdrant_client") is None:  # installed without the [memory] extra
        return None
    from runjournal.consumers.cognition import read_discovery

    log_file = open(workdir / "memory.log", "ab")  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen([sys.executable, "-m", "runjournal", "memory-extractor"], env=env, stdout=log_file,
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while settings.qdrant_url is None and read_discovery(settings.effective_qdrant_path) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            log.warning("the memory extractor does not serve reads; agents build contexts from facts only")
            return None if proc.poll() is not None else proc
        time.sleep(0.1)
    return proc


def _ingest_knowledge(settings: Settings, paths: list[Path]) -> list[dict[str, Any]]:
    """Ingest the knowledge documents before the fleet starts (the agents' contexts retrieve from them)."""
    if not paths:
        return []
    from runjournal.consumers.cognition import open_retriever

    reader = open_retriever(settings)
    try:
        return [reader.ingest(p) for p in paths]
    finally:
        reader.close()


def _contexts(r: redis.Redis, keys: DemoKeys, summary: dict[str, Any]) -> dict[str, Any]:
    """Counters of the agents' turn contexts, and one run's last context for the report: a recovered run
    with advice if there is one."""
    counts = {k.decode(): int(v) for k, v in r.hgetall(keys.contexts).items()}
    stored = {k.decode(): v for k, v in r.hgetall(keys.context).items()}
    recovered = {run_id for run_id, info in summary.get("per_run", {}).items() if info.get("epoch", 1) > 1}
    def rank(run_id: str) -> tuple[bool, int]:
        ctx = json.loads(stored[run_id])
        return run_id in recovered, len(ctx["memory"]) + len(ctx["knowledge"])
    example = json.loads(stored[max(sorted(stored), key=rank)]) if stored else None
    return {"contexts_built": counts.get("built", 0), "contexts_with_memory": counts.get("with_memory", 0),
            "contexts_with_knowledge": counts.get("with_knowledge", 0),
            "contexts_advice_unavailable": counts.get("advice_unavailable", 0),
            "contexts_facts_pending": counts.get("facts_pending", 0), "context_example": example}


def _finish_memory(proc: subprocess.Popen | None, env: dict[str, str]) -> dict[str, Any]:
    if proc is None:
        return {"memory_items_written": 0, "memory_items_without_provenance": 0, "memory": "not built"}
    proc.terminate()
    proc.wait(60)
    final = subprocess.run([sys.executable, "-m", "runjournal", "memory-extractor", "--until-caught-up", "--json"],
                           env=env, capture_output=True, text=True, timeout=600, check=False)
    from runjournal.demo.memory_check import memory_counts

    return memory_counts(env, final)

"""The fault campaign: which faults ``runjournal demo --faults`` injects, when (seeded), and how.

Kinds (``--faults all`` takes every kind this stack allows; ``--faults agents,broker,redis`` names some):

=================  ====================================================================================
``agents``         SIGKILL an agent instance (``--kills`` of them; some replacements are armed to die
                   at a failpoint inside a tool call)
``zombies``        SIGSTOP an agent past its lease (3 s), SIGCONT it once recovery may have taken its runs
``same_id``        SIGKILL an agent and restart it at once under the same producer_id (a new incarnation)
``projector``      SIGKILL the projector and restart it
``projector_stall`` SIGSTOP the projector past its session timeout (10 s), then SIGCONT
``broker``         SIGKILL the broker leading the most events partitions, restart it, wait for the ISR
                   (needs ``stack up --brokers 3``)
``redis``          SIGKILL Redis, restart it on its AOF (``appendfsync everysec``)
``recovery``       SIGKILL the recovery service at a step of a pass (``recovery.after_fence`` …
                   ``inside_handover``) or wherever it is, and restart it
``memory``         SIGKILL the memory extractor, restart it
``qdrant``         Qdrant unavailable for a window: the embedded directory is held by another process
                   while the memory extractor (killed and restarted) must wait for it
``registry``       SIGKILL the schema registry, restart it after a window (only when one is used)
``controls``       an operator pauses a run a live agent owns and resumes it, cancels another, and forks a
                   finished run after a dry run (``runjournal.demo.controls``; its runs are held out of
                   the queue until it starts)
``archiver``       the fleet runs an archiver (``runjournal archiver``, retention :data:`ARCHIVE_RETENTION_S`);
                   SIGKILL it wherever it is, then restart it armed to die at a step of archiving a run
                   (``archive.after_write`` … ``after_tombstones``) and restart it again; the end runs it
                   ``--until-caught-up`` and checks every run hot or archived exactly once, none half-removed
=================  ====================================================================================

The schedule is drawn from the seed before the fleet starts (:func:`schedule`) and printed: each
fault at a fraction of runs completed. Agent kills happen at once; every other fault runs in one
worker thread, one at a time (a broker is never killed while Redis is down, and the next broker
kill waits for the ISR), so a fault's effects are attributable. Each injection and each end is noted
on the timeline; :attr:`Campaign.injected` counts them by kind.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from runjournal.core import redis_client
from runjournal.core.errors import RunjournalError
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.demo.agent import DemoKeys
from runjournal.demo.fleet import ARCHIVE_FAILPOINTS, RECOVERY_FAILPOINTS, Fleet
from runjournal.demo.stackctl import StackControl
from runjournal.demo.workload import RunScript

__all__ = ["ARCHIVE_PICK_WINDOW_S", "ARCHIVE_RETENTION_S", "KINDS", "Campaign", "FaultSpecError", "Scheduled",
           "parse_faults", "schedule"]

log = logging.getLogger("runjournal.demo.faults")

#: Where the recovery fault's bait agent dies: its first side effect's intent committed, the request not sent
#: (recovery has a call to decide, and the armed pass a run to fence, read, resume and hand over). Not
#: ``after_intent``: a read-only call's intent rides the next commit, so an agent dying at its first (read-only)
#: intent leaves no fact, and the pass only requeues the run (the CI failure of 2026-12-02).
BAIT_FAILPOINT = "producers.call.before_send"

KINDS: dict[str, str] = {
    "agents": "SIGKILL agent instances (some die at a failpoint inside a tool call)",
    "zombies": "SIGSTOP an agent past its lease, SIGCONT it after recovery",
    "same_id": "SIGKILL an agent, restart it at once under the same producer_id",
    "projector": "SIGKILL the projector, restart it",
    "projector_stall": "SIGSTOP the projector past its session timeout, SIGCONT",
    "broker": "SIGKILL the events partitions' leader broker, restart it",
    "redis": "SIGKILL Redis, restart it on its AOF",
    "recovery": "SIGKILL the recovery service at a step of a pass, restart it",
    "recovery_pair": "a second recovery service sweeps beside the first for a window; agents killed to give both runs",
    "operators": "two operators continue one FAILED run at once (continue_run from two processes): one is refused",
    "cancels": "an asyncio agent joins the fleet and cancels the task of every third tool call twice, then retries",
    "skew": "an agent whose wall clock runs 5 minutes behind or ahead joins the fleet (killed like any other)",
    "graph": "a LangGraph agent joins the fleet: each model turn asks for its consecutive tool calls in parallel",
    "broker_stall": "an agent with 2 s commit timeouts joins; SIGSTOP a broker 6-9 s: its commits time out; SIGCONT",
    "partitions": "a scratch journal's events topic gets more partitions: recovery and a new Journal must refuse it",
    "memory": "SIGKILL the memory extractor, restart it",
    "qdrant": "Qdrant unavailable to the memory extractor for a window",
    "registry": "SIGKILL the schema registry, restart it after a window",
    "controls": "an operator pauses a run a live agent owns and resumes it, cancels another, forks a finished run",
    "archiver": "an archiver archives finished runs past a short retention: SIGKILL it, and again at a step of an "
                "archive; restarted",
}
ARCHIVE_RETENTION_S = 60.0
"""The runs' retention while the ``archiver`` fault is on (``RUNJOURNAL_RETENTION_S``), seconds: short enough that most
runs of a campaign are archived during it, long enough that a run the ``operators`` or ``controls`` fault picks
(a run that ended within :data:`ARCHIVE_PICK_WINDOW_S`) is never archived under it."""
ARCHIVE_PICK_WINDOW_S = 20.0
"""With the archiver on, the ``operators`` and ``controls`` faults act only on finished runs the archiver has not
noted yet or noted less than this many seconds ago (Redis's clock): at least ``ARCHIVE_RETENTION_S -
ARCHIVE_PICK_WINDOW_S`` seconds before it may archive them."""
ARCHIVER_FAILPOINT_WAIT_S = 240.0
"""How long the armed archiver may take to reach its failpoint (the first runs must pass their retention), seconds."""
AGENT_LEASE_S = 3.0
"""The demo agents' lease TTL (``runjournal.demo.agent --lease-ttl-ms`` default), seconds."""
AGENT_KILL_WAIT_S = 10.0
"""How long a due agent kill waits for an agent that owns a run before it takes any running agent, seconds."""


class _NotYet(Exception):
    """A fault whose occasion has not come yet (``operators`` before any run ended FAILED): queued again."""


class FaultSpecError(RunjournalError):
    """``--faults`` names an unknown kind, or one this stack cannot take (the message names the fix)."""


def parse_faults(spec: str, *, allowed: dict[str, str | None]) -> tuple[list[str], dict[str, str]]:
    """``--faults`` → (kinds to inject, kinds left out of ``all`` with why).

    Args:
        spec: ``all``, ``none`` or comma-separated kinds.
        allowed: kind → None when this stack can take it, else why not (e.g. "needs 3 brokers").

    Raises:
        FaultSpecError: an unknown kind, or a named kind this stack cannot take.
    """
    words = [w.strip() for w in spec.split(",") if w.strip()]
    if words in ([], ["none"]):
        return [], {}
    if words == ["all"]:
        return [k for k in KINDS if allowed.get(k) is None], {k: why for k, why in allowed.items() if why}
    unknown = [w for w in words if w not in KINDS]
    if unknown:
        raise FaultSpecError(f"unknown fault kind(s) {unknown}; kinds: all, none, {', '.join(KINDS)}")
    refused = {w: allowed[w] for w in words if allowed.get(w)}
    if refused:
        raise FaultSpecError("; ".join(f"--faults {k}: {why}" for k, why in refused.items()))
    return list(dict.fromkeys(words)), {}


@dataclass(frozen=True)
class Scheduled:
    """One planned fault."""

    at: float
    """Fraction of runs completed (0..1) at which it is due."""
    kind: str
    """One of :data:`KINDS`."""


def schedule(kinds: list[str], *, times: int, kills: int, rng: random.Random) -> list[Scheduled]:
    """The seeded plan: ``max(kills, times)`` agent kills spread by progress, and ``times`` of every other kind,
    interleaved in a seeded order over 5–75 % of the runs (evenly spaced, jittered)."""
    plan = [Scheduled(round(rng.uniform(0.05, 0.8), 3), "agents") for _ in range(max(kills, times))] \
        if "agents" in kinds else []
    others = [k for k in kinds if k != "agents" for _ in range(times)]
    rng.shuffle(others)
    for i, kind in enumerate(others):
        plan.append(Scheduled(round(0.05 + 0.7 * (i + rng.uniform(0.1, 0.9)) / len(others), 3), kind))
    return sorted(plan, key=lambda s: (s.at, s.kind))


def _effect_before_approval(script: RunScript) -> bool:
    """True when the script's first side-effecting tool call comes before any call that needs an approval."""
    for step in script.steps:
        if step.kind == "tool" and step.needs_approval:
            return False
        if step.kind == "tool" and step.side_effect:
            return True
    return False


class Campaign:
    """Injects the :func:`schedule` as runs complete (see the module docstring).

    Args:
        fleet: the demo's processes.
        settings: the demo's settings.
        plan: the schedule.
        rng: the demo's seeded random source.
        stack: control of the stack's processes (None when no stack fault is planned).
        restart_memory: starts the memory extractor again (None: the demo runs without memory).
    """

    def __init__(self, fleet: Fleet, settings: Settings, plan: list[Scheduled], rng: random.Random, *,
                 stack: StackControl | None, restart_memory: Callable[[], Any] | None) -> None:
        self.fleet, self.settings, self.rng, self.stack = fleet, settings, rng, stack
        self.restart_memory = restart_memory
        self.pending = list(plan)
        self.held = 0
        """Runs held out of the queue for the recovery fault's bait agents (``hold_bait``); progress counts them
        out until each is taken or released."""
        self.held_controls: list[str] = []
        """Runs held out of the queue for the controls faults (``hold_bait``), queued first when one starts."""
        self.held_operators: list[str] = []
        """With the archiver on: a failing run per ``operators`` fault, held out of the queue (``hold_bait``) and
        queued first when the fault starts, so it continues a run that has just ended (never one archived under it)."""
        self.controls: list[dict[str, Any]] = []
        """The controls faults' operator actions (``runjournal.demo.controls.ControlAction.as_dict``)."""
        self.injected: dict[str, int] = dict.fromkeys(sorted({s.kind for s in plan}), 0)
        self.errors: list[str] = []
        self._work: queue.Queue[Scheduled | None] = queue.Queue()
        self._kill_due_since: float | None = None
        self._lock = threading.Lock()
        self._outstanding = 0  # faults queued or running (under _lock): counted before the put, after the run
        self._aborted = threading.Event()
        self._queue_key = self._bait_key = self._controls_key = ""  # set by hold_bait
        self._worker = threading.Thread(target=self._run, name="fault-campaign", daemon=True)
        self._worker.start()

    # -- driving ------------------------------------------------------------------------------------
    def tick(self, frac: float) -> None:
        """Start every fault due at ``frac`` of runs completed: at most one agent kill a tick, of an agent that owns
        a run (waiting up to :data:`AGENT_KILL_WAIT_S` for one: a burst of kills after a stall would otherwise hit
        replacements still starting, which tests nothing); the other kinds are queued for the worker, in order."""
        while self.pending and self.pending[0].at <= frac:
            due = self.pending[0]
            if due.kind == "agents":
                now = time.monotonic()
                self._kill_due_since = self._kill_due_since or now
                if not self.kill_agent(busy_only=now - self._kill_due_since < AGENT_KILL_WAIT_S):
                    return  # no agent to kill right now: the kill waits for a later tick
                self._kill_due_since = None
                self.injected["agents"] += 1
                self.pending.pop(0)
                return
            else:
                self._queue(due)
            self.pending.pop(0)

    def _queue(self, item: Scheduled) -> None:
        with self._lock:
            self._outstanding += 1
        self._work.put(item)

    @property
    def holding(self) -> int:
        """Runs held out of the queue for a fault still to come (``recovery``, ``controls``): progress counts them
        out until they are queued."""
        with self._lock:
            return self.held + len(self.held_controls) + len(self.held_operators)

    @property
    def settled(self) -> bool:
        """True when nothing is planned, queued or running (one counter under a lock: never True while a fault
        is between the queue and the worker)."""
        with self._lock:
            return not self.pending and self._outstanding == 0

    def drain(self, frac: float = 1.0) -> None:
        """Make everything still planned due (runs finished before the schedule did)."""
        self.tick(frac)
        for s in list(self.pending):
            if s.kind != "agents":
                self._queue(s)
                self.pending.remove(s)

    def close(self, timeout_s: float = 300.0) -> None:
        """Wait for the running fault to end (its processes back), then stop the worker."""
        self._work.put(None)
        self._worker.join(timeout_s)

    def abort(self, timeout_s: float = 30.0) -> None:
        """Stop injecting (the demo is stopping: an interrupt, a failure): queued faults are dropped, a running
        one ends at its next wait, and the worker is joined (at most ``timeout_s``) before the fleet is stopped."""
        self._aborted.set()
        self.pending.clear()
        self._work.put(None)
        self._worker.join(timeout_s)

    def counts(self) -> dict[str, int]:
        """Faults injected by kind (recovery: armed recovery services that died at their failpoint inside a pass —
        the SIGKILL that armed them does not count, so a pass that never reached the step is not reported as one)."""
        out = dict(self.injected)
        if "recovery" in out:
            out["recovery"] = self.fleet.recoverer_failpoint_deaths
        if "archiver" in out:  # archivers that died at their failpoint, inside an archive
            out["archiver"] = self.fleet.archiver_failpoint_deaths
        return out

    # -- the worker ----------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            again = False
            try:
                if self._aborted.is_set():
                    continue
                getattr(self, f"_{item.kind}")()
                if item.kind not in ("recovery", "archiver"):
                    self.injected[item.kind] += 1
            except _NotYet:  # its occasion has not come (no run ended FAILED yet): the faults queued after it go first
                time.sleep(1.0)
                again = not self._aborted.is_set()
            except Exception as exc:  # noqa: BLE001 - a fault that could not be injected is reported
                log.exception("fault %s failed", item.kind)
                self.errors.append(f"{item.kind}: {exc!r}"[:400])
                self.fleet.note("fault_error", item.kind, repr(exc)[:200])
            finally:
                if again:
                    self._work.put(item)  # still outstanding: the count stays
                else:
                    with self._lock:
                        self._outstanding -= 1

    def _pause(self, seconds: float) -> None:
        """A fault's poll interval, cut short once the campaign is aborted (the fault's loops check
        ``_aborted`` and end; what a fault restores — a broker, Redis, a stopped agent — is still restored)."""
        self._aborted.wait(seconds)

    def _sleep(self, low: float, high: float) -> float:
        """A seeded wait of ``low``–``high`` s (cut short by an abort); the seconds drawn."""
        seconds = round(self.rng.uniform(low, high), 2)
        self._aborted.wait(seconds)
        return seconds

    def _zombies(self) -> None:
        name = self._agent()
        while not self.fleet.stall_agent(name, f"fault zombies: SIGSTOP past its {AGENT_LEASE_S:.0f} s lease"):
            name = self._agent()  # it exited between the pick and the signal: another one
        held = self._sleep(AGENT_LEASE_S + 2, AGENT_LEASE_S + 5)
        self.fleet.resume_agent(name)
        self.fleet.note("fault_end", name, f"zombies: stopped {held} s")

    def _same_id(self) -> None:
        name = self._agent()
        self.fleet.kill_agent(name, "fault same_id: SIGKILL, restarted at once under the same producer_id")
        self.fleet.spawn_agent(arm_failpoint=False, name=name, why="fault same_id: a new incarnation")

    def _agent(self) -> str:
        """An agent for a zombie or a same-id restart: one that owns a run when there is one."""
        deadline = time.monotonic() + 60
        while (name := self._busy_agent()) is None:
            if time.monotonic() > deadline or self._aborted.is_set():
                raise RuntimeError("no live agent for 60 s" if not self._aborted.is_set() else "aborted")
            self._pause(0.2)
        return name

    def _recovery_pair(self) -> None:
        self.fleet.start_second_recoverer()
        try:
            for _ in range(2):  # runs for both services to race on
                victim = self._busy_agent_within(AGENT_KILL_WAIT_S)
                if victim:
                    self.fleet.kill_agent(victim, "fault recovery_pair: killed to give two recovery services a run")
                self._sleep(4, 8)
        finally:
            rc = self.fleet.stop_second_recoverer()
        self.fleet.note("fault_end", "recovery-2", f"recovery_pair: the second service stopped (rc={rc})")
        if rc not in (0, -signal.SIGTERM):
            raise RuntimeError(f"the second recovery service exited {rc}")

    def _operators(self) -> None:
        from runjournal.consumers.projector.store import ProjectionStore
        from runjournal.core import redis_client
        from runjournal.demo.agent import load_scripts
        from runjournal.model.reducer import RunStatus
        from runjournal.schemas.keys import partition_for

        failing = [s.run_id for s in load_scripts(self.fleet.workload_path).values() if not s.succeeded]
        store = ProjectionStore(redis_client.client(self.settings), self.settings.topic_prefix)
        self._operators_since = getattr(self, "_operators_since", None) or time.monotonic()
        mine = None
        if self.held_operators:  # the archiver is on: its run of its own, queued first, continued once it ended
            with self._lock:
                mine = self.held_operators.pop(0)
            redis_client.client(self.settings, socket_timeout=10).lpush(self._queue_key, mine)
            self.fleet.note("fault", mine, "fault operators: its held run queued first")
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not self._aborted.is_set():
                st = store.get(partition_for(mine, self.settings.partitions), mine)
                if st is not None and st.status is RunStatus.FAILED:
                    break
                self._pause(0.3)
        ended = sorted(r for r in failing if (st := store.get(partition_for(r, self.settings.partitions), r))
                       is not None and st.status is RunStatus.FAILED)
        ended = sorted(self.archive_safe(ended))
        if not ended:
            if time.monotonic() - self._operators_since > 300:
                raise RuntimeError("no run of the workload ended FAILED within 300 s")
            raise _NotYet
        run_id = mine if mine in ended else self.rng.choice(ended)
        self.fleet.note("fault", run_id, "fault operators: two operators continue it at once")
        stamp = f"{int(time.monotonic() * 1000) % 100_000}"
        procs = [self.fleet.spawn_operator(run_id, f"operator-{stamp}-{i}") for i in (1, 2)]
        rcs = [p.wait(300) for p in procs]
        self.fleet.note("fault_end", run_id, f"operators: exit codes {rcs}")
        if rcs != [0, 0]:
            raise RuntimeError(f"an operator failed: exit codes {rcs} (see operator-{stamp}-*.log)")

    def _cancels(self) -> None:
        self.fleet.spawn_asyncio_agent("fault cancels: an asyncio agent cancelling every third call twice")

    def _skew(self) -> None:
        skew = self.rng.choice((-300, 300))
        self.fleet.spawn_agent(arm_failpoint=False, clock_skew_s=skew,
                               why=f"fault skew: an agent whose wall clock runs {skew:+d} s off")

    def _graph(self) -> None:
        self.fleet.spawn_agent(arm_failpoint=True, graph=True,
                               why="fault graph: a LangGraph agent whose model turns ask for parallel tool calls")

    def _broker_stall(self) -> None:
        assert self.stack is not None
        self.stack.wait_isr()  # never two replicas short at once
        # an agent whose commits give up after 2 s (x commit_retries + 1): the stall outlasts them, so its
        # group-committed outcomes meet the ambiguous-commit path; it stays in the fleet
        stalled = self.fleet.spawn_agent(arm_failpoint=False, commit_timeout_s=2.0,
                                         why="fault broker_stall: an agent with 2 s commit timeouts")
        owned = RedisKeys(self.settings.topic_prefix).owned(stalled)
        deadline = time.monotonic() + AGENT_KILL_WAIT_S
        while time.monotonic() < deadline:  # until it writes a run (else the stall meets only the others)
            try:
                if redis_client.client(self.settings, socket_timeout=2).scard(owned):
                    break
            except redis.RedisError:
                pass
            self._pause(0.2)
        node = self.rng.choice(self.stack.broker_ids())
        self.stack.signal_broker(node, signal.SIGSTOP)
        self.fleet.note("fault", f"broker-{node}", "fault broker_stall: SIGSTOP (commits coordinated there time out)")
        try:
            held = self._sleep(6, 9)
        finally:
            self.stack.signal_broker(node, signal.SIGCONT)
        self.fleet.note("fault_end", f"broker-{node}", f"broker_stall: SIGCONT after {held} s")
        self.stack.wait_isr()

    def _partitions(self) -> None:
        """A scratch prefix on the same cluster: its journal stores its shape (a recovery pass), its events topic
        gets more partitions, and then `runjournal recover` (a subprocess, as an operator runs it) and a new
        Journal must refuse with the repair named — never drop a run."""
        from confluent_kafka.admin import NewPartitions

        from runjournal.consumers.recovery.job import RecoveryJob
        from runjournal.core import kafka
        from runjournal.deploy.topics import create_topics
        from runjournal.producers import Journal, PartitionCountChangedError

        scratch = self.settings.model_copy(
            update={"topic_prefix": f"{self.settings.topic_prefix}-shape{self.rng.randint(0, 9999)}"})
        create_topics(scratch)
        job = RecoveryJob(scratch)
        try:
            job.recover(stale=True)  # stores the scratch journal's shape
        finally:
            job.close()
        grown = scratch.partitions + 1
        admin = kafka.admin_client(scratch)  # held until the result: a collected client destroys its futures
        admin.create_partitions([NewPartitions(scratch.events_topic, grown)])[scratch.events_topic].result()
        self.fleet.note("fault", scratch.topic_prefix, f"fault partitions: {scratch.events_topic} grown to {grown}")
        done = subprocess.run([sys.executable, "-m", "runjournal", "recover", "--stale", "--json"],
                              env={**os.environ, **scratch.as_env()}, capture_output=True, text=True, timeout=120)
        if done.returncode != 1 or "partitions" not in done.stderr:
            raise RuntimeError(f"recover on a grown topic did not refuse it: exit {done.returncode}, "
                               f"{done.stderr[-300:]!r}")
        try:
            Journal(scratch, producer_id="shape-check").close()
        except PartitionCountChangedError:
            pass
        else:
            raise RuntimeError("a Journal started on a grown topic")
        self.fleet.note("fault_end", scratch.topic_prefix, "partitions: recover and Journal refused, repair named")

    def _projector(self) -> None:
        self.fleet.kill_projector()

    def _projector_stall(self) -> None:
        self.fleet.signal_service("projector", signal.SIGSTOP, "fault projector_stall: SIGSTOP")
        held = self._sleep(12, 16)
        self.fleet.signal_service("projector", signal.SIGCONT, f"projector_stall: SIGCONT after {held} s")

    def _broker(self) -> None:
        assert self.stack is not None
        self.stack.wait_isr()  # never two replicas short at once
        node, parts = self.stack.kill_leader(self.rng.choice)
        self.fleet.note("kill", f"broker-{node}", f"fault broker: SIGKILL, leader of events partitions {parts}")
        started = time.monotonic()
        moved = self._leaders_moved(node, parts)
        if moved:
            self.fleet.note("fault", f"broker-{node}", f"fault broker: leaders moved after "
                            f"{time.monotonic() - started:.1f} s: {moved}")
        down = round(time.monotonic() - started + self._sleep(1, 4), 1)  # the fleet runs a broker short
        report = self.stack.restart()
        if not moved:  # the controller never noticed: the fault did not happen (not counted)
            raise RuntimeError(f"the leadership of partitions {parts} did not leave the killed broker {node} in 20 s")
        self.fleet.note("spawn", f"broker-{node}", f"restarted after {down} s down: {report['kafka'].get('action')}")
        isr_s = self.stack.wait_isr()
        self.fleet.note("fault_end", f"broker-{node}", f"broker: back in every ISR after {isr_s:.1f} s")

    def _leaders_moved(self, node: int, parts: list[int], timeout_s: float = 20.0) -> dict[int, int]:
        """The new leaders of ``parts`` once none is ``node`` any more (the controller fenced it after its
        session timeout), or {} when that did not happen within ``timeout_s``."""
        assert self.stack is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                leaders = self.stack.events_leaders()
            except Exception:  # noqa: BLE001 - metadata unavailable for a moment: ask again
                leaders = {}
            if leaders and all(leaders.get(p, -1) not in (node, -1) for p in parts):
                return {p: leaders[p] for p in parts}
            self._pause(0.25)
        return {}

    def _redis(self) -> None:
        assert self.stack is not None
        self.stack.kill_redis()
        self.fleet.note("kill", "redis", "fault redis: SIGKILL")
        down = self._sleep(0.3, 1.5)
        self.stack.restart()
        ready = self.stack.wait_redis()
        self.fleet.note("spawn", "redis", f"restarted on its AOF after {down} s down (answers after {ready:.1f} s)")

    def _recovery(self) -> None:
        point = f"{self.rng.choice(RECOVERY_FAILPOINTS)}=1"
        self.fleet.kill_recoverer(point)
        self.fleet.note("fault", "recovery", f"fault recovery: armed {point}")
        deaths = self.fleet.recoverer_failpoint_deaths
        if self.held:  # the pass's run: a held run taken by an agent that dies before its first side effect,
            with self._lock:  # whatever the fleet is doing (the runs may be nearly all done when the worker gets here)
                self.held -= 1
            try:
                self.fleet.spawn_agent(arm_failpoint=False, bait=True, failpoint=f"{BAIT_FAILPOINT}=1",
                                       why="fault recovery: an agent taking a held run, to die before its first "
                                           "side effect is sent")
            finally:
                self._requeue_untaken(wait_s=30)
        elif victim := self._busy_agent_within(AGENT_KILL_WAIT_S):
            self.fleet.kill_agent(victim, "fault recovery: killed to give the armed pass a run")
        deadline = time.monotonic() + 150
        again, baited = time.monotonic() + 20, time.monotonic() + 45
        while self.fleet.recoverer_failpoint_deaths == deaths and time.monotonic() < deadline \
                and not self._aborted.is_set():
            self.fleet.reap_services()
            if time.monotonic() > baited:  # still nothing: one more agent, from the queue, dying before a side effect
                baited = deadline
                self.fleet.spawn_agent(arm_failpoint=False, failpoint=f"{BAIT_FAILPOINT}=1",
                                       why="fault recovery: another agent to die before its first side effect is sent")
            if time.monotonic() > again:  # the pass found nothing yet: give it another run
                again = time.monotonic() + 10
                if (busy := self._busy_agent(fallback=False)) is not None:
                    self.fleet.kill_agent(busy, "fault recovery: killed again to give the armed pass a run")
            self._pause(0.2)
        if self.fleet.recoverer_failpoint_deaths == deaths:  # not counted: faults_ok says so
            self.fleet.kill_recoverer(None)  # disarm, so a later pass does not die unplanned
            self.fleet.note("fault_end", "recovery", f"the armed failpoint {point} was not reached in 150 s")
        else:
            self.fleet.note("fault_end", "recovery", f"the armed recovery service died at {point}; restarted")

    def hold_bait(self, scripts: Sequence[RunScript], queue_key: str, bait_key: str,
                  controls_key: str = "") -> list[str]:
        """Hold runs out of the queue for the faults that need a run of their own (never the last run): the run ids
        (the others are the caller's to queue).

        * one per planned ``recovery`` fault, pushed to ``bait_key``: runs with a side effect that no approval
          precedes, from the end of the workload, so the bait agent reaches :data:`BAIT_FAILPOINT` without waiting
          for a decision;
        * :data:`~runjournal.demo.controls.CONTROL_RUNS` per planned ``controls`` fault, pushed to ``controls_key``:
          the longest runs with the most side effects, paced like a model's turns (``DemoKeys.paced``), so a pause
          and a cancel meet them mid-way.
        """
        from runjournal.demo.controls import CONTROL_RUNS

        r = redis_client.client(self.settings, socket_timeout=10)
        wanted = min(sum(1 for s in self.pending if s.kind == "recovery"), len(scripts) - 1)
        fit = [s.run_id for s in scripts if _effect_before_approval(s)]
        held = fit[len(fit) - wanted:] if wanted > 0 else []
        if held:
            r.rpush(bait_key, *held)
        self.held = len(held)
        room = len(scripts) - 1 - len(held)
        wanted = min(CONTROL_RUNS * sum(1 for s in self.pending if s.kind == "controls"), room)
        if wanted > 0 and controls_key:
            longest = sorted((s for s in scripts if s.run_id not in held),
                             key=lambda s: (-s.side_effects, -len(s.steps), s.run_id))
            self.held_controls = [s.run_id for s in longest[:wanted]]
            r.rpush(controls_key, *self.held_controls)
            r.sadd(DemoKeys(self.settings.topic_prefix).paced, *self.held_controls)  # a model's pace: met mid-way
        if any(s.kind == "archiver" for s in self.pending):
            room = len(scripts) - 1 - len(held) - len(self.held_controls)
            wanted = min(sum(1 for s in self.pending if s.kind == "operators"), room)
            taken = set(held) | set(self.held_controls)
            failing = [s.run_id for s in scripts if not s.succeeded and s.run_id not in taken]
            self.held_operators = failing[len(failing) - wanted:] if wanted > 0 else []
        self._queue_key, self._bait_key, self._controls_key = queue_key, bait_key, controls_key
        return held + self.held_controls + self.held_operators

    def _requeue_untaken(self, wait_s: float) -> None:
        """After a bait agent was started: wait up to ``wait_s`` for it to take its run from the bait list (Redis is
        the truth: more runs there than ``held`` says are untaken), then queue any it did not take (it died
        starting, was killed, or never ran), so no run waits for a fault that has passed."""
        r = redis_client.client(self.settings, socket_timeout=10)
        deadline = time.monotonic() + wait_s
        while (extra := int(r.llen(self._bait_key)) - self.held) > 0 and time.monotonic() < deadline \
                and not self._aborted.is_set():
            self._pause(0.2)
        moved = 0
        for _ in range(max(0, extra)):
            moved += r.lmove(self._bait_key, self._queue_key, "LEFT", "RIGHT") is not None
        if moved:
            self.fleet.note("fault_end", "recovery", f"{moved} held run(s) queued: the bait agent did not take it")

    def release_held(self) -> None:
        """Queue every run still held (the plan's recovery and controls faults are done, or ended another way):
        every run runs. Called by the chaos loop once the campaign is settled (no fault queued or running)."""
        r = redis_client.client(self.settings, socket_timeout=10)
        moved = 0
        while r.lmove(self._bait_key, self._queue_key, "LEFT", "RIGHT") is not None:
            moved += 1
        with self._lock:
            self.held = 0
        if moved:
            self.fleet.note("fault_end", "recovery", f"{moved} held run(s) queued: no recovery fault took them")
        if self._release_controls():
            self.fleet.note("fault_end", "controls", "held run(s) queued: no controls fault took them")
        with self._lock:
            operators, self.held_operators = self.held_operators, []
        if operators:
            r.rpush(self._queue_key, *operators)
            self.fleet.note("fault_end", "operators", f"{len(operators)} held run(s) queued: no operators fault took "
                                                      "them")

    def _release_controls(self) -> list[str]:
        """Queue the runs held for the controls faults first (the head of the queue: the next runs agents take);
        the run ids, in queue order."""
        if not self._controls_key:
            return []
        r = redis_client.client(self.settings, socket_timeout=10)
        moved = []
        while (raw := r.lmove(self._controls_key, self._queue_key, "RIGHT", "LEFT")) is not None:
            moved.append(raw.decode())
        with self._lock:
            self.held_controls = []
        return moved[::-1]

    def _controls(self) -> None:
        """The ``controls`` fault (``runjournal.demo.controls``): the runs held for it are queued first, then an
        operator pauses one a live agent owns, cancels another, resumes the first and forks a finished run."""
        from runjournal.demo.agent import load_scripts
        from runjournal.demo.controls import Controls

        held = self._release_controls()
        self.fleet.note("fault", "controls", f"fault controls: {len(held)} held run(s) queued first: {held}")
        scripts = load_scripts(self.fleet.workload_path)
        controls = Controls(self.fleet, self.settings, scripts, self.rng, self._aborted)
        if self.fleet.archiver is not None:  # fork a run the archiver will not archive under it
            controls.fresh = self.archive_safe
        controls.run(held, self.controls)

    def archive_safe(self, run_ids: Sequence[str]) -> set[str]:
        """Of ``run_ids`` (finished runs still in the projection), those an operator may act on with the archiver on:
        not yet noted in its due set, or noted less than :data:`ARCHIVE_PICK_WINDOW_S` ago (Redis's clock, the
        archiver's); every run when no archiver runs."""
        if self.fleet.archiver is None or not run_ids:
            return set(run_ids)
        from runjournal.consumers.archive.store import redis_now_ms

        r = redis_client.client(self.settings, socket_timeout=10)
        due = RedisKeys(self.settings.topic_prefix).archive_due()
        now = redis_now_ms(r)
        scores = r.zmscore(due, list(run_ids))
        return {rid for rid, score in zip(run_ids, scores, strict=True)
                if score is None or now - score < ARCHIVE_PICK_WINDOW_S * 1000}

    def _archiver(self) -> None:
        """The ``archiver`` fault: SIGKILL the archiver wherever it is, then restart it armed to die at a step of
        archiving a run (:data:`~runjournal.demo.fleet.ARCHIVE_FAILPOINTS`) and wait for that death (restarted
        unarmed by the chaos loop's ``reap_services``). Counted by the failpoint deaths (:meth:`counts`)."""
        point = f"{self.rng.choice(ARCHIVE_FAILPOINTS)}=1"
        self.fleet.kill_archiver(None, "fault archiver: SIGKILL wherever it is")
        self._sleep(1, 4)
        deaths = self.fleet.archiver_failpoint_deaths
        self.fleet.kill_archiver(point, f"fault archiver: SIGKILL, restarted armed {point}")
        self.fleet.note("fault", "archiver", f"fault archiver: armed {point}")
        deadline = time.monotonic() + ARCHIVER_FAILPOINT_WAIT_S
        while self.fleet.archiver_failpoint_deaths == deaths and time.monotonic() < deadline \
                and not self._aborted.is_set():
            self.fleet.reap_services()
            self._pause(0.2)
        if self.fleet.archiver_failpoint_deaths == deaths:  # not counted: faults_ok says so
            self.fleet.kill_archiver(None, "fault archiver: disarmed")
            self.fleet.note("fault_end", "archiver", f"the armed failpoint {point} was not reached in "
                                                     f"{ARCHIVER_FAILPOINT_WAIT_S:.0f} s")
        else:
            self.fleet.note("fault_end", "archiver", f"the armed archiver died at {point}; restarted")

    def kill_agent(self, why: str = "fault agents: SIGKILL", *, busy_only: bool = False) -> bool:
        """SIGKILL an agent that owns a run now (a kill between runs tests nothing), else (unless ``busy_only``)
        any running one; True when one was killed."""
        name = self._busy_agent(fallback=not busy_only)
        return name is not None and self.fleet.kill_agent(name, why)

    def _busy_agent_within(self, seconds: float) -> str | None:
        """An agent that owns a run, waiting up to ``seconds`` for one (a kill between runs gives recovery nothing);
        then any running agent."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self._aborted.is_set():
            if (name := self._busy_agent(fallback=False)) is not None:
                return name
            self._pause(0.2)
        return self._busy_agent()

    def _busy_agent(self, *, fallback: bool = True) -> str | None:
        """A running agent that owns a run now (so recovery has work once it dies), else (``fallback``) any
        running agent."""
        with self.fleet.lock:
            names = sorted(n for n in self.fleet.agents if n not in self.fleet.stalled | self.fleet.protected)
        try:
            r = redis_client.client(self.settings, socket_timeout=2)
            keys = RedisKeys(self.settings.topic_prefix)
            owning = {inst.split("#")[0] for k in redis_client.scan_keys(r, keys.instance_glob("owned"))
                      if (inst := keys.instance_of(k, "owned")) and r.scard(k)}  # agent-7#2 is agent-7 restarted
            busy = [n for n in names if n in owning]
        except redis.RedisError:  # Redis is a fault too: any running agent
            busy = []
        if busy:
            return self.rng.choice(busy)
        return self.fleet.pick_agent() if fallback else None

    def _memory(self) -> None:
        if self.restart_memory is None:
            raise RuntimeError("the demo runs without memory")
        if not self.fleet.kill_memory("fault memory: SIGKILL"):
            raise RuntimeError("the memory extractor was not running")
        down = self._sleep(0.5, 2)
        self.restart_memory()
        self.fleet.note("fault_end", "memory", f"restarted after {down} s")

    def _qdrant(self) -> None:
        if self.restart_memory is None or self.settings.qdrant_url:
            raise RuntimeError("Qdrant faults need the embedded directory and the memory extractor")
        from runjournal.consumers.vectors.qdrant import open_client

        self.fleet.kill_memory("fault qdrant: the extractor loses its Qdrant directory")
        client, _ = open_client(self.settings, wait_s=30)  # another process now holds the embedded directory
        try:
            self.fleet.note("fault", "qdrant", "fault qdrant: directory held by another process")
            self.restart_memory()  # must wait for Qdrant, not crash, lose or dead-letter
            held = self._sleep(6, 10)
        finally:
            client.close()
        self.fleet.note("fault_end", "qdrant", f"qdrant: available again after {held} s")

    def _registry(self) -> None:
        assert self.stack is not None
        self.stack.kill_registry()
        self.fleet.note("kill", "registry", "fault registry: SIGKILL")
        down = self._sleep(5, 10)
        self.stack.restart()
        self.fleet.note("spawn", "registry", f"restarted after {down} s down")

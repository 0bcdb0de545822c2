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
=================  ====================================================================================

The schedule is drawn from the seed before the fleet starts (:func:`schedule`) and printed: each
fault at a fraction of runs completed. Agent kills happen at once; every other fault runs in one
worker thread, one at a time (a broker is never killed while Redis is down, and the next broker
kill waits for the ISR), so a fault's effects are attributable. Each injection and each end is noted
on the timeline; :attr:`Campaign.injected` counts them by kind.
"""

from __future__ import annotations

import logging
import queue
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from runjournal.core import redis_client
from runjournal.core.errors import RunjournalError
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.demo.fleet import RECOVERY_FAILPOINTS, Fleet
from runjournal.demo.stackctl import StackControl

__all__ = ["KINDS", "Campaign", "FaultSpecError", "Scheduled", "parse_faults", "schedule"]

log = logging.getLogger("runjournal.demo.faults")

KINDS: dict[str, str] = {
    "agents": "SIGKILL agent instances (some die at a failpoint inside a tool call)",
    "zombies": "SIGSTOP an agent past its lease, SIGCONT it after recovery",
    "same_id": "SIGKILL an agent, restart it at once under the same producer_id",
    "projector": "SIGKILL the projector, restart it",
    "projector_stall": "SIGSTOP the projector past its session timeout, SIGCONT",
    "broker": "SIGKILL the events partitions' leader broker, restart it",
    "redis": "SIGKILL Redis, restart it on its AOF",
    "recovery": "SIGKILL the recovery service at a step of a pass, restart it",
    "memory": "SIGKILL the memory extractor, restart it",
    "qdrant": "Qdrant unavailable to the memory extractor for a window",
    "registry": "SIGKILL the schema registry, restart it after a window",
}
AGENT_LEASE_S = 3.0
"""The demo agents' lease TTL (``runjournal.demo.agent --lease-ttl-ms`` default), seconds."""
AGENT_KILL_WAIT_S = 10.0
"""How long a due agent kill waits for an agent that owns a run before it takes any running agent, seconds."""


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
        self.injected: dict[str, int] = dict.fromkeys(sorted({s.kind for s in plan}), 0)
        self.errors: list[str] = []
        self._work: queue.Queue[Scheduled | None] = queue.Queue()
        self._kill_due_since: float | None = None
        self._busy = threading.Event()
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
                self._busy.set()
                self._work.put(due)
            self.pending.pop(0)

    @property
    def settled(self) -> bool:
        """True when nothing is planned, queued or running."""
        return not self.pending and self._work.empty() and not self._busy.is_set()

    def drain(self, frac: float = 1.0) -> None:
        """Make everything still planned due (runs finished before the schedule did)."""
        self.tick(frac)
        for s in list(self.pending):
            if s.kind != "agents":
                self._busy.set()
                self._work.put(s)
                self.pending.remove(s)

    def close(self, timeout_s: float = 300.0) -> None:
        """Wait for the running fault to end (its processes back), then stop the worker."""
        self._work.put(None)
        self._worker.join(timeout_s)

    def counts(self) -> dict[str, int]:
        """Faults injected by kind (recovery: armed recovery services that died at their failpoint inside a pass —
        the SIGKILL that armed them does not count, so a pass that never reached the step is not reported as one)."""
        out = dict(self.injected)
        if "recovery" in out:
            out["recovery"] = self.fleet.recoverer_failpoint_deaths
        return out

    # -- the worker ----------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            self._busy.set()
            try:
                getattr(self, f"_{item.kind}")()
                if item.kind != "recovery":
                    self.injected[item.kind] += 1
            except Exception as exc:  # noqa: BLE001 - a fault that could not be injected is reported
                log.exception("fault %s failed", item.kind)
                self.errors.append(f"{item.kind}: {exc!r}"[:400])
                self.fleet.note("fault_error", item.kind, repr(exc)[:200])
            finally:
                if self._work.empty():
                    self._busy.clear()

    def _sleep(self, low: float, high: float) -> float:
        seconds = round(self.rng.uniform(low, high), 2)
        time.sleep(seconds)
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
            if time.monotonic() > deadline:
                raise RuntimeError("no live agent for 60 s")
            time.sleep(0.2)
        return name

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
            time.sleep(0.25)
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
        victim = self._busy_agent()
        if victim:
            self.fleet.kill_agent(victim, "fault recovery: killed to give the armed pass a run")
        deadline = time.monotonic() + 60
        deaths = self.fleet.recoverer_failpoint_deaths
        while self.fleet.recoverer_failpoint_deaths == deaths and time.monotonic() < deadline:
            self.fleet.reap_services()
            time.sleep(0.2)
        if self.fleet.recoverer_failpoint_deaths == deaths:  # not counted: faults_ok says so
            self.fleet.kill_recoverer(None)  # disarm, so a later pass does not die unplanned
            self.fleet.note("fault_end", "recovery", f"the armed failpoint {point} was not reached in 60 s")
        else:
            self.fleet.note("fault_end", "recovery", f"the armed recovery service died at {point}; restarted")

    def kill_agent(self, why: str = "fault agents: SIGKILL", *, busy_only: bool = False) -> bool:
        """SIGKILL an agent that owns a run now (a kill between runs tests nothing), else (unless ``busy_only``)
        any running one; True when one was killed."""
        name = self._busy_agent(fallback=not busy_only)
        return name is not None and self.fleet.kill_agent(name, why)

    def _busy_agent(self, *, fallback: bool = True) -> str | None:
        """A running agent that owns a run now (so recovery has work once it dies), else (``fallback``) any
        running agent."""
        with self.fleet.lock:
            names = sorted(n for n in self.fleet.agents if n not in self.fleet.stalled)
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
        from runjournal.consumers.memory._qdrant import open_client

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

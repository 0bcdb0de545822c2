"""The demo's processes: projector, recovery service, memory extractor and agent instances, with chaos.

Every process is a real OS process started with the same environment (``RUNJOURNAL_*`` of the
demo's own topic prefix). Kills are SIGKILL: no cleanup, no flush, like an OOM kill. Stalls are
SIGSTOP … SIGCONT: a long GC pause, a VM freeze. Every method is thread-safe (the fault campaign's
injectors run in threads of their own), and every fault is noted on the timeline.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ARCHIVE_FAILPOINTS", "CALL_FAILPOINTS", "RECOVERY_FAILPOINTS", "Fleet", "FleetClosedError", "FleetEvent",
           "write_workload"]

class FleetClosedError(RuntimeError):
    """A process was to be started after :meth:`Fleet.stop_all` (the demo is stopping)."""


#: Failpoints an agent may be armed with, so some kills land exactly inside a tool call.
CALL_FAILPOINTS = ("producers.call.before_intent_commit", "producers.call.after_intent",
                   "producers.call.after_tool", "producers.call.after_outcome")
#: Steps of a recovery pass the recovery service may be armed to die at (``consumers/recovery/job.py``).
RECOVERY_FAILPOINTS = ("recovery.after_fence", "recovery.after_read", "recovery.after_commit",
                       "recovery.inside_handover")
#: Steps of archiving a run the archiver may be armed to die at (``consumers/archive/store.py``, decision 0056).
ARCHIVE_FAILPOINTS = ("archive.after_write", "archive.after_manifest", "archive.after_tombstones")


@dataclass
class FleetEvent:
    """One thing that happened to the fleet or the stack (for the report's timeline)."""

    t_s: float
    """Seconds since the demo started."""
    kind: str
    """``spawn``, ``kill``, ``exit``, ``stop``, ``cont``, ``fault``, ``fault_end``, ``recovery`` …"""
    who: str
    """Process or component name (producer_id for agents, ``broker-2``, ``redis`` …)."""
    detail: str = ""
    """Free text (e.g. the failpoint armed, the fault kind)."""


@dataclass
class Fleet:
    """Starts, stalls and kills the demo's processes (see the module docstring)."""

    env: dict[str, str]
    workdir: Path
    workload_path: Path
    provider_url: str
    rng: random.Random
    started: float = field(default_factory=time.monotonic)
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    events: list[FleetEvent] = field(default_factory=list)
    generation: int = 0
    crashes_injected: int = 0
    projector: subprocess.Popen[bytes] | None = None
    projector_kills: int = 0
    memory: subprocess.Popen[bytes] | None = None
    recoverer: subprocess.Popen[bytes] | None = None
    recoverer_kills: int = 0
    """Recovery-service processes that died by SIGKILL (a failpoint at a step of a pass, or the chaos)."""
    recoverer_failpoint_deaths: int = 0
    """Of those, the armed ones that died at their failpoint, inside a pass (what the ``recovery`` fault is)."""
    recoverer_armed: str | None = None
    """The failpoint the running recovery service is armed with (None: unarmed)."""
    second_recoverer: subprocess.Popen[bytes] | None = None
    """A second recovery service sweeping beside the first (the ``recovery_pair`` fault), while it runs."""
    archiver: subprocess.Popen[bytes] | None = None
    """The archiver service (``runjournal archiver``: the ``archiver`` fault), while the demo runs one."""
    archiver_armed: str | None = None
    """The failpoint the running archiver is armed with (None: unarmed)."""
    archiver_kills: int = 0
    """Archiver processes that died by SIGKILL (the chaos's, or their own at an armed failpoint)."""
    archiver_failpoint_deaths: int = 0
    """Of those, the armed ones that died at their failpoint: inside the archiving of a run."""
    service_exits: int = 0
    """Projector or memory-extractor processes that exited by themselves (restarted; each one is on the timeline)."""
    advice: bool = True
    """Agents put memory and knowledge in each turn's context (``--advice on``)."""
    lock: threading.RLock = field(default_factory=threading.RLock)
    stalled: set[str] = field(default_factory=set)
    """Agents SIGSTOPped right now (never chosen for another fault until continued)."""
    armed: set[str] = field(default_factory=set)
    """Agents started armed to SIGKILL themselves at a failpoint (never the owner an operator's action waits on)."""
    protected: set[str] = field(default_factory=set)
    """Agents an operator's action waits on right now (the ``controls`` fault): no fault picks them until it is done."""
    operators: list[subprocess.Popen[bytes]] = field(default_factory=list)
    """Operator processes started (the ``operators`` fault); stopped with the rest."""
    closing: bool = False
    """Set by :meth:`stop_all`: from then on nothing is started or restarted (a fault still running on the
    campaign's worker cannot bring a service back behind the demo's back)."""

    def note(self, kind: str, who: str, detail: str = "") -> None:
        """Append a timeline entry (seconds since start)."""
        with self.lock:
            self.events.append(FleetEvent(round(time.monotonic() - self.started, 3), kind, who, detail))

    def note_at(self, t_s: float, kind: str, who: str, detail: str = "") -> None:
        """Append a timeline entry at ``t_s`` seconds since start (events another process reported)."""
        with self.lock:
            self.events.append(FleetEvent(t_s, kind, who, detail))

    def _spawn(self, argv: list[str], name: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        if self.closing:
            raise FleetClosedError(f"the demo is stopping: {name} is not started")
        log = open(self.workdir / f"{name.replace('#', '_')}.log", "ab")  # noqa: SIM115 - owned by the child
        # its own session: a Ctrl-C in the terminal reaches the demo only, which stops every process it started
        # (no traceback from each child); the demo's SIGKILLs and SIGSTOPs go to the pid, as before
        return subprocess.Popen(argv, env=env or self.env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)

    # -- agents ------------------------------------------------------------------------------------
    def spawn_agent(self, *, arm_failpoint: bool, name: str | None = None, why: str = "",
                    clock_skew_s: int = 0, graph: bool = False, commit_timeout_s: float | None = None,
                    bait: bool = False, failpoint: str | None = None) -> str:
        """Start one agent instance (a new name, or ``name`` again: a restart under the same producer_id);
        maybe armed to SIGKILL itself at a random tool-call point (``arm_failpoint``) or at ``failpoint``
        (``point=N``); ``bait``: it takes a run held for the recovery fault first (``DemoKeys.bait``)."""
        with self.lock:
            if name is None:
                self.generation += 1
                name = f"agent-{self.generation:03d}"
            env = dict(self.env)
            detail = why
            if arm_failpoint or failpoint:
                self.armed.add(name)
            else:
                self.armed.discard(name)  # a restart under the same name, unarmed
            if arm_failpoint:
                point = self.rng.choice(CALL_FAILPOINTS)
                env["RJ_FAILPOINTS"] = f"{point}={self.rng.randint(1, 6)}"
                detail = f"{detail} {env['RJ_FAILPOINTS']}".strip()
            elif failpoint:
                env["RJ_FAILPOINTS"] = failpoint
                detail = f"{detail} {failpoint}".strip()
            self.agents[name] = self._spawn(
                [sys.executable, "-m", "runjournal.demo.agent", "--producer-id", name, "--workload",
                 str(self.workload_path), "--provider", self.provider_url, "--advice", "on" if self.advice else "off",
                 "--acks", str(self.workdir / "acks" / f"{name}.jsonl"),
                 *(["--clock-skew-s", str(clock_skew_s)] if clock_skew_s else []),
                 *(["--graph"] if graph else []), *(["--bait"] if bait else []),
                 *(["--commit-timeout-s", str(commit_timeout_s)] if commit_timeout_s else [])], name, env)
            self.note("spawn", name, detail)
            return name

    def spawn_asyncio_agent(self, why: str = "") -> str:
        """Start an asyncio agent instance (``runjournal.demo.aio_agent``) that cancels the task of every third tool
        call twice and calls again (the ``cancels`` fault); one of the fleet's agents from then on."""
        with self.lock:
            self.generation += 1
            name = f"aio-agent-{self.generation:03d}"
            self.agents[name] = self._spawn(
                [sys.executable, "-m", "runjournal.demo.aio_agent", "--producer-id", name, "--workload",
                 str(self.workload_path), "--provider", self.provider_url, "--cancel-every", "3",
                 "--acks", str(self.workdir / "acks" / f"{name}.jsonl")], name)
            self.note("spawn", name, why)
            return name

    def spawn_operator(self, run_id: str, name: str) -> subprocess.Popen[bytes]:
        """An operator process that continues the FAILED run ``run_id`` (``runjournal.demo.agent --continue-run``)
        and exits; not one of the fleet's agents (no agent fault picks it)."""
        with self.lock:
            proc = self._spawn(
                [sys.executable, "-m", "runjournal.demo.agent", "--producer-id", name, "--workload",
                 str(self.workload_path), "--provider", self.provider_url, "--advice", "off", "--continue-run", run_id,
                 "--acks", str(self.workdir / "acks" / f"{name}.jsonl")], name)
            self.operators.append(proc)
            self.note("spawn", name, f"operator: continue_run {run_id}")
            return proc

    def reap(self) -> list[str]:
        """Agents that exited since the last call; self-inflicted SIGKILLs (failpoints) count as crashes."""
        gone = []
        with self.lock:
            for name, proc in list(self.agents.items()):
                rc = proc.poll()
                if rc is None:
                    continue
                del self.agents[name]
                gone.append(name)
                if rc == -signal.SIGKILL:
                    self.crashes_injected += 1
                    self.note("kill", name, "failpoint inside a tool call")
                else:
                    self.note("exit", name, f"rc={rc}")
        return gone

    def pick_agent(self) -> str | None:
        """A live, running agent (not stalled, not protected) chosen at random, or None."""
        with self.lock:
            live = sorted(p for p, proc in self.agents.items() if proc.poll() is None and p not in self.stalled
                          and p not in self.protected)
            return self.rng.choice(live) if live else None

    def kill_agent(self, name: str, why: str = "SIGKILL by chaos") -> bool:
        """SIGKILL agent ``name`` (if it still runs and no operator's action waits on it: :attr:`protected`); True
        when it was killed."""
        with self.lock:
            proc = self.agents.get(name)
            if proc is None or proc.poll() is not None or name in self.protected:
                return False
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            del self.agents[name]
            self.stalled.discard(name)
            self.crashes_injected += 1
            self.note("kill", name, why)
            return True

    def stall_agent(self, name: str, detail: str) -> bool:
        """SIGSTOP agent ``name`` (a paused zombie); True when it was stopped."""
        with self.lock:
            proc = self.agents.get(name)
            if proc is None or proc.poll() is not None:
                return False
            os.kill(proc.pid, signal.SIGSTOP)
            self.stalled.add(name)
            self.note("stop", name, detail)
            return True

    def resume_agent(self, name: str) -> None:
        """SIGCONT agent ``name`` (the zombie wakes up: its lease is gone, its producer fenced)."""
        with self.lock:
            proc = self.agents.get(name)
            self.stalled.discard(name)
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                self.note("cont", name, "SIGCONT: the zombie wakes up")

    # -- services ----------------------------------------------------------------------------------
    def start_projector(self) -> None:
        """Start (or restart) the projector service."""
        with self.lock:
            self.projector = self._spawn([sys.executable, "-m", "runjournal", "projector", "--instance-id",
                                          "demo-projector"], "projector")
            self.note("spawn", "projector")

    def kill_projector(self) -> None:
        """SIGKILL the projector and start a replacement."""
        with self.lock:
            if self.projector and self.projector.poll() is None:
                os.kill(self.projector.pid, signal.SIGKILL)
                self.projector.wait()
                self.projector_kills += 1
                self.note("kill", "projector", "SIGKILL by chaos")
            self.start_projector()

    def signal_service(self, which: str, sig: signal.Signals, detail: str) -> bool:
        """Send ``sig`` to the projector, memory extractor or recovery service; True when it was running."""
        with self.lock:
            proc = {"projector": self.projector, "memory": self.memory, "recovery": self.recoverer,
                    "archiver": self.archiver}[which]
            if proc is None or proc.poll() is not None:
                return False
            os.kill(proc.pid, sig)
            self.note({signal.SIGSTOP: "stop", signal.SIGCONT: "cont"}.get(sig, "kill"), which, detail)
            return True

    def start_memory(self) -> subprocess.Popen[bytes]:
        """Start (or restart) the memory extractor; it owns the Qdrant directory and serves others' reads."""
        with self.lock:
            self.memory = self._spawn([sys.executable, "-m", "runjournal", "memory-extractor"], "memory")
            self.note("spawn", "memory")
            return self.memory

    def kill_memory(self, why: str = "SIGKILL by chaos") -> bool:
        """SIGKILL the memory extractor (not restarted here); True when it was running."""
        with self.lock:
            if self.memory is None or self.memory.poll() is not None:
                return False
            os.kill(self.memory.pid, signal.SIGKILL)
            self.memory.wait()
            self.note("kill", "memory", why)
            return True

    def start_recoverer(self, failpoint: str | None = None) -> None:
        """Start the recovery service (``runjournal.demo.recoverer``), maybe armed to SIGKILL itself at a step."""
        with self.lock:
            env = dict(self.env)
            if failpoint:
                env["RJ_FAILPOINTS"] = failpoint
            self.recoverer = self._spawn([sys.executable, "-m", "runjournal.demo.recoverer", "--reports",
                                          str(self.workdir / "recovery.jsonl")], "recovery", env)
            self.recoverer_armed = failpoint
            self.note("spawn", "recovery", f"armed {failpoint}" if failpoint else "")

    def start_archiver(self, failpoint: str | None = None) -> None:
        """Start (or restart) the archiver service (``runjournal archiver``), maybe armed to SIGKILL itself at a step
        of archiving a run (:data:`ARCHIVE_FAILPOINTS`, ``name=N``)."""
        with self.lock:
            env = dict(self.env)
            if failpoint:
                env["RJ_FAILPOINTS"] = failpoint
            self.archiver = self._spawn([sys.executable, "-m", "runjournal", "archiver"], "archiver", env)
            self.archiver_armed = failpoint
            self.note("spawn", "archiver", f"armed {failpoint}" if failpoint else "")

    def kill_archiver(self, failpoint: str | None, why: str = "SIGKILL by chaos") -> bool:
        """SIGKILL the archiver wherever it is and start one armed to die at ``failpoint`` (None: unarmed); True when
        one was running (and was killed)."""
        with self.lock:
            killed = False
            if self.archiver is not None and self.archiver.poll() is None:
                os.kill(self.archiver.pid, signal.SIGKILL)
                self.archiver.wait()
                self.archiver_kills += 1
                killed = True
                self.note("kill", "archiver", why)
            self.start_archiver(failpoint)
            return killed

    def reap_services(self) -> None:
        """Restart a recovery service or an archiver that died (counting a SIGKILL) and a projector that exited by
        itself."""
        with self.lock:
            if self.closing:
                return
            if self.archiver is not None and (rc := self.archiver.poll()) is not None:
                if rc == -signal.SIGKILL:
                    self.archiver_kills += 1
                    self.archiver_failpoint_deaths += self.archiver_armed is not None
                    self.note("kill", "archiver", f"fault archiver: SIGKILL at {self.archiver_armed}, inside an "
                                                  "archive")
                else:
                    self.note("exit", "archiver", f"rc={rc}")
                    self.service_exits += 1
                self.start_archiver()
            if self.recoverer is not None and (rc := self.recoverer.poll()) is not None:
                if rc == -signal.SIGKILL:
                    self.recoverer_kills += 1
                    self.recoverer_failpoint_deaths += self.recoverer_armed is not None
                    self.note("kill", "recovery", f"fault recovery: SIGKILL at {self.recoverer_armed}, inside a pass")
                else:
                    self.note("exit", "recovery", f"rc={rc}")
                self.start_recoverer()
            if self.projector is not None and (rc := self.projector.poll()) is not None:
                self.note("exit", "projector", f"rc={rc}")
                self.service_exits += 1
                self.start_projector()
            if self.memory is not None and (rc := self.memory.poll()) is not None and rc != -signal.SIGKILL:
                self.note("exit", "memory", f"rc={rc}")
                self.service_exits += 1
                self.start_memory()

    def start_second_recoverer(self) -> None:
        """Start a second recovery service beside the first: two recovery actors on the same runs at once (its
        reports go to the same file; of two passes racing on a run one resumes it, the other reports a refusal)."""
        with self.lock:
            self.second_recoverer = self._spawn([sys.executable, "-m", "runjournal.demo.recoverer", "--reports",
                                                 str(self.workdir / "recovery.jsonl")], "recovery-2")
            self.note("spawn", "recovery-2", "fault recovery_pair: a second recovery service")

    def stop_second_recoverer(self) -> int | None:
        """SIGTERM the second recovery service and wait for it; its exit code (None: none ran)."""
        with self.lock:
            proc, self.second_recoverer = self.second_recoverer, None
        if proc is None:
            return None
        proc.terminate()
        try:
            return proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()

    def kill_recoverer(self, failpoint: str | None) -> None:
        """SIGKILL the recovery service wherever it is and start one armed to die at ``failpoint`` (None: unarmed)."""
        with self.lock:
            if self.recoverer is not None and self.recoverer.poll() is None:
                os.kill(self.recoverer.pid, signal.SIGKILL)
                self.recoverer.wait()
                self.recoverer_kills += 1
                self.note("kill", "recovery", "SIGKILL by chaos")
            self.start_recoverer(failpoint)

    def stop_all(self, grace_s: float = 20.0) -> None:
        """SIGCONT anything stalled, SIGTERM every process still running, then SIGKILL stragglers; nothing is
        started after this (:attr:`closing`)."""
        with self.lock:
            self.closing = True
            procs = [*self.agents.values(), *self.operators,
                     *(p for p in (self.projector, self.recoverer, self.second_recoverer, self.memory, self.archiver)
                       if p)]
            for p in procs:
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGCONT)
                    p.terminate()
        deadline = time.monotonic() + grace_s
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def timeline(self) -> list[dict[str, Any]]:
        """Fleet events as JSON-able dicts, in time order."""
        with self.lock:
            return sorted((vars(e) for e in self.events), key=lambda e: e["t_s"])


def write_workload(path: Path, scripts: list[Any]) -> None:
    """Write scripts as JSON for the agent processes (``runjournal.demo.agent.load_scripts``)."""
    from dataclasses import asdict

    path.write_text(json.dumps([asdict(s) for s in scripts]))

"""The demo's processes: provider, projector, memory extractor and agent instances, with chaos.

Every process is a real OS process started with the same environment (``RUNJOURNAL_*`` of the
demo's own topic prefix). Kills are SIGKILL: no cleanup, no flush, like an OOM kill.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Fleet", "FleetEvent"]

#: Failpoints an agent may be armed with, so some kills land exactly inside a tool call.
CALL_FAILPOINTS = ("producers.call.before_intent_commit", "producers.call.after_intent",
                   "producers.call.after_tool", "producers.call.after_outcome")


@dataclass
class FleetEvent:
    """One thing that happened to the fleet (for the report's timeline)."""

    t_s: float
    """Seconds since the demo started."""
    kind: str
    """``spawn``, ``kill``, ``exit``, ``projector_kill``, ``recovery``."""
    who: str
    """Process name (producer_id for agents)."""
    detail: str = ""
    """Free text (e.g. the failpoint armed)."""


@dataclass
class Fleet:
    """Starts and kills the demo's processes."""

    env: dict[str, str]
    workdir: Path
    workload_path: Path
    provider_url: str
    rng: random.Random
    started: float = field(default_factory=time.monotonic)
    agents: dict[str, subprocess.Popen] = field(default_factory=dict)
    events: list[FleetEvent] = field(default_factory=list)
    generation: int = 0
    crashes_injected: int = 0
    projector: subprocess.Popen | None = None
    projector_kills: int = 0
    advice: bool = True
    """Agents put memory and knowledge in each turn's context (``--advice on``)."""

    def note(self, kind: str, who: str, detail: str = "") -> None:
        """Append a timeline entry (seconds since start)."""
        self.events.append(FleetEvent(round(time.monotonic() - self.started, 3), kind, who, detail))

    def _spawn(self, argv: list[str], name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        return subprocess.Popen(argv, env=env or self.env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)

    def spawn_agent(self, *, arm_failpoint: bool) -> str:
        """Start one agent instance; maybe armed to SIGKILL itself at a random tool-call point."""
        self.generation += 1
        pid = f"agent-{self.generation:03d}"
        env = dict(self.env)
        detail = ""
        if arm_failpoint:
            point = self.rng.choice(CALL_FAILPOINTS)
            env["RJ_FAILPOINTS"] = f"{point}={self.rng.randint(1, 6)}"
            detail = env["RJ_FAILPOINTS"]
        self.agents[pid] = self._spawn([sys.executable, "-m", "runjournal.demo.agent", "--producer-id", pid,
                                        "--workload", str(self.workload_path), "--provider", self.provider_url,
                                        "--advice", "on" if self.advice else "off"],
                                       pid, env)
        self.note("spawn", pid, detail)
        return pid

    def reap(self) -> list[str]:
        """Agents that exited since the last call; self-inflicted SIGKILLs (failpoints) count as crashes."""
        gone = []
        for pid, proc in list(self.agents.items()):
            rc = proc.poll()
            if rc is None:
                continue
            del self.agents[pid]
            gone.append(pid)
            if rc == -signal.SIGKILL:
                self.crashes_injected += 1
                self.note("kill", pid, "failpoint inside a tool call")
            else:
                self.note("exit", pid, f"rc={rc}")
        return gone

    def kill_random_agent(self) -> str | None:
        """SIGKILL one live agent instance chosen at random."""
        live = [p for p, proc in self.agents.items() if proc.poll() is None]
        if not live:
            return None
        pid = self.rng.choice(live)
        os.kill(self.agents[pid].pid, signal.SIGKILL)
        self.agents[pid].wait()
        del self.agents[pid]
        self.crashes_injected += 1
        self.note("kill", pid, "SIGKILL by chaos")
        return pid

    def start_projector(self) -> None:
        """Start (or restart) the projector service."""
        self.projector = self._spawn([sys.executable, "-m", "runjournal", "projector", "--instance-id",
                                      "demo-projector"], "projector")
        self.note("spawn", "projector")

    def kill_projector(self) -> None:
        """SIGKILL the projector and start a replacement."""
        if self.projector and self.projector.poll() is None:
            os.kill(self.projector.pid, signal.SIGKILL)
            self.projector.wait()
            self.projector_kills += 1
            self.note("projector_kill", "projector", "SIGKILL by chaos")
        self.start_projector()

    def stop_all(self, grace_s: float = 20.0) -> None:
        """SIGTERM every process still running, then SIGKILL stragglers."""
        procs = [*self.agents.values(), *([self.projector] if self.projector else [])]
        for p in procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + grace_s
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def timeline(self) -> list[dict[str, object]]:
        """Fleet events as JSON-able dicts."""
        return [vars(e) for e in self.events]


def write_workload(path: Path, scripts: list) -> None:  # type: ignore[type-arg]
    """Write scripts as JSON for the agent processes (``runjournal.demo.agent.load_scripts``)."""
    from dataclasses import asdict

    path.write_text(json.dumps([asdict(s) for s in scripts]))

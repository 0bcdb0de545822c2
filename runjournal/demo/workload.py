"""Workloads for the demo: tau-bench trajectories, or a generated workload of the same shape.

A workload is a list of :class:`RunScript`. An agent instance executes a script step by step
through ``producers`` (each step is one node, so a resumed run skips the steps whose node
already succeeded); the recorded tool results and the recorded outcome make the run
deterministic, so the end state can be checked against the input.

tau-bench pairing rule (``../shared/data/trajectories/SOURCE.md``): ``tool_call_id`` values
repeat within a run, so each tool result is paired with the call just before it, never by id.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "SIDE_EFFECT_TOOLS",
    "RunScript",
    "Step",
    "WorkloadError",
    "generated_workload",
    "load_tau_bench",
    "turns",
]

#: Tools that change the airline database (SOURCE.md "Side-effecting tools").
SIDE_EFFECT_TOOLS = frozenset({
    "book_reservation", "cancel_reservation", "update_reservation_flights",
    "update_reservation_baggages", "update_reservation_passengers", "send_certificate",
})


class WorkloadError(ValueError):
    """An input file is not a tau-bench trajectory array (the message says what is missing, and where)."""


@dataclass(frozen=True)
class Step:
    """One step of a run: a transcript turn, or a tool call with its recorded result."""

    kind: Literal["message", "tool"]
    """``message`` (a transcript turn) or ``tool`` (a call)."""
    role: str = ""
    """Message role (``user`` / ``assistant``); empty for tool steps."""
    content: str = ""
    """Message text; empty for tool steps."""
    tool: str = ""
    """Tool name."""
    args: dict[str, Any] = field(default_factory=dict)
    """Tool arguments (decoded from the trajectory's JSON string)."""
    result: str = ""
    """The recorded tool result (a string; ``Error: …`` for a failed call)."""
    side_effect: bool = False
    """True for tools that change the provider's state (executed by the provider process)."""
    needs_approval: bool = False
    """True when a human must approve the call before it runs (generated workload only)."""


@dataclass(frozen=True)
class RunScript:
    """A run to execute: identity, scope, the steps, and the recorded outcome to reproduce."""

    run_id: str
    """Deterministic run id (``tau-<task>-<trial>`` or ``gen-<n>``)."""
    tenant_id: str
    """Tenant (one per workload source)."""
    user_id: str
    """The end user."""
    agent: str
    """Agent name."""
    instruction: str
    """The run's input."""
    steps: tuple[Step, ...]
    """Steps in order."""
    succeeded: bool
    """The recorded outcome: reward 1.0 → True."""

    @property
    def side_effects(self) -> int:
        """Number of side-effecting tool calls (each must execute exactly once)."""
        return sum(1 for s in self.steps if s.kind == "tool" and s.side_effect)


def load_tau_bench(path: Path, *, limit: int | None = None) -> list[RunScript]:
    """Read a tau-bench trajectory JSON array into run scripts.

    Raises:
        WorkloadError: the file is not an array of runs with ``traj`` / ``reward`` / ``task_id``.
        OSError: the file cannot be read.
    """
    try:
        data = json.loads(Path(path).read_text())
    except ValueError as exc:
        raise WorkloadError(f"{path}: not JSON ({exc})") from exc
    if not isinstance(data, list):
        raise WorkloadError(f"{path}: expected a JSON array of runs, got {type(data).__name__}")
    scripts = []
    for i, run in enumerate(data[:limit] if limit else data):
        if not isinstance(run, dict):
            raise WorkloadError(f"{path}: run #{i} is a {type(run).__name__}, not an object")
        try:
            scripts.append(_tau_run(path, i, run))
        except WorkloadError:
            raise
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
            raise WorkloadError(f"{path}: run #{i} is not a tau-bench trajectory "
                                f"({type(exc).__name__}: {exc})") from exc
    return scripts


def _tau_run(path: Path, index: int, run: dict[str, Any]) -> RunScript:
    for key in ("traj", "reward", "task_id"):
        if key not in run:
            raise WorkloadError(f"{path}: run #{index} has no '{key}'")
    steps: list[Step] = []
    pending: tuple[str, dict[str, Any]] | None = None
    for msg in run["traj"]:
        role = msg.get("role")
        if role == "assistant" and msg.get("tool_calls"):
            fn = msg["tool_calls"][0]["function"]
            pending = (fn["name"], json.loads(fn.get("arguments") or "{}"))
            if msg.get("content"):
                steps.append(Step(kind="message", role="assistant", content=msg["content"]))
        elif role == "tool":
            if pending is None:
                raise WorkloadError(f"{path}: run #{index} has a tool result without a call before it")
            name, args = pending  # pair with the call just before (tool_call_id repeats)
            steps.append(Step(kind="tool", tool=name, args=args, result=str(msg.get("content", "")),
                              side_effect=name in SIDE_EFFECT_TOOLS))
            pending = None
        elif role in {"user", "assistant"} and msg.get("content"):
            steps.append(Step(kind="message", role=role, content=str(msg["content"])))
    task = run.get("info", {}).get("task", {})
    return RunScript(run_id=f"tau-{run['task_id']}-{run.get('trial', 0)}", tenant_id="tau-airline",
                     user_id=str(task.get("user_id") or "unknown"), agent="gpt-4o-airline",
                     instruction=str(task.get("instruction") or ""), steps=tuple(steps),
                     succeeded=float(run["reward"]) >= 1.0)


_CITIES = ["JFK", "SEA", "SFO", "LAX", "ORD", "ATL", "BOS", "DEN", "MIA", "PHX"]
_PREFS = ["I prefer window seats.", "I prefer aisle seats.", "I'd like vegetarian meals, please.",
          "I never want to fly with a layover.", "Please always use my travel certificate first."]


def generated_workload(n_runs: int = 60, *, seed: int = 7, tenants: int = 3) -> list[RunScript]:
    """A synthetic airline workload of the tau-bench shape, with approvals.

    Each run: a greeting with a stated preference, lookups (read-only), 0–3 side-effecting
    calls (some returning ``Error: …`` as real providers do), cancellations needing approval,
    and a recorded outcome (about 60 % succeed). Deterministic for a given seed.
    """
    rng = random.Random(seed)
    return [_generated_run(rng, i, f"tenant-{i % tenants}") for i in range(n_runs)]


def _generated_run(rng: random.Random, i: int, tenant: str) -> RunScript:
    user = f"user_{i % 17}"
    steps = [Step(kind="message", role="user", content=f"Hi, I'm {user}. {rng.choice(_PREFS)}"),
             Step(kind="tool", tool="get_user_details", args={"user_id": user},
                  result=json.dumps({"user_id": user, "membership": rng.choice(["gold", "silver", "regular"])}))]
    for j in range(rng.randint(0, 3)):
        origin, dest = rng.sample(_CITIES, 2)
        steps.append(Step(kind="tool", tool="search_direct_flight",
                          args={"origin": origin, "destination": dest, "date": f"2024-05-{10 + j}"},
                          result=json.dumps([{"flight": f"HAT{rng.randint(100, 999)}",
                                              "price": rng.randint(80, 900)}])))
        steps.append(Step(kind="message", role="assistant", content=f"I found flights from {origin} to {dest}."))
        if rng.random() < 0.5:
            failed = rng.random() < 0.2
            steps.append(Step(kind="tool", tool="book_reservation", side_effect=True,
                              args={"user_id": user, "origin": origin, "destination": dest, "n": j},
                              result="Error: not enough seats" if failed else
                              json.dumps({"reservation_id": f"R{i:03d}{j}", "status": "booked"})))
        if rng.random() < 0.3:
            steps.append(Step(kind="tool", tool="cancel_reservation", side_effect=True, needs_approval=True,
                              args={"reservation_id": f"OLD{i:03d}{j}"},
                              result=json.dumps({"reservation_id": f"OLD{i:03d}{j}", "status": "cancelled"})))
    steps.append(Step(kind="message", role="user", content="Thanks, that's all."))
    return RunScript(run_id=f"gen-{i:04d}", tenant_id=tenant, user_id=user, agent="airline-generated",
                     instruction="book or change flights", steps=tuple(steps), succeeded=rng.random() < 0.6)


def turns(script: RunScript) -> list[list[int]]:
    """The script's tool steps grouped into model turns: consecutive tool steps share a turn; a step that needs
    an approval is a turn of its own. Messages are not in any turn."""
    out: list[list[int]] = []
    current: list[int] = []
    for i, step in enumerate(script.steps):
        if step.kind != "tool" or step.needs_approval:
            if current:
                out.append(current)
                current = []
            if step.kind == "tool":
                out.append([i])
            continue
        current.append(i)
    if current:
        out.append(current)
    return out

"""The campaign's ``controls`` fault: an operator acts on the fleet's runs while it works, through
:class:`runjournal.consumers.ops.control.Operator` (docs/design/decisions/0047-operator-controls.md, 0049-fork.md).

One fault is four actions — the pause and the cancel at once, each through an Operator of its own — each checked as
it happens (``live``) and again at the end from the journal and the provider's ledger
(``runjournal.demo.verify.control_checks``):

1. **pause** a run a live, unarmed agent owns — it must become PAUSED, held for nobody, and the agent's code must
   have got ``RunPausedError`` (the agent notes it in ``rj:{P:demo}:stopped``);
2. **cancel** another run a live, unarmed agent owns — it must end CANCELLED, its agent's code having got
   ``RunCancelledError``; it is recorded as cancelled on purpose (its expected outcome is CANCELLED);
3. **resume** the paused run once it was held a while (still PAUSED, nobody resumed it) — handed to a live instance,
   which continues it to the end its input says (a resume answered ``superseded`` — another recovery actor fenced
   the pass — or ``no_live_instance`` leaves the run paused: the operator asks again);
4. **fork** a finished run at a seeded point of its history — a dry run first (its ``may_repeat`` list is recorded),
   then the fork, handed to a live instance, which runs it with the script of its lineage's root and ends it as its
   source's input says.

A pause or cancel is requested once its run committed a side effect while its script has more to come (waiting up
to 6 s), so the request lands between effects. The fault ends once the resumed run and the fork ended. The owners of
the runs paused and cancelled are protected from the other faults while the request is carried out
(``Fleet.protected``), so what the agent's code saw is attributable. The runs to pause and cancel are held out of the
queue until the fault starts and paced like a model's turns (``Campaign.hold_bait``, ``DemoKeys.paced``), so the fault
always has runs that just started; a request that lost the race with the run's end (the run ended first) is noted
and tried on another run.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from runjournal.consumers.ops.control import ControlRefusedError, ControlResult, ForkResult, Operator
from runjournal.consumers.ops.inspect import read_run_events
from runjournal.core import redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.demo.agent import DemoKeys
from runjournal.demo.fleet import Fleet
from runjournal.demo.workload import RunScript
from runjournal.model.reducer import RunState, RunStatus
from runjournal.producers.tools import is_builtin
from runjournal.schemas import EventType

__all__ = ["ATTEMPTS", "CONTROL_RUNS", "OPERATOR", "ControlAction", "Controls"]

CONTROL_RUNS = 3
"""Runs held out of the queue for each planned ``controls`` fault: one to pause, one to cancel, one to spare (a run
that ends before its request is carried out is replaced by the next)."""
ATTEMPTS = 6
"""Runs a pause (or a cancel) is tried on before the fault fails: each earlier one ended before it was carried out."""
OPERATOR = "demo-controls"
"""``requested_by`` of every action of the fault."""
_ENDED = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED})
_ASK_AGAIN = frozenset({"no_live_instance", "superseded", "retry_later"})
"""Resume outcomes after which the run is still paused and nobody else will resume it: the operator asks again."""


@dataclass
class ControlAction:
    """One operator action of the fault and what was seen while the fleet ran (the summary's ``controls``)."""

    action: str
    """``pause``, ``resume``, ``cancel`` or ``fork``."""
    run_id: str
    """The run acted on (a fork: its source)."""
    outcome: str
    """The Operator's outcome (``paused``, ``resumed``, ``cancelled``, ``forked``)."""
    t_s: float
    """When it was carried out, seconds since the demo started."""
    detail: str = ""
    """The Operator's sentence."""
    owner: str | None = None
    """pause / cancel: the agent that owned the run; resume / fork: the instance it was handed to."""
    request_id: str | None = None
    """pause / cancel: the request carried out."""
    live: dict[str, bool] = field(default_factory=dict)
    """Checks made as it happened: what was checked -> held."""
    fork_run_id: str | None = None
    """fork: the fork's run id."""
    at_seq: int | None = None
    """fork: the fork point (the source's seq)."""
    may_repeat: list[str] = field(default_factory=list)
    """fork: the dry run's ``may_repeat`` call ids (the source's keys of the effects the fork may perform again)."""
    dry_run: dict[str, int] = field(default_factory=dict)
    """fork: the dry run's calls by class (returned, reconciled, rerun, may_repeat)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return asdict(self)


class Controls:
    """Carries out one ``controls`` fault (see the module docstring).

    Args:
        fleet: the demo's processes (its ``protected`` set, its timeline).
        settings: the demo's settings.
        scripts: the workload, by run id.
        rng: the campaign's seeded random source.
        aborted: set when the demo stops: every wait ends.
    """

    def __init__(self, fleet: Fleet, settings: Settings, scripts: dict[str, RunScript], rng: random.Random,
                 aborted: threading.Event) -> None:
        self.fleet, self.settings, self.scripts, self.rng, self.aborted = fleet, settings, scripts, rng, aborted
        self.r = redis_client.client(settings, socket_timeout=10)
        self.keys = RedisKeys(settings.topic_prefix)
        self.demo_keys = DemoKeys(settings.topic_prefix)
        self.fresh: Callable[[list[str]], set[str]] = set
        """Of finished runs, those a fork may take (the campaign's ``archive_safe`` with the archiver on: never one
        it may archive under the fork); all of them by default."""

    def run(self, held: list[str], into: list[dict[str, Any]]) -> None:
        """Pause, cancel, resume and fork (module docstring), appending each action to ``into`` as it is done.

        Args:
            held: the runs held for this fault, just queued first (preferred targets for the pause and the cancel).
            into: the campaign's list of actions (the summary's ``controls``).

        Raises:
            RuntimeError: an action could not be carried out or a live check did not hold (every action that could
                be carried out was, and is in ``into``).
        """
        failures: list[str] = []
        touched: set[str] = set()
        with Operator(self.settings, wait_s=30.0) as op, Operator(self.settings, wait_s=30.0) as other:
            first = self._target(op, held, touched)  # both picked first: runs that just started, owned right now
            second = self._target(op, held, touched)
            with ThreadPoolExecutor(2, thread_name_prefix="controls") as pool:  # at once: both meet their runs early
                pausing = pool.submit(self._attempt, failures, "pause",
                                      lambda: self._stop(op, "pause", first, held, touched, into))
                cancelling = pool.submit(self._attempt, failures, "cancel",
                                         lambda: self._stop(other, "cancel", second, held, touched, into))
                paused, cancelled = pausing.result(), cancelling.result()
        resumed = fork = None
        if paused is not None:
            self.aborted.wait(1.5)  # held a while: nobody but the operator resumes it
            with Operator(self.settings, wait_s=30.0) as op:  # one per action, as each command is a process of its own
                resumed = self._attempt(failures, "resume", lambda: self._resume(op, paused, into))
        with Operator(self.settings, wait_s=30.0) as op:
            fork = self._attempt(failures, "fork", lambda: self._fork(op, touched | {cancelled or ""}, into))
            for action, run_id in (("resume", resumed), ("fork", fork)):
                if run_id is not None:
                    self._attempt(failures, f"{action} end", lambda a=action, r=run_id: self._ended(op, a, r, into))
        failed = [f"{a['action']} {a['run_id']}: {k}" for a in into for k, ok in a["live"].items() if not ok]
        if failures or failed:
            raise RuntimeError("controls: " + "; ".join(failures + failed))

    def _attempt(self, failures: list[str], what: str, act: Callable[[], str | None]) -> str | None:
        """Run one action; a failure is noted (on the timeline too) and the fault goes on with the next."""
        try:
            return act()
        except Exception as exc:  # noqa: BLE001 - reported in the fault's error, after the other actions
            failures.append(f"{what}: {exc!r}"[:300])
            self.fleet.note("fault_error", "controls", f"{what}: {exc!r}"[:200])
            return None

    def _t(self) -> float:
        return round(time.monotonic() - self.fleet.started, 3)

    # -- pause and cancel ----------------------------------------------------------------------------------------
    def _stop(self, op: Operator, action: str, target: tuple[str, str] | None, held: list[str], touched: set[str],
              into: list[dict[str, Any]]) -> str:
        """Pause (or cancel) ``target`` (a run and its owner, protected), else a run a live, unarmed agent owns; tried
        on another run when the run ended first."""
        for _attempt in range(ATTEMPTS):
            target = target or self._target(op, held, touched)
            if target is None:
                raise RuntimeError("no run owned by a live, unarmed agent for 30 s")
            (run_id, agent), target = target, None
            try:
                done = self._mid_way(op, run_id)
                self.fleet.note("fault", run_id, f"fault controls: {action} requested (owner {agent}, "
                                f"{done} side effect(s) committed)")
                result = self._request(op, action, run_id)
                if result is not None and result.outcome == "requested":  # never carried out: it must not land later
                    if action == "pause":
                        op.resume(run_id, reason="the controls fault gave up on its pause", requested_by=OPERATOR)
                    raise RuntimeError(f"the {action} of {run_id} was not carried out in 90 s ({result.detail})")
                if result is None or result.outcome != {"pause": "paused", "cancel": "cancelled"}[action]:
                    outcome = result.outcome if result is not None else "refused: it had ended"
                    self.fleet.note("fault", run_id, f"controls: the run ended before the {action} ({outcome})")
                    continue
                want = RunStatus.PAUSED if action == "pause" else RunStatus.CANCELLED
                state = self._wait_state(op, run_id, lambda st, w=want: st.status is w, timeout_s=30)
                request_id = (result.request or {}).get("request_id")
                saw = self._agent_saw(run_id, request_id)
            finally:
                with self.fleet.lock:
                    self.fleet.protected.discard(agent)
            error = "RunPausedError" if action == "pause" else "RunCancelledError"
            live = {f"became {want.value}": state is not None and state.status is want,
                    f"the owner's code got {error}": saw is not None and saw.get("error") == error
                    and str(saw.get("instance", "")).split("#")[0] == agent}
            if action == "pause":
                live["held for nobody"] = state is not None and state.owner is None
            into.append(ControlAction(action, run_id, result.outcome, self._t(), result.detail, owner=agent,
                                      request_id=request_id, live=live).as_dict())
            self.fleet.note("fault_end", run_id, f"controls: {result.outcome} ({result.detail})"[:200])
            return run_id
        raise RuntimeError(f"no {action} was carried out in {ATTEMPTS} attempts: each run ended first")

    def _mid_way(self, op: Operator, run_id: str, wait_s: float = 6.0) -> int:
        """Wait (up to ``wait_s``) until the run committed a side effect while its script has more to come, so the
        request stops it between effects; the side effects committed (by its projection)."""
        deadline = time.monotonic() + wait_s
        while True:
            state = op.state(run_id)
            done = sum(1 for rec in state.records.values()
                       if rec.side_effect and rec.effect_committed and not is_builtin(rec.tool)) \
                if state is not None else 0
            if done >= 1 or self.scripts[run_id].side_effects < 2 or time.monotonic() > deadline \
                    or (state is not None and state.status in _ENDED) or self.aborted.is_set():
                return done
            self.aborted.wait(0.1)

    def _request(self, op: Operator, action: str, run_id: str) -> ControlResult | None:
        """The Operator's pause / cancel, waiting on past its own wait when the owner has not carried it out yet;
        None when the run had ended (refused)."""
        act = op.pause if action == "pause" else op.cancel
        try:
            result = act(run_id, reason="the campaign's controls fault", requested_by=OPERATOR)
        except ControlRefusedError:
            return None
        if result.outcome == "requested":
            state = self._wait_state(op, run_id, lambda st: st.status is RunStatus.PAUSED or st.status in _ENDED,
                                     timeout_s=60)
            if state is not None and (state.status is RunStatus.PAUSED or state.status in _ENDED):
                result.outcome = {RunStatus.PAUSED: "paused", RunStatus.CANCELLED: "cancelled"}.get(
                    state.status, state.status.value.lower())
        return result

    def _target(self, op: Operator, prefer: list[str], exclude: set[str],
                wait_s: float = 30.0) -> tuple[str, str] | None:
        """A run of the workload a live, unarmed, running agent owns (one of ``prefer`` while one may come, else any,
        the one with most tool steps left first) and that agent, now protected from the other faults; None when
        there was none for ``wait_s``."""
        deadline, prefer_until = time.monotonic() + wait_s, time.monotonic() + 10
        while time.monotonic() < deadline and not self.aborted.is_set():
            owned = self._owned(op)
            with self.fleet.lock:
                fit = {n for n, p in self.fleet.agents.items() if p.poll() is None}
                fit -= self.fleet.stalled | self.fleet.armed | self.fleet.protected
                runs = sorted(r for r, inst in owned.items() if inst.split("#")[0] in fit and r not in exclude
                              and r in self.scripts)
                preferred = [r for r in runs if r in prefer]
                pick = preferred or (runs if time.monotonic() > prefer_until else [])
                if pick:
                    left = {r: self._steps_left(op, r) for r in pick}
                    most = max(left.values())
                    run_id = self.rng.choice([r for r in pick if left[r] == most])
                    agent = owned[run_id].split("#")[0]
                    self.fleet.protected.add(agent)
                    exclude.add(run_id)
                    return run_id, agent
            self.aborted.wait(0.2)
        return None

    def _owned(self, op: Operator) -> dict[str, str]:
        """run id -> the live instance that owns it (Redis: the instances' owned sets, their leases)."""
        live = op.instances.live()
        out: dict[str, str] = {}
        for key in redis_client.scan_keys(self.r, self.keys.instance_glob("owned")):
            inst = self.keys.instance_of(key, "owned")
            if inst in live:
                out.update({m.decode(): inst for m in self.r.smembers(key)})
        return out

    def _steps_left(self, op: Operator, run_id: str) -> int:
        """Tool steps of the run's script it has not called yet (by its projected records)."""
        state = op.state(run_id)
        tools = sum(1 for s in self.scripts[run_id].steps if s.kind == "tool")
        return tools - (sum(1 for rec in state.records.values() if not is_builtin(rec.tool))
                        if state is not None else 0)

    def _agent_saw(self, run_id: str, request_id: str | None, wait_s: float = 15.0) -> dict[str, Any] | None:
        """The agent's note that its code met the request (``DemoKeys.stopped``), waiting up to ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not self.aborted.is_set():
            raw = self.r.hget(self.demo_keys.stopped, f"{run_id}|{request_id}")
            if raw is not None:
                note: dict[str, Any] = json.loads(raw)
                return note
            self.aborted.wait(0.2)
        return None

    def _wait_state(self, op: Operator, run_id: str, done: Callable[[RunState], bool],
                    timeout_s: float) -> RunState | None:
        """The run's projected state once ``done`` holds for it (or the last one read after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        state = op.state(run_id)
        while (state is None or not done(state)) and time.monotonic() < deadline and not self.aborted.is_set():
            self.aborted.wait(0.2)
            state = op.state(run_id)
        return state

    # -- resume --------------------------------------------------------------------------------------------------
    def _resume(self, op: Operator, run_id: str, into: list[dict[str, Any]]) -> str:
        """Resume the paused run (after checking nobody did meanwhile); handed to a live instance."""
        state = op.state(run_id)
        still = state is not None and state.status is RunStatus.PAUSED and state.owner is None
        deadline = time.monotonic() + 60
        while True:  # as an operator would: ask again when nobody took it or another recovery actor fenced the pass
            result = op.resume(run_id, reason="the campaign's controls fault", requested_by=OPERATOR)
            if result.outcome not in _ASK_AGAIN or time.monotonic() > deadline or self.aborted.is_set():
                break
            self.fleet.note("fault", run_id, f"controls: resume answered {result.outcome}: asked again")
            self.aborted.wait(1.0)
        live = {"still PAUSED and held for nobody until resumed": still,
                "handed to a live instance": result.outcome == "resumed" and bool(result.owner)}
        into.append(ControlAction("resume", run_id, result.outcome, self._t(), result.detail, owner=result.owner,
                                  live=live).as_dict())
        self.fleet.note("fault", run_id, f"fault controls: resume: {result.outcome} ({result.detail})"[:200])
        if result.outcome != "resumed":
            raise RuntimeError(f"resume of {run_id}: {result.outcome} ({result.detail})")
        return run_id

    # -- fork ----------------------------------------------------------------------------------------------------
    def _fork(self, op: Operator, exclude: set[str], into: list[dict[str, Any]]) -> str:
        """Fork a finished run of the workload (most side effects first) at a seeded point before its last side
        effect: a dry run, then the fork; returns the fork's run id."""
        source = self._finished_source(op, exclude)
        at_seq, dry = self._fork_point(op, source)
        result: ForkResult | None = None
        deadline = time.monotonic() + 30
        while result is None or (result.outcome == "no_live_instance" and time.monotonic() < deadline
                                 and not self.aborted.is_set()):
            if result is not None:
                self.aborted.wait(1.0)
            fork_id = f"{source}-fork-{self.rng.getrandbits(32):08x}"
            result = op.fork(source, at_seq=at_seq, new_run_id=fork_id, reason="the campaign's controls fault",
                             requested_by=OPERATOR)
        # the provider's effects (a spend step after the fork point is charged again on the ledger, not the provider)
        may_repeat = [c["call_id"] for c in dry.preview["may_repeat"] if not is_builtin(str(c.get("tool", "")))]
        live = {"handed to a live instance": result.outcome == "forked" and bool(result.assigned_to),
                "the fork's preview is its dry run's": result.preview == dry.preview}
        into.append(ControlAction("fork", source, result.outcome, self._t(), result.detail,
                                  owner=result.assigned_to, live=live, fork_run_id=result.fork_run_id,
                                  at_seq=at_seq, may_repeat=may_repeat,
                                  dry_run={k: len(v) for k, v in dry.preview.items()}).as_dict())
        self.fleet.note("fault", result.fork_run_id, f"fault controls: fork of {source} at seq {at_seq}: "
                        f"{result.outcome}, {len(may_repeat)} effect(s) may repeat ({result.detail})"[:200])
        if result.outcome != "forked":
            raise RuntimeError(f"fork of {source}: {result.outcome} ({result.detail})")
        return result.fork_run_id

    def _finished_source(self, op: Operator, exclude: set[str]) -> str:
        """A run of the workload that ended SUCCEEDED or FAILED, with the most side effects (seeded among equals)."""
        deadline = time.monotonic() + 60
        while not self.aborted.is_set():
            ended = []
            for run_id in sorted(self.scripts):
                state = op.state(run_id) if run_id not in exclude else None
                if state is not None and state.status in (RunStatus.SUCCEEDED, RunStatus.FAILED):
                    ended.append(run_id)
            fresh = self.fresh(ended)  # the archiver on: none it may archive under the fork
            ended = [r for r in ended if r in fresh]  # in their order: the seeded pick is the one it was
            if ended:
                most = max(self.scripts[r].side_effects for r in ended)
                return self.rng.choice([r for r in ended if self.scripts[r].side_effects == most])
            if time.monotonic() > deadline:
                break
            self.aborted.wait(1.0)
        raise RuntimeError("no run of the workload ended SUCCEEDED or FAILED within 60 s")

    def _fork_point(self, op: Operator, source: str) -> tuple[int, ForkResult]:
        """A seeded fork point before the source's last side effect (so its dry run lists effects that may repeat)
        whose dry run has no call to run again under the source's key (``rerun``: a call failed at that point), and
        that dry run."""
        events = [row["event"] for row in read_run_events(self.settings, source) if "event" in row]
        effects = [e.seq for e in events if e.type == EventType.TOOL_CALL_INTENDED and e.payload.get("side_effect")]
        last = max(effects) - 1 if effects else max(e.seq for e in events)
        dry: ForkResult | None = None
        for _ in range(5):
            at_seq = self.rng.randint(1, max(1, last))
            dry = op.fork(source, at_seq=at_seq, dry_run=True, requested_by=OPERATOR)
            if not dry.preview["rerun"]:
                return at_seq, dry
        assert dry is not None
        return dry.at_seq, dry

    # -- ends ----------------------------------------------------------------------------------------------------
    def _ended(self, op: Operator, action: str, run_id: str, into: list[dict[str, Any]]) -> str:
        """Wait for the resumed run (or the fork) to end; the check: it ended as its input (its source's) says."""
        entry = next(a for a in into if a["action"] == action and (a["run_id"] == run_id or
                                                                   a.get("fork_run_id") == run_id))
        script = self.scripts[entry["run_id"]]
        state = self._wait_state(op, run_id, lambda st: st.status in _ENDED, timeout_s=240)
        want = RunStatus.SUCCEEDED if script.succeeded else RunStatus.FAILED
        got = state.status.value if state is not None else "not projected"
        entry["live"][f"ended {want.value} as its input says"] = state is not None and state.status is want
        what = "the resumed run" if action == "resume" else "the fork"
        self.fleet.note("fault_end", run_id, f"controls: {what} ended {got}")
        return run_id

"""A demo agent instance: takes runs (new ones from a queue, recovered ones from its assignment list)
and executes their scripts through ``producers`` — every turn as MESSAGE, every tool call through
the side-effect protocol, approvals through the inbox, and the recorded outcome at the end.

Before each model turn (an assistant message or a tool call) it builds the turn's context with the
:class:`~runjournal.consumers.context.ContextManager` — the run's execution facts first, then memory and
knowledge labelled advisory — for the user's latest message. The recorded script decides what the turn
does (there is no model here); the context is what a model would be given, and the last one of each run
is kept in ``rj:{P:demo}:context`` for the report (counters in ``rj:{P:demo}:contexts``).

Run as a process: ``python -m runjournal.demo.agent --producer-id ID --workload FILE --provider URL
[--acks FILE]``. It exits when the queue is empty and ``rj:{P:demo}:done`` is set, or on SIGTERM.

An operator's request met by a run (``RunStoppedError``: paused, cancelled, released while it waits —
docs/design/decisions/0047-operator-controls.md) leaves that run: the agent notes it in ``rj:{P:demo}:stopped``
(:func:`note_stopped`, the ``controls`` fault's witness that the agent's code got the error), takes it off its
claimed list and goes on with other work; a resumed run comes back through an assignment like any other. A fork
(``runjournal fork``) comes the same way: its id is not in the workload, its script is the one of its lineage's root
(:func:`script_for`).

With ``--acks`` every transaction the broker acknowledged to this instance is appended to FILE as one JSON
line per record (``{"k": key, "p": partition, "o": offset}``, from the Journal's ``on_acked``: the delivery
reports of a committed transaction): the verifier's independent witness that every acknowledged event is in
the topic. A file, not Redis — the campaign kills Redis too. Short Redis outages of the demo's own queue
calls are waited out (tenacity, up to 20 s); a longer one ends the process (its runs are recovered).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import redis
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

from runjournal.consumers.context import Context, ContextManager
from runjournal.core import dependency_errors, redis_client
from runjournal.core.logs import setup_logging
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.demo.spend import charge_turn, model_turns
from runjournal.demo.tools import ProviderTool, RecordedTool
from runjournal.demo.workload import RunScript, Step
from runjournal.producers import Journal, OutcomeUnknownError, RunExistsError, RunHandle, RunStoppedError
from runjournal.producers.approvals import ApprovalInbox, await_approval

__all__ = ["DemoKeys", "TurnContexts", "execute", "load_scripts", "main", "note_stopped", "script_for"]

log = logging.getLogger("runjournal.demo.agent")

PACE_S = 0.4
"""Seconds each model turn (each step) of a paced run takes (``DemoKeys.paced``)."""


class DemoKeys:
    """Redis keys of the demo's work queue (``rj:{P:demo}:*``: one hash tag, so LMOVE queue → claimed works on a
    Redis Cluster; ``runjournal.core.redis_keys``)."""

    def __init__(self, prefix: str) -> None:
        self._keys = RedisKeys(prefix)
        self.queue = self._keys.demo("queue")
        self.done = self._keys.demo("done")
        self.bait = self._keys.demo("bait")
        """Runs held out of the queue for the ``recovery`` fault's bait agent (``runjournal.demo.faults``): an agent
        armed to die before its first side effect is sent takes one, so the armed recovery pass always has a run
        to recover."""
        self.contexts = self._keys.demo("contexts")
        """Hash of counters: built, with_memory, with_knowledge, advice_unavailable, facts_pending (the run not yet
        projected: the context holds no facts and, without a tenant, no memory)."""
        self.context = self._keys.demo("context")
        """Hash run_id -> the JSON of the run's last context."""
        self.controls = self._keys.demo("controls")
        """Runs held out of the queue for the ``controls`` fault (``runjournal.demo.faults``): queued first when it
        starts, so an operator has runs a live agent owns to pause and cancel."""
        self.paced = self._keys.demo("paced")
        """Runs whose model turns take :data:`PACE_S` each (the ``controls`` fault's runs): the demo's recorded turns
        take no time, a model's take seconds — an operator's request meets a paced run mid-way."""
        self.stopped = self._keys.demo("stopped")
        """Hash ``<run_id>|<request_id>`` -> JSON ``{run_id, action, instance, request_id, requested_by}``: an
        operator's request the agent's code met (:func:`note_stopped`)."""
        self.prefix = prefix

    def claimed(self, producer_id: str) -> str:
        """Runs an instance took from the queue (moved atomically, so a crash never loses one)."""
        return self._keys.demo(f"claimed:{producer_id}")

    def claimed_glob(self) -> str:
        """Every instance's claimed list."""
        return self._keys.demo("claimed:*")

    def owner_of_claimed(self, key: bytes | str) -> str:
        """The instance whose claimed list ``key`` is."""
        text = key.decode() if isinstance(key, bytes) else key
        return text[len(self._keys.demo("claimed:")):]

    def owned_glob(self) -> str:
        """SCAN pattern of the instances' owned-run sets (``RedisKeys.instance_glob``, the journal's layout)."""
        return self._keys.instance_glob("owned")

    def assign_glob(self) -> str:
        """SCAN pattern of the instances' assignment lists (``RedisKeys.instance_glob``)."""
        return self._keys.instance_glob("assign")


def _redis_transient(exc: BaseException) -> bool:
    """A Redis failure waiting fixes, by what it means (runjournal.core.dependency_errors: refused, timed out, a
    cluster slot moving …); a refused login or ACL, or a bug, is raised at once."""
    found = dependency_errors.redis_meaning(exc)
    return found is not None and found.kind == dependency_errors.TRANSIENT


_redis_waits = retry(retry=retry_if_exception(_redis_transient),
                     wait=wait_exponential(multiplier=0.05, max=1.0), stop=stop_after_delay(20), reraise=True)


class AckLog:
    """Appends the broker's acknowledgements of this instance to a JSON-lines file (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def __call__(self, acked: list[tuple[str, int, int]]) -> None:
        """Journal ``on_acked`` hook: one ``write(2)`` per transaction (a SIGKILL leaves whole lines)."""
        os.write(self._fd, "".join(json.dumps({"k": k, "p": p, "o": o}) + "\n" for k, p, o in acked).encode())


def load_scripts(path: Path) -> dict[str, RunScript]:
    """The workload file the orchestrator wrote: run_id -> script."""
    out = {}
    for raw in json.loads(Path(path).read_text()):
        steps = tuple(Step(**s) for s in raw.pop("steps"))
        out[raw["run_id"]] = RunScript(steps=steps, **raw)
    return out


def script_for(scripts: dict[str, RunScript], run_id: str, lineage: tuple[str, ...] = ()) -> RunScript:
    """The script of ``run_id``: its own, or — a fork, whose id is not in the workload — the one of its lineage's root
    (``lineage``: ``RecoveryPlan.fork_lineage``, nearest source first; a fork of a fork re-executes the same code).

    Raises:
        KeyError: neither the run nor any run of its lineage is in the workload.
    """
    for candidate in (run_id, *reversed(lineage)):
        if candidate in scripts:
            return scripts[candidate]
    raise KeyError(f"run {run_id} (lineage {list(lineage)}) is not in the workload")


def lineage_of(handle: RunHandle) -> tuple[str, ...]:
    """The handle's fork lineage (nearest source first; empty for a run that is not a fork)."""
    return handle.plan.fork_lineage if handle.plan is not None else ()


def note_stopped(r: Any, keys: DemoKeys, instance: str, exc: RunStoppedError) -> None:
    """Record that this instance's code met an operator's request on a run (``keys.stopped``; Redis outages waited
    out as the queue's calls are)."""
    record = {"run_id": exc.run_id, "action": exc.action, "instance": instance, "request_id": exc.request_id,
              "requested_by": exc.requested_by, "error": type(exc).__name__}
    _redis_waits(r.hset)(keys.stopped, f"{exc.run_id}|{exc.request_id}", json.dumps(record))
    log.warning("run stopped by an operator: left", extra={"run_id": exc.run_id, "action": exc.action})


def tool_for(step: Step, handle: RunHandle, provider_url: str) -> Any:
    """The tool of a script step: the provider (side effects, reconcile by key) or its recorded answer (read-only)."""
    if step.side_effect:
        return ProviderTool(name=step.tool, base_url=provider_url, run_id=handle.run_id, epoch=handle.epoch,
                            result=step.result)
    return RecordedTool(name=step.tool, result=step.result)


class TurnContexts:
    """Builds each model turn's context and keeps the evidence of it in Redis (see the module docstring)."""

    def __init__(self, manager: ContextManager, r: Any, keys: DemoKeys) -> None:
        self.manager, self.r, self.keys = manager, r, keys

    def build(self, run_id: str, query: str) -> Context | None:
        """The context of one turn of ``run_id`` for ``query``; counted and kept as the run's latest. None while
        Redis (the facts' store) is away: the turn goes on from the script, the run's facts are unchanged."""
        try:
            return self._build(run_id, query)
        except redis.RedisError as exc:
            log.warning("no context for this turn: Redis unavailable (%s)", exc)
            return None

    def _build(self, run_id: str, query: str) -> Context:
        ctx = self.manager.build_context(run_id, query)
        pipe = self.r.pipeline(transaction=False)
        pipe.hincrby(self.keys.contexts, "built", 1)
        pipe.hincrby(self.keys.contexts, "with_memory", int(bool(ctx.memory)))
        pipe.hincrby(self.keys.contexts, "with_knowledge", int(bool(ctx.knowledge)))
        pipe.hincrby(self.keys.contexts, "advice_unavailable", int(any("unavailable" in n for n in ctx.notes)))
        pipe.hincrby(self.keys.contexts, "facts_pending", int(not ctx.facts.known))
        pipe.hset(self.keys.context, run_id, json.dumps(ctx.as_dict()))
        pipe.execute()
        return ctx


def execute(handle: RunHandle, script: RunScript, *, provider_url: str, inbox: ApprovalInbox,
            approval_timeout_s: float = 120.0, contexts: TurnContexts | None = None, pace_s: float = 0.0) -> None:
    """Run ``script`` on ``handle`` to its recorded outcome (each step one node ``step<i>``); with ``contexts``,
    each model turn (assistant message, tool call) first builds its context for the user's latest message; each
    step first takes ``pace_s`` seconds (a model's pace; default 0).

    Raises:
        RunStoppedError: an operator paused or cancelled the run (or it waits): leave it.
        ProducerFencedError: this instance was fenced (a zombie); the run is someone else's now.
        OutcomeUnknownError: a call's outcome is unknown and its tool cannot reconcile.
    """
    asked = script.instruction
    spend = model_turns(script)
    for i, step in enumerate(script.steps):
        if pace_s:
            time.sleep(pace_s)
        if step.kind == "message" and step.role == "user":
            asked = step.content or asked
        elif contexts is not None:
            contexts.build(handle.run_id, asked)
        with handle.node(f"step{i}") as path:
            charge_turn(handle, script, i, spend)  # a model turn's spend, reserved and settled (demo/spend.py)
            if step.kind == "message":
                handle.message(step.role, step.content, user_id=script.user_id if step.role == "user" else None)
                continue
            if step.needs_approval and not await_approval(handle, inbox, path, f"{step.tool} needs a human",
                                                          tool=step.tool, args=step.args,
                                                          timeout_s=approval_timeout_s):
                handle.message("assistant", f"{step.tool} was not approved")
                continue
            try:  # keyed by the step (as the graph agent's tool call ids are): the two agents resume each other's runs
                handle.call(tool_for(step, handle, provider_url), step.args, step=f"step{i}")
            except OutcomeUnknownError:
                log.error("unknown outcome without reconcile", extra={"run_id": handle.run_id, "step": i})
                raise
    if script.succeeded:
        handle.succeed({"reward": 1.0})
    else:
        handle.fail("recorded outcome: reward 0.0")


def skew_wall_clock(seconds: int) -> None:
    """Make this process's wall clock (``time.time`` / ``time.time_ns``: every wall time the journal writes —
    ``occurred_at``, a lease's ``started_at_ms`` — is read from them) run ``seconds`` off; the monotonic clock is
    untouched. The campaign's ``skew`` fault: no safety decision may compare this clock with another host's
    (docs/design/decisions/0042-effect-windows.md). libfaketime would skew the C library too, but librdkafka's timed
    waits then never end."""
    wall, wall_ns = time.time, time.time_ns
    time.time = lambda: wall() + seconds  # type: ignore[assignment]
    time.time_ns = lambda: wall_ns() + seconds * 1_000_000_000  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> None:
    """Agent-instance process entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--producer-id", required=True)
    ap.add_argument("--workload", required=True, type=Path)
    ap.add_argument("--provider", required=True)
    ap.add_argument("--lease-ttl-ms", type=int, default=3000)
    ap.add_argument("--advice", choices=("on", "off"), default="on",
                    help="memory and knowledge in each turn's context (off: execution facts only)")
    ap.add_argument("--acks", type=Path, default=None, help="append the broker's acknowledgements here")
    ap.add_argument("--continue-run", default=None, metavar="RUN_ID",
                    help="an operator: continue this FAILED run (continue_run), re-execute it, exit")
    ap.add_argument("--graph", action="store_true",
                    help="run each script as a LangGraph agent whose model turns ask for parallel tool calls")
    ap.add_argument("--commit-timeout-s", type=float, default=30.0,
                    help="the Journal's commit_transaction timeout (s); the broker_stall fault's agent uses 2")
    ap.add_argument("--bait", action="store_true",
                    help="take a run held for the recovery fault (DemoKeys.bait) before the queue's")
    ap.add_argument("--clock-skew-s", type=int, default=0,
                    help="run this process's wall clock SECONDS off (the campaign's skew fault; monotonic untouched)")
    args = ap.parse_args(argv)
    if args.clock_skew_s:
        skew_wall_clock(args.clock_skew_s)
    settings = Settings.load()
    setup_logging("WARNING", level=settings.log_level)  # JSON lines, librdkafka's too (runjournal.kafka)
    scripts = load_scripts(args.workload)
    r = redis_client.client(settings)
    keys = DemoKeys(settings.topic_prefix)
    inbox = ApprovalInbox(r, settings.topic_prefix)
    advice = args.advice == "on"
    contexts = TurnContexts(ContextManager.open(settings, memory=advice, knowledge=advice), r, keys)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    acks = AckLog(args.acks) if args.acks else None
    if args.continue_run:
        _operate(settings, args, scripts[args.continue_run], inbox, acks)
        return
    with Journal(settings, producer_id=args.producer_id, lease_ttl_ms=args.lease_ttl_ms, on_acked=acks,
                 commit_timeout_s=args.commit_timeout_s) as journal:
        claimed = keys.claimed(journal.producer_id)  # per incarnation: a restart under the same name is another
        runs = None
        if args.graph:
            from runjournal.adapters.langgraph import JournalRuns
            from runjournal.demo.graph import execute_graph

            runs = JournalRuns(journal)
        # a bait agent takes its held run first, before any assignment (it dies before the run's first side effect)
        held = _redis_waits(r.lmove)(keys.bait, claimed, "LEFT", "RIGHT") if args.bait else None
        while not stop["now"]:
            run_id = None if held else _redis_waits(journal.claim_assignment)(timeout_s=0)
            if run_id:
                handle = journal.resume(run_id)
            else:
                raw, held = held or _redis_waits(r.lmove)(keys.queue, claimed, "LEFT", "RIGHT"), None
                if raw is None:
                    if _redis_waits(r.exists)(keys.done):
                        break
                    time.sleep(0.1)
                    continue
                script = scripts[raw.decode()]
                try:
                    handle = journal.start_run(script.tenant_id, script.agent, {"instruction": script.instruction},
                                               run_id=script.run_id, user_id=script.user_id)
                except RunExistsError:  # queued twice (two recovery services requeued it): someone has it
                    log.warning("run already started elsewhere", extra={"run_id": script.run_id})
                    _redis_waits(r.lrem)(claimed, 0, script.run_id)
                    continue
            script = script_for(scripts, handle.run_id, lineage_of(handle))
            pace = PACE_S if _redis_waits(r.sismember)(keys.paced, handle.run_id) else 0.0
            try:
                if runs is not None:
                    execute_graph(runs, handle, script, provider_url=args.provider, inbox=inbox, pace_s=pace)
                else:
                    execute(handle, script, provider_url=args.provider, inbox=inbox, contexts=contexts, pace_s=pace)
            except RunStoppedError as exc:  # paused, cancelled, released: leave the run, go on with other work
                note_stopped(r, keys, journal.producer_id, exc)
            _redis_waits(r.lrem)(claimed, 0, handle.run_id)


def _operate(settings: Settings, args: argparse.Namespace, script: RunScript, inbox: ApprovalInbox,
             acks: Any) -> None:
    """An operator continues a FAILED run and re-executes it: recorded calls return their recorded results,
    nothing runs twice, and it ends as recorded. Another operator continuing it at the same time is refused."""
    from runjournal.consumers.recovery import RunNotContinuableError, continue_run

    with Journal(settings, producer_id=args.producer_id, lease_ttl_ms=args.lease_ttl_ms, on_acked=acks) as journal:
        try:
            handle = continue_run(journal, script.run_id)
        except RunNotContinuableError as exc:
            log.warning("operator refused", extra={"run_id": script.run_id, "action": exc.action})
            print(json.dumps({"run_id": script.run_id, "continued": False, "action": exc.action}))
            return
        execute(handle, script, provider_url=args.provider, inbox=inbox)
        print(json.dumps({"run_id": script.run_id, "continued": True, "epoch": handle.epoch}))


if __name__ == "__main__":
    main()

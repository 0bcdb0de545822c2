"""Never re-run, never lose an effect: a stateful property test on the real broker and Redis.

A hypothesis state machine drives an agent through random call sequences on several runs, injecting a
failure at every boundary of a side-effecting call:

* before the intent — the INTENDED publish is refused, or the local queue is full;
* at the intent's commit — the commit times out (ambiguous), the ack is lost after the commit happened (the
  handle breaks), or the instance dies before it;
* after the intent — the instance dies;
* inside the tool — a definite failure before the effect; a timeout, an "outcome unknown" or the
  instance dying after the effect;
* after the tool — the instance dies; the result cannot be recorded;
* at the outcome publish — refused (once, or more times than the handle's retries), queue full, the
  ack lost after the commit happened;
* at the outcome's commit — a timeout (ambiguous), an abortable error;
* after the outcome — the instance dies;

in both outcome modes (``group``: the outcome rides the next commit, which the outcome's commit faults then hit;
``strict``),

and between steps kills the instance, continues a failed run. The caller retries naturally (calls
again); a killed instance is recovered by the real recovery job onto the next incarnation of the same
producer_id, and the runs' code is re-executed there. A handle that broke without a fence (an event's fate
unknown) is not a reason to restart: the live instance surrenders the run (``Journal.surrender``), a recovery
pass resumes it onto the same instance, unfenced, and its code is re-executed there — what a user is told to do.
A "kill" is in-process: the instance stops at the failpoint (a BaseException), its threads stop, its producer is
dropped with its transaction open and its lease key expires; the recovery job then fences it at the broker. (Real
SIGKILL / SIGSTOP crash tests: tests/consumers/recovery/test_recovery.py, tests/producers/test_leases.py.)

The witness is the provider's ledger (Redis, written only by the tool). At the end, every run having
ended, for every logical call: at most one idempotency key reached the provider, each executed key ran
exactly once, and each is COMMITTED (or reconciled as committed) or OUTCOME_UNKNOWN in the journal —
never absent, never INTENDED; no run is parked; nothing the journal calls committed is missing from
the ledger.

Budget: ``RJ_STATEFUL_EXAMPLES`` examples (default 8, ~40 s on 2 shared cores) of at most 12 steps; a longer run:
``RJ_STATEFUL_EXAMPLES=200 pytest -m stateful --timeout=0 tests/faults/test_never_twice_stateful.py``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from confluent_kafka import KafkaError, KafkaException
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from runjournal.consumers.recovery import continue_run
from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core import failpoints
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.deploy.topics import create_topics
from runjournal.model.reducer import CallStatus, ReconciledOutcome, RunState, fold
from runjournal.producers import (
    DeliveryError,
    Journal,
    JournalError,
    ProducerFencedError,
    QueueFullError,
    RunHandle,
    TransactionAbortedError,
)
from runjournal.schemas import Event, EventType
from tests.support.ledger import Ledger, LedgerTool
from tests.support.readback import read_committed

pytestmark = [pytest.mark.integration, pytest.mark.stateful, pytest.mark.slow]

EXAMPLES = int(os.environ.get("RJ_STATEFUL_EXAMPLES", "8"))
MAX_ATTEMPTS = 4
MAX_CRASHES = 2

CRASHES = {"crash_before_intent_commit": "producers.call.before_intent_commit",
           "crash_after_intent": "producers.call.after_intent",
           "crash_after_tool": "producers.call.after_tool",
           "crash_after_outcome": "producers.call.after_outcome"}
PUBLISH_FAULTS = {
    "intent_refused": (EventType.TOOL_CALL_INTENDED, ["refuse"]),
    "intent_queue_full": (EventType.TOOL_CALL_INTENDED, ["queue_full"]),
    "intent_commit_timeout": (EventType.TOOL_CALL_INTENDED, ["commit_timeout"]),
    "intent_ack_lost": (EventType.TOOL_CALL_INTENDED, ["ack_lost"]),  # the handle breaks: the run is surrendered
    "outcome_refused_once": (EventType.TOOL_CALL_COMMITTED, ["refuse"]),
    "outcome_refused_past_retries": (EventType.TOOL_CALL_COMMITTED, ["refuse"] * 7),
    "outcome_queue_full": (EventType.TOOL_CALL_COMMITTED, ["queue_full"] * 2),
    "outcome_ack_lost": (EventType.TOOL_CALL_COMMITTED, ["ack_lost"]),
    "outcome_commit_timeout": (EventType.TOOL_CALL_COMMITTED, ["commit_timeout"]),
    "outcome_commit_abortable": (EventType.TOOL_CALL_COMMITTED, ["commit_abortable"]),
    "failure_refused_once": (EventType.TOOL_CALL_FAILED, ["refuse"]),
}
TOOL_FAULTS = ["tool_fails", "tool_times_out_after_effect", "tool_unknown_after_effect",
               "crash_in_tool_after_effect", "unrecordable_result"]
FAULTS = ["none", "none", *CRASHES, *PUBLISH_FAULTS, *TOOL_FAULTS]
CALMER = [f for f in FAULTS if not f.startswith("crash") and f != "intent_commit_timeout"]


class Crash(BaseException):
    """The instance dies here (an in-process SIGKILL: nothing after it runs)."""


class _Broken(Exception):
    """The handle refuses writes for good (fenced / a lost event): the instance must restart."""


class _GaveUp(Exception):
    """The caller stops retrying a step and fails the run."""


class Unavailable(RuntimeError):
    """A definite failure before the effect (the provider refused the request)."""

    retryable = True


@dataclass
class Injector:
    """Faults armed for the current step; consumed as the real components pass through them."""

    publish: dict[EventType, list[str]] = field(default_factory=dict)
    crash_at: str | None = None
    commit_timeouts: int = 0
    commit_aborts: int = 0

    def clear(self) -> None:
        self.publish.clear()
        self.crash_at, self.commit_timeouts, self.commit_aborts = None, 0, 0

    def hit(self, name: str) -> None:
        if name == self.crash_at:
            self.crash_at = None
            raise Crash(name)


class CommitFaults:
    """The real transactional producer, whose ``commit_transaction`` fails as armed (then works again)."""

    def __init__(self, real: Any, injector: Injector) -> None:
        self._real, self._injector = real, injector

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def commit_transaction(self, *args: Any) -> Any:
        inj = self._injector
        if inj.commit_timeouts:
            inj.commit_timeouts -= 1
            self._real.flush(10)  # as a real EndTxn timeout: the records were sent, the answer did not come
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "injected: commit timed out", retriable=True))
        if inj.commit_aborts:
            inj.commit_aborts -= 1
            raise KafkaException(KafkaError(KafkaError._STATE, "injected: abortable", txn_requires_abort=True))
        return self._real.commit_transaction(*args)


def faulty_publish(journal: Journal, injector: Injector) -> None:
    """Wrap ``journal.publish`` (what every RunHandle calls) to fail as armed."""
    real = journal.publish

    def publish(event: Event, *, durable: bool, on_lost: Any = None, **how: Any) -> None:
        queued = injector.publish.get(event.type) or []
        fault = queued.pop(0) if queued else None
        if fault == "refuse":
            raise TransactionAbortedError(f"injected: {event.type} refused")
        if fault == "queue_full":
            raise QueueFullError("injected: local queue full", retry_after_s=0.01)
        txn = journal._txn  # noqa: SLF001 - fault injection into the real publisher
        if fault in ("commit_timeout", "commit_abortable") and not isinstance(txn._producer, CommitFaults):  # noqa: SLF001
            txn._producer = CommitFaults(txn._producer, injector)  # noqa: SLF001
        if fault == "commit_timeout":
            injector.commit_timeouts = 3  # every commit attempt of this publish: ambiguous
        if fault == "commit_abortable":
            injector.commit_aborts = 1
        real(event, durable=durable, on_lost=on_lost, **how)  # how: deferred (group commit), smaller
        if fault == "ack_lost":  # committed, but the answer never came back
            lost = TransactionAbortedError(f"injected: ack of {event.type} lost")
            lost.retryable, lost.ambiguous = False, True
            raise lost

    journal.publish = publish  # type: ignore[method-assign]


#: Producers of killed instances: kept (unused) until the test ends, as a dead process's would linger at the
#: broker; the recovery job fences them. Dropped at the end of the test.
GRAVEYARD: list[Any] = []


def kill(journal: Journal, r: redis.Redis) -> None:
    """The instance dies: threads stop, its open transaction is left to the broker, its lease runs out."""
    journal._stop.set()  # noqa: SLF001
    for thread in journal._threads:  # noqa: SLF001
        thread.join(5)
    with journal._txn._lock:  # noqa: SLF001
        GRAVEYARD.append(journal._txn._producer)  # noqa: SLF001
        journal._txn._producer = None  # noqa: SLF001
    journal._closed = True  # noqa: SLF001
    r.delete(journal._lease.key)  # noqa: SLF001 - its TTL ran out
    # ... and so its effect window has what it adds beyond the lease left: T, the longest tool timeout it sent under
    window = journal._lease.window_key  # noqa: SLF001
    if (longest := r.get(window)) is not None:
        r.pexpire(window, max(1, int(longest)))


@dataclass
class RunModel:
    run_id: str
    handle: RunHandle
    steps: int = 0
    status: str = "open"  # open | failed | succeeded | gone
    tools: dict[int, Any] = field(default_factory=dict)


class AgentMachine(RuleBasedStateMachine):
    settings: Settings
    mode: str = "group"
    """``Journal(outcome_commit=…)``: in ``group`` the ledger tool's outcome rides the next commit, so the outcome
    faults (commit timeout, abortable commit) hit the commit that carries it — the next intent's or the run's end."""

    def __init__(self) -> None:
        super().__init__()
        self.s = AgentMachine.settings.model_copy(update={"topic_prefix": f"sm{uuid.uuid4().hex[:10]}"})
        create_topics(self.s)
        self.r = redis.Redis.from_url(self.s.redis_url)
        self.ledger = Ledger(self.r, self.s.topic_prefix)
        self.injector = Injector()
        self.name = f"agent-{uuid.uuid4().hex[:6]}"
        self.journal = self._start()
        self.runs: dict[str, RunModel] = {}
        self.crashes = 0
        self.surrenders = 0
        self.continued = 0
        self.log: list[str] = []
        failpoints.hit = self.injector.hit  # type: ignore[assignment]  # restored by the test function

    def _start(self) -> Journal:
        journal = Journal(self.s, producer_id=self.name, lease_ttl_ms=60_000, max_txn_age_ms=60_000,
                          outcome_retries=2, outcome_commit=AgentMachine.mode)  # type: ignore[arg-type]
        faulty_publish(journal, self.injector)
        return journal

    def open_runs(self) -> list[RunModel]:
        return [m for m in self.runs.values() if m.status == "open"]

    # -- rules --------------------------------------------------------------------------------------------
    @initialize()
    def first_run(self) -> None:
        self.start_run()

    @precondition(lambda self: len(self.open_runs()) < 2 and (len(self.runs) < 4 or not self.open_runs()))
    @rule()
    def start_run(self) -> None:
        handle = self.journal.start_run("t", "stateful", {}, run_id=f"r-{uuid.uuid4().hex[:10]}")
        self.runs[handle.run_id] = RunModel(handle.run_id, handle)

    def stepping(self) -> list[RunModel]:
        return [m for m in self.open_runs() if m.steps < 4]

    @precondition(lambda self: bool(self.stepping()))
    @rule(data=st.data())
    def call_step(self, data: st.DataObject) -> None:
        run = data.draw(st.sampled_from(self.stepping()), label="run")
        fault = data.draw(st.sampled_from(FAULTS if self.crashes < MAX_CRASHES else CALMER), label="fault")
        i, run.steps = run.steps, run.steps + 1
        self.log.append(fault)
        run.tools[i] = {"unrecordable": fault == "unrecordable_result"}
        self._after_step(run, self._step(run, i, fault))

    @precondition(lambda self: any(m.steps >= 2 for m in self.open_runs()))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        run = data.draw(st.sampled_from([m for m in self.open_runs() if m.steps >= 2]), label="run")
        self._end(run)

    @precondition(lambda self: self.crashes < MAX_CRASHES and any(m.steps for m in self.open_runs()))
    @rule()
    def kill_between_steps(self) -> None:
        self._crash_and_recover()

    @precondition(lambda self: self.continued < 1 and any(m.status == "failed" for m in self.runs.values()))
    @rule(data=st.data())
    def continue_failed(self, data: st.DataObject) -> None:
        run = data.draw(st.sampled_from([m for m in self.runs.values() if m.status == "failed"]), label="failed")
        self.continued += 1
        run.handle, run.status = continue_run(self.journal, run.run_id, max_wait_s=5), "open"
        self._replay(run)

    # -- the agent ----------------------------------------------------------------------------------------
    def _tool(self, run: RunModel, i: int, fault: str) -> LedgerTool:
        result: Any = {1: "x"} if run.tools[i]["unrecordable"] else {"step": i}
        tool = LedgerTool(self.ledger, name="book", result=result, timeout_ms=50)
        if fault == "tool_fails":
            tool.before = _raise_unavailable
        elif fault == "tool_times_out_after_effect":
            tool.then = "timeout_after"
        elif fault == "tool_unknown_after_effect":
            tool.then = "unknown_after"
        elif fault == "crash_in_tool_after_effect":
            tool.after = _crash_in_tool
        return tool

    def _arm(self, fault: str) -> None:
        self.injector.clear()
        if fault in CRASHES:
            self.injector.crash_at = CRASHES[fault]
        if fault in PUBLISH_FAULTS:
            etype, faults = PUBLISH_FAULTS[fault]
            self.injector.publish[etype] = list(faults)

    def _step(self, run: RunModel, i: int, fault: str) -> str:
        """Execute step ``i`` of ``run`` (its node ``s{i}``), retrying naturally. Returns ok / gave_up /
        crash / broken."""
        tool = self._tool(run, i, fault)
        self._arm(fault)
        try:
            with run.handle.node(f"s{i}"):
                for _ in range(MAX_ATTEMPTS):
                    try:
                        run.handle.call(tool, {"logical": f"{run.run_id}/{i}"})
                        return "ok"
                    except ProducerFencedError as exc:
                        raise _Broken() from exc
                    except DeliveryError as exc:
                        if not exc.retryable:
                            raise _Broken() from exc
                    except Exception:  # noqa: BLE001,S112 - the caller's natural retry
                        pass
                    finally:  # the tool behaves on the next attempt (the fault was one event)
                        tool.before = tool.after = None
                        tool.then = "return"
                raise _GaveUp()
        except Crash:
            return "crash"
        except (_Broken, JournalError):
            return "broken"
        except _GaveUp:
            return "gave_up"
        finally:
            self.injector.clear()

    def _after_step(self, run: RunModel, outcome: str) -> None:
        if outcome == "broken" and self._surrendered(run):
            self._recover_surrendered(run)  # what the user is told: the next recovery pass resumes it; no restart
        elif outcome in ("crash", "broken"):
            self._crash_and_recover()
        elif outcome == "gave_up":
            try:
                run.handle.fail("gave up")
                run.status = "failed"
            except JournalError:
                self._crash_and_recover()

    def _end(self, run: RunModel) -> None:
        try:
            run.handle.succeed({"steps": run.steps})
            run.status = "succeeded"
        except JournalError:
            self._crash_and_recover()

    def _replay(self, run: RunModel) -> None:
        """A resumed (or continued) run re-executes its code from the start, without injected faults."""
        for i in range(run.steps):
            outcome = self._step(run, i, "none")
            if outcome != "ok":
                self._after_step(run, outcome)
                return

    def _surrendered(self, run: RunModel) -> bool:
        """The handle broke and the instance, still live and unfenced, handed the run to recovery
        (``Journal.surrender``) — as it must whenever it was not fenced."""
        if self.journal.lapsed or self.journal.fence_count:
            return False
        key = RedisKeys(self.s.topic_prefix).surrendered(self.journal.producer_id)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.r.hexists(key, run.run_id):
                return True
            time.sleep(0.05)
        raise AssertionError(f"run {run.run_id}: the handle broke and the live instance did not surrender it")

    def _recover_surrendered(self, run: RunModel) -> None:
        self.surrenders += 1
        job = RecoveryJob(self.s, max_wait_s=5)
        try:
            report = job.recover(stale=True)
        finally:
            job.close()
        outcome = {o.run_id: o for o in report.runs}[run.run_id]
        assert self.journal.producer_id not in report.fenced, "the live instance was fenced"
        if outcome.action == "finished":
            run.status = outcome.detail.lower() if outcome.detail else "failed"
            return
        assert outcome.action == "resumed" and outcome.assigned_to == self.journal.producer_id, outcome
        assert self.journal.claim_assignment(timeout_s=5) == run.run_id
        run.handle = self.journal.resume(run.run_id)
        self._replay(run)

    def _crash_and_recover(self) -> None:
        self.crashes += 1
        kill(self.journal, self.r)
        self.journal = self._start()  # the same producer_id: the next incarnation
        job = RecoveryJob(self.s, max_wait_s=5)
        try:
            report = job.recover(stale=True)
        finally:
            job.close()
        actions = {o.run_id: o for o in report.runs}
        resumed = []
        for run in self.open_runs():
            outcome = actions[run.run_id]
            if outcome.action == "resumed":
                assert outcome.assigned_to == self.journal.producer_id
                resumed.append(run)
            elif outcome.action == "no_facts":
                run.status = "gone"  # nothing of it was ever committed: it never happened
            else:
                assert outcome.action == "finished", outcome
                run.status = outcome.detail.lower() if outcome.detail else "failed"
        for _ in resumed:
            assert self.journal.claim_assignment(timeout_s=5) in {m.run_id for m in resumed}
        for run in resumed:
            run.handle = self.journal.resume(run.run_id)
            self._replay(run)

    # -- the check ----------------------------------------------------------------------------------------
    def teardown(self) -> None:
        try:
            for _ in range(MAX_CRASHES + 2):
                if not self.open_runs():
                    break
                for run in self.open_runs():
                    self._end(run)
            assert not self.open_runs(), "every run ends"
            self.check()
            if os.environ.get("RJ_STATEFUL_TRACE"):
                print(f"runs={[m.status for m in self.runs.values()]} crashes={self.crashes} "
                      f"surrenders={self.surrenders} "
                      f"continued={self.continued} faults={self.log} executed={len(self.ledger.executed_keys())}")
        finally:
            try:
                self.journal.close()
            except JournalError:
                pass
            GRAVEYARD.clear()  # the recovery job has fenced them

    def check(self) -> None:
        records = [r for r in read_committed(self.s)]
        by_run: dict[str, list[tuple[Event, int, int]]] = {}
        for rec in records:
            by_run.setdefault(rec.event.run_id, []).append((rec.event, rec.partition, rec.offset))
        states: dict[str, RunState] = {k: s for k, v in by_run.items() if (s := fold(v)) is not None}
        for run_id, state in states.items():
            assert not state.parked, (run_id, state.gap_reason, state.blocked_reason)
            assert state.terminal, (run_id, state.status)
            for rec in state.records.values():
                assert rec.status is not CallStatus.INTENDED, (run_id, rec)
        executed = self.ledger.executed_keys()
        for logical, keys in self.ledger.logicals().items():
            run_id = logical.rsplit("/", 1)[0]
            assert len(keys) == 1, f"{logical}: one logical call reached the provider under keys {keys}"
            (key,) = keys
            assert executed[key] == 1, f"{logical}: the effect ran {executed[key]} times"
            assert run_id in states, f"{logical}: executed, but the journal has no run {run_id}"
            rec = states[run_id].records.get(key)
            assert rec is not None, f"{logical}: executed, but absent from the journal"
            settled = rec.status in (CallStatus.COMMITTED, CallStatus.OUTCOME_UNKNOWN) or (
                rec.status is CallStatus.RECONCILED and rec.reconciled_outcome is ReconciledOutcome.COMMITTED)
            assert settled, f"{logical}: executed, but the journal says {rec.status} {rec.reconciled_outcome}"
        for run_id, state in states.items():
            for rec in state.records.values():
                if rec.effect_committed:
                    assert rec.call_id in executed, f"{run_id}: {rec.call_id} committed but never executed"


def _raise_unavailable() -> None:
    raise Unavailable("provider refused")


def _crash_in_tool() -> None:
    raise Crash("inside the tool, after the effect")


@pytest.fixture
def machine_settings(settings: Settings) -> Iterator[Settings]:
    hit = failpoints.hit
    try:
        yield settings
    finally:
        failpoints.hit = hit  # type: ignore[assignment]
        GRAVEYARD.clear()  # fenced by the recovery job by now


@pytest.mark.parametrize("mode", ["group", "strict"])
def test_never_twice_never_lost_under_injected_failures(machine_settings: Settings, mode: str) -> None:
    AgentMachine.settings, AgentMachine.mode = machine_settings, mode
    run_state_machine_as_test(
        AgentMachine,
        settings=settings(max_examples=EXAMPLES, stateful_step_count=12, deadline=None,
                          suppress_health_check=list(HealthCheck)),
    )

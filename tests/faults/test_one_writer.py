"""One writer per run, under concurrency (issue 27): each numbered case of the issue, on the real broker and Redis.

1. Two recovery actors take one run at once (a slow coordinator under one of them): exactly one RUN_RESUMED per
   epoch, the other actor gets a named refusal, nothing runs twice.
2. Parallel tool calls on one run handle (LangGraph's ToolNode runs a model turn's calls on a thread pool): one
   seq per event, the run never parks.
3. An asyncio task cancelled twice during a durable call: CancelledError, the next call waits for the first
   step, the retry keeps the key.
4. ``continue_run`` SIGKILLed right after its RUN_RESUMED committed: a later sweep still finds and resumes the run.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis

from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core.settings import Settings
from runjournal.model.reducer import RunStatus, fold
from runjournal.producers import Journal, OutcomeUnknownError
from runjournal.producers.aio import AsyncJournal
from runjournal.producers.tools import Outcome
from runjournal.schemas import EventType
from tests.support.ledger import Ledger, LedgerTool
from tests.support.readback import events_of, read_committed

pytestmark = pytest.mark.integration


@pytest.fixture
def ledger(topics: Settings) -> Ledger:
    return Ledger(redis.Redis.from_url(topics.redis_url), topics.topic_prefix)


def _failed_run(topics: Settings, ledger: Ledger) -> str:
    """A run that booked once, then failed on a payment: ready to be continued."""
    book = LedgerTool(ledger, name="book", result={"booking": "B1"})
    with Journal(topics, producer_id=f"first-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("t", "travel", {}, run_id=f"r-{uuid.uuid4().hex[:8]}")
        with run.node("book"):
            run.call(book, {"logical": "book"})
        run.fail("payment provider down")
    return run.run_id


def _resumed(topics: Settings, run_id: str) -> list[Any]:
    return [e for e in events_of(read_committed(topics), run_id) if e.type is EventType.RUN_RESUMED]


# -- case 1 ---------------------------------------------------------------------------------------------------
def test_two_recovery_actors_racing_on_one_run_resume_it_once(topics: Settings, ledger: Ledger,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Actor B starts first, but its coordinator is slow (init_transactions takes 1.5 s); actor A starts 150 ms
    later and commits first. B must not publish a second RUN_RESUMED at the same epoch: fence, then read, then
    publish — B's read comes after its own fence, so it sees A's RUN_RESUMED (or B's fence aborts A)."""

    run_id = _failed_run(topics, ledger)
    reports: dict[str, Any] = {}

    def actor(name: str, journal: Journal, delay_s: float, init_delay_s: float) -> None:
        time.sleep(delay_s)
        job = RecoveryJob(topics, max_wait_s=5)
        initialise = job.publisher._initialise

        def slow_initialise() -> None:  # a slow transaction coordinator under this actor
            time.sleep(init_delay_s)
            initialise()

        job.publisher._initialise = slow_initialise  # type: ignore[method-assign]
        try:
            reports[name] = job.recover(runs=[run_id], reopen_failed=True, assign_to=journal.producer_id)
        finally:
            job.close()

    with Journal(topics, producer_id="take-a") as ja, Journal(topics, producer_id="take-b") as jb:
        threads = [threading.Thread(target=actor, args=("b", jb, 0.0, 1.5)),
                   threading.Thread(target=actor, args=("a", ja, 0.15, 0.0))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    actions = sorted(r.runs[0].action for r in reports.values())
    assert actions.count("resumed") == 1, actions
    resumed_events = _resumed(topics, run_id)
    assert len(resumed_events) == 1, [(e.epoch, e.seq, e.payload["assigned_to"]) for e in resumed_events]
    keys = Counter(e.key for e in events_of(read_committed(topics), run_id))
    assert max(keys.values()) == 1, "two events under one key"
    loser = next(r.runs[0] for r in reports.values() if r.runs[0].action != "resumed")
    assert loser.action in {"superseded", "not_ended"}, loser


def test_continue_run_twice_at_once_gives_one_owner_and_a_named_refusal(topics: Settings, ledger: Ledger) -> None:
    """Two operators continue the same failed run at once, from two instances: one handle, one named refusal."""
    from runjournal.consumers.recovery import RunNotContinuableError, continue_run

    run_id = _failed_run(topics, ledger)
    with Journal(topics, producer_id="op-a") as ja, Journal(topics, producer_id="op-b") as jb:
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(continue_run, j, run_id) for j in (ja, jb)]
            outcomes: list[Any] = []
            for f in futures:
                try:
                    outcomes.append(f.result(60))
                except RunNotContinuableError as exc:
                    outcomes.append(exc)
    handles = [o for o in outcomes if not isinstance(o, Exception)]
    refusals = [o for o in outcomes if isinstance(o, RunNotContinuableError)]
    assert len(handles) == 1 and len(refusals) == 1, outcomes
    assert handles[0].epoch == 2 and len(_resumed(topics, run_id)) == 1


# -- case 2 ---------------------------------------------------------------------------------------------------
def test_parallel_tool_calls_on_one_handle_get_one_seq_each(topics: Settings, ledger: Ledger) -> None:
    """Eight threads call tools on one handle at once (as ToolNode does with a model turn's tool calls): every event
    has its own seq, in publish order, the run folds to SUCCEEDED, every effect ran once under its own key."""
    tool = LedgerTool(ledger, name="send_email", result={"sent": True}, timeout_ms=200)
    with Journal(topics, producer_id=f"p-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("t", "mailer", {})
        with run.node("turn"):
            with ThreadPoolExecutor(8) as pool:
                results = list(pool.map(lambda i: run.call(tool, {"logical": f"m{i}"}, step=f"call-{i}"), range(8)))
        run.succeed(len(results))
    events = events_of(read_committed(topics), run.run_id)
    seqs = [e.seq for e in events]
    assert seqs == list(range(1, len(events) + 1)), seqs
    assert [e.type for e in events].count(EventType.TOOL_CALL_INTENDED) == 8
    assert [e.type for e in events].count(EventType.TOOL_CALL_COMMITTED) == 8
    state = fold((e, 0, i) for i, e in enumerate(events))
    assert state is not None and state.status is RunStatus.SUCCEEDED
    assert ledger.executions() == 8 and all(n == 1 for n in ledger.executed_keys().values())


def test_the_journal_refuses_a_seq_twice_before_anything_is_sent(topics: Settings) -> None:
    """Two handles of one run in one instance (a second writer the code did not mean to have) — the journal refuses
    the second event at a seq already published, with a named error, and the topic holds one event per seq."""
    from runjournal.producers.errors import DuplicateSeqError
    from runjournal.producers.handle import RunHandle

    with Journal(topics, producer_id=f"p-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("t", "a", {})
        twin = RunHandle(journal, run_id=run.run_id, tenant_id="t", agent="a", epoch=1, next_seq=2)
        run.message("user", "first")
        with pytest.raises(DuplicateSeqError, match="seq 2"):
            twin.message("user", "second")
        run.succeed()
    events = events_of(read_committed(topics), run.run_id)
    assert [e.seq for e in events] == [1, 2, 3]


# -- case 3 ---------------------------------------------------------------------------------------------------
def test_a_task_cancelled_twice_during_a_durable_call_raises_cancelled_and_keeps_the_key(
        topics: Settings, ledger: Ledger) -> None:
    """The intent's publish is slow (0.6 s); the awaiting task is cancelled twice while it runs in a producer
    thread. The caller gets CancelledError (not "generator already executing"); a call started meanwhile waits
    for the first step; the retry of the cancelled call has the same key and is reconciled, never re-run blind."""
    tool = LedgerTool(ledger, name="pay", result={"paid": 1}, timeout_ms=100)

    class Reconciling:
        name, side_effect, timeout_ms = "pay", True, 100

        def __call__(self, args: dict[str, Any], key: str) -> Any:
            return tool(args, key)

        def reconcile(self, key: str) -> Outcome:
            return Outcome(executed=ledger.executions(key) > 0, result={"paid": 1})

    async def scenario() -> tuple[list[str], list[int]]:
        journal = await AsyncJournal.open(topics, producer_id=f"aio-{uuid.uuid4().hex[:6]}")
        try:
            run = await journal.start_run("t", "payer", {})
            sync_publish = journal.sync.publish

            def slow_publish(event: Any, **kw: Any) -> None:
                if event.type is EventType.TOOL_CALL_INTENDED and event.seq == 2:
                    time.sleep(0.6)
                sync_publish(event, **kw)

            journal.sync.publish = slow_publish  # type: ignore[method-assign]
            task = asyncio.create_task(run.call(Reconciling(), {"logical": "pay"}))
            await asyncio.sleep(0.15)
            task.cancel()
            await asyncio.sleep(0.05)
            task.cancel()
            other = asyncio.create_task(run.message("user", "meanwhile"))
            with pytest.raises(asyncio.CancelledError):
                await task
            await other
            value = await run.call(Reconciling(), {"logical": "pay"})
            assert value == {"paid": 1}
            await run.succeed()
            return [e.type.value for e in events_of(read_committed(topics), run.run_id)], \
                [e.seq for e in events_of(read_committed(topics), run.run_id)]
        finally:
            await journal.close()

    types, seqs = asyncio.run(scenario())
    assert seqs == list(range(1, len(seqs) + 1)), (types, seqs)
    assert types.count("TOOL_CALL_INTENDED") >= 1 and ledger.executions() == 1
    assert len(ledger.keys_of("pay")) == 1, "the retry kept the cancelled call's key"


def test_a_cancelled_call_with_no_way_to_reconcile_stays_unknown_not_new(topics: Settings, ledger: Ledger) -> None:
    """Cancelled while its tool runs on the loop: the call stays intended; calling again raises OutcomeUnknownError
    (no reconcile) rather than running the tool under a new key."""
    async def scenario() -> None:
        gate = asyncio.Event()

        class Slow:
            name, side_effect, timeout_ms = "mail", True, 50

            async def acall(self, args: dict[str, Any], key: str) -> Any:
                gate.set()
                await asyncio.sleep(5)

            def __call__(self, args: dict[str, Any], key: str) -> Any:  # pragma: no cover - acall is used
                raise AssertionError

        journal = await AsyncJournal.open(topics, producer_id=f"aio-{uuid.uuid4().hex[:6]}")
        try:
            run = await journal.start_run("t", "mailer", {})
            task = asyncio.create_task(run.call(Slow(), {"x": 1}))
            await gate.wait()
            task.cancel()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            with pytest.raises(OutcomeUnknownError):
                await run.call(Slow(), {"x": 1})
        finally:
            await journal.close()

    asyncio.run(scenario())


# -- case 4 ---------------------------------------------------------------------------------------------------
_CONTINUE_CHILD = textwrap.dedent("""
    import sys
    from runjournal import Journal, Settings, continue_run
    with Journal(Settings.load(), producer_id="continuer", lease_ttl_ms=1500) as journal:
        continue_run(journal, sys.argv[1])
    """)


@pytest.fixture
def continuer_env(topics: Settings, service_env: dict[str, str]) -> Iterator[dict[str, str]]:
    yield {**service_env, "RJ_FAILPOINTS": "recovery.after_commit=1", "PYTHONPATH": str(Path.cwd())}


@pytest.mark.parametrize("sets", ["kept", "lost"])
def test_continue_run_killed_after_its_commit_is_found_by_the_next_sweep(topics: Settings, ledger: Ledger,
                                                                         continuer_env: dict[str, str],
                                                                         sets: str) -> None:
    """SIGKILL right after RUN_RESUMED committed (before any hand-over write): the run is RUNNING in the journal
    with a dead owner and in nobody's assignment list. The backlog counts it, and the next sweep hands it to a
    live instance — found through the dead owner's incoming set, or (``lost``: Redis lost every set naming it) from
    the projection, which the projector rebuilds from the topic."""
    from runjournal.consumers.recovery.metrics import recovery_backlog
    from runjournal.core import redis_client
    from tests.support.provider import project

    run_id = _failed_run(topics, ledger)
    child = subprocess.run([sys.executable, "-c", _CONTINUE_CHILD, run_id], env=continuer_env, timeout=60,
                           capture_output=True, text=True, check=False)
    assert child.returncode == -9, child.stderr[-2000:]
    assert len(_resumed(topics, run_id)) == 1
    project(topics)
    time.sleep(2.0)  # the child's lease (1.5 s) expires
    client = redis_client.client(topics)
    if sets == "lost":
        from runjournal.core.redis_keys import RedisKeys

        keys = RedisKeys(topics.topic_prefix)
        assert client.delete(keys.incoming("continuer"), keys.owned("continuer")) >= 1
    backlog = recovery_backlog(client, topics.topic_prefix, topics.partitions)
    assert backlog.runs >= 1, backlog
    with Journal(topics, producer_id="survivor") as survivor:
        job = RecoveryJob(topics, max_wait_s=5)
        try:
            report = job.recover(stale=True)
        finally:
            job.close()
        outcome = {o.run_id: o for o in report.runs}[run_id]
        assert outcome.action == "resumed" and outcome.assigned_to == survivor.producer_id, outcome
        handle = survivor.resume(run_id)
        assert handle.epoch == 3
        handle.succeed()


def test_a_task_cancelled_while_its_call_records_the_outcome_gets_the_recorded_value_on_retry(
        topics: Settings, ledger: Ledger) -> None:
    """Cancelled while the step that records the outcome runs: the call completed but its value never reached the
    caller. The retry is the same call — same key, the recorded value, the tool not run again (a new key here was
    seen in the fault campaign: the handle thought the value delivered)."""
    tool = LedgerTool(ledger, name="book", result={"booked": 1}, timeout_ms=100)

    async def scenario() -> tuple[Any, list[Any]]:
        journal = await AsyncJournal.open(topics, producer_id=f"aio-{uuid.uuid4().hex[:6]}", outcome_commit="strict")
        try:
            run = await journal.start_run("t", "booker", {})
            sync_publish = journal.sync.publish

            def slow_outcome(event: Any, **kw: Any) -> None:
                sync_publish(event, **kw)
                if event.type is EventType.TOOL_CALL_COMMITTED:
                    time.sleep(0.5)  # the outcome is durable; the step has not returned yet

            journal.sync.publish = slow_outcome  # type: ignore[method-assign]
            task = asyncio.create_task(run.call(tool, {"logical": "book"}))
            while not ledger.executions():
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            value = await run.call(tool, {"logical": "book"})
            await run.succeed()
            return value, events_of(read_committed(topics), run.run_id)
        finally:
            await journal.close()

    value, events = asyncio.run(scenario())
    assert value == {"booked": 1}
    assert ledger.executions() == 1 and len(ledger.keys_of("book")) == 1
    assert [e.type for e in events].count(EventType.TOOL_CALL_INTENDED) == 1


def test_cancellations_at_any_moment_of_fast_calls_never_give_a_retry_a_new_key(topics: Settings,
                                                                                 ledger: Ledger) -> None:
    """The campaign's ``cancels`` kind in miniature: 40 calls (read-only and side-effecting), each task cancelled
    twice after 0-3 ms — before its intent, inside the tool, while its outcome is recorded, or after it returned —
    then called again. Every logical call ends with exactly one key in the journal and one execution."""
    import random

    rng = random.Random(7)
    effect = LedgerTool(ledger, name="book", result={"ok": 1}, timeout_ms=50)

    class Lookup:
        name, side_effect, timeout_ms = "lookup", False, 50

        def __call__(self, args: dict[str, Any], key: str) -> Any:
            return {"found": args["logical"]}

    async def scenario() -> list[Any]:
        journal = await AsyncJournal.open(topics, producer_id=f"aio-{uuid.uuid4().hex[:6]}", producer_threads=4)
        try:
            run = await journal.start_run("t", "canceller", {})
            for i in range(40):
                tool = effect if i % 2 else Lookup()
                args = {"logical": f"c{i}"}
                task = asyncio.ensure_future(run.call(tool, args))
                await asyncio.sleep(rng.uniform(0, 0.003))
                task.cancel()
                await asyncio.sleep(0.001)
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    await run.call(tool, args)  # the same call again
                except OutcomeUnknownError:  # pragma: no cover - every tool here can be settled
                    raise
            await run.succeed()
            return events_of(read_committed(topics), run.run_id)
        finally:
            await journal.close()

    events = asyncio.run(scenario())
    keys_per_call = Counter(e.payload["tool"] + ":" + e.payload["call_id"] for e in events
                            if e.type is EventType.TOOL_CALL_INTENDED)
    intents_by_index: dict[str, set[str]] = {}
    for e in events:
        if e.type is EventType.TOOL_CALL_INTENDED:
            intents_by_index.setdefault(e.payload["args_digest"], set()).add(e.payload["call_id"])
    assert all(len(ids) == 1 for ids in intents_by_index.values()), "a retry got a new key: " + str(
        [(e.seq, e.type.value, e.payload.get("call_id", "")[:6]) for e in events])
    assert len(intents_by_index) == 40 and len(keys_per_call) == 40
    assert all(n == 1 for n in ledger.executed_keys().values()) and len(ledger.executed_keys()) == 20

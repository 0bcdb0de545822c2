"""A handle that must stop hands its run to recovery, visibly, and the instance goes on (issue 28, deferred =
immediate): ``Journal.surrender`` (docs/design/protocol.md § Surrender).

Before: a handle whose event's fate was unknown (an acknowledgement lost after the commit, a deferred outcome whose
commit failed twice) refused every write, and its run stayed in the live instance's owned set — nobody recovered
it until the instance stopped (the stateful machine restarted its instance to get past it). Now the run moves to
the instance's surrendered hash once every request of the handle has returned, and the next ``recover --stale``
pass resumes it under a new epoch without fencing the instance.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis

from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.model.reducer import CallStatus, RunStatus, fold
from runjournal.producers import DeliveryError, Journal, TransactionAbortedError
from runjournal.schemas import Event, EventType
from tests.support.ledger import Ledger, LedgerTool
from tests.support.provider import wait_lease_gone
from tests.support.readback import read_committed

pytestmark = pytest.mark.integration


def _lose_ack_of(journal: Journal, etype: EventType, times: int = 1) -> None:
    """The next ``times`` events of ``etype`` are committed, but their acknowledgement is lost (non-retryable,
    ambiguous): the handle cannot know whether the seq was used, so it must stop."""
    real = journal.publish
    left = {"n": times}

    def publish(event: Event, *, durable: bool, on_lost: Any = None, **how: Any) -> None:
        real(event, durable=durable, on_lost=on_lost, **how)
        if event.type is etype and left["n"]:
            left["n"] -= 1
            journal.flush()  # committed at the broker: only the answer is lost
            lost = TransactionAbortedError(f"injected: the ack of {etype} was lost")
            lost.retryable, lost.ambiguous = False, True
            raise lost

    journal.publish = publish  # type: ignore[method-assign]


def _eventually(check: Callable[[], bool], timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def _recover(settings: Settings) -> Any:
    job = RecoveryJob(settings, max_wait_s=5)
    try:
        return job.recover(stale=True)
    finally:
        job.close()


def _outcome(report: Any, run_id: str) -> Any:
    (found,) = [o for o in report.runs if o.run_id == run_id]
    return found


def _state(settings: Settings, run_id: str) -> Any:
    return fold([(rec.event, rec.partition, rec.offset) for rec in read_committed(settings)
                 if rec.event.run_id == run_id])


def test_a_broken_handle_hands_its_run_over_and_its_instance_goes_on(topics: Settings) -> None:
    r = redis.Redis.from_url(topics.redis_url)
    keys = RedisKeys(topics.topic_prefix)
    ledger = Ledger(r, f"sur{uuid.uuid4().hex[:8]}")
    tool = LedgerTool(ledger, name="book", result={"booked": 1})
    run_id = f"sur-{uuid.uuid4().hex[:8]}"
    with Journal(topics, producer_id=f"surrender-{uuid.uuid4().hex[:6]}", outcome_commit="strict") as journal:
        surrendered = keys.surrendered(journal.producer_id)
        run = journal.start_run("t", "agent", {}, run_id=run_id)
        _lose_ack_of(journal, EventType.TOOL_CALL_INTENDED)
        with pytest.raises(DeliveryError) as lost:
            run.call(tool, {"logical": "a"})
        assert not lost.value.retryable
        with pytest.raises(DeliveryError, match="surrendered"):  # the handle says what happened to its run
            run.message("assistant", "after the loss")
        assert _eventually(lambda: r.hexists(surrendered, run_id)), "the run was never handed to recovery"
        assert int(r.hget(surrendered, run_id) or 0) == 1  # the epoch given up
        assert not r.sismember(keys.owned(journal.producer_id), run_id)
        assert journal.stats["surrendered"] == 1

        report = _recover(topics)
        outcome = _outcome(report, run_id)
        assert (outcome.action, outcome.assigned_to, outcome.epoch) == ("resumed", journal.producer_id, 2), outcome
        assert "surrendered by" in (outcome.detail or "")
        assert journal.producer_id not in report.fenced, "a live instance that gave a run up is not fenced"
        assert not r.hexists(surrendered, run_id), "the entry is cleared once the run is resumed"

        other = journal.start_run("t", "agent", {}, run_id=f"{run_id}-other")  # the instance goes on
        other.call(tool, {"logical": "b"})
        other.succeed({})
        assert journal.claim_assignment(timeout_s=5) == run_id
        again = journal.resume(run_id)
        assert again.epoch == 2
        assert again.call(tool, {"logical": "a"}) == {"booked": 1}  # reconciled (not executed), then run once
        again.succeed({})
        journal.flush()
        assert all(o.run_id != run_id for o in _recover(topics).runs), "nothing is left for a later pass"
    assert ledger.executions() == 2 and len(tool.seen) == 2  # a once, b once
    state = _state(topics, run_id)
    assert state.status is RunStatus.SUCCEEDED and not state.parked
    (record,) = state.records.values()
    assert record.status is CallStatus.COMMITTED


def test_surrender_waits_for_a_request_another_thread_has_in_flight(topics: Settings) -> None:
    """Two threads on one handle (LangGraph's parallel tool calls): one tool is still running when the other's
    intent's acknowledgement is lost. The run is handed over only after that request returned — so recovery need not
    wait for a live instance's effect window — and the call it made is reconciled from the provider, never run
    again."""
    r = redis.Redis.from_url(topics.redis_url)
    keys = RedisKeys(topics.topic_prefix)
    ledger = Ledger(r, f"sur{uuid.uuid4().hex[:8]}")
    release, started = threading.Event(), threading.Event()

    def slow_request() -> None:
        started.set()
        assert release.wait(30)

    slow = LedgerTool(ledger, name="pay", result={"paid": 1}, timeout_ms=50, after=slow_request)
    fast = LedgerTool(ledger, name="book", result={"booked": 1})
    run_id = f"sur-{uuid.uuid4().hex[:8]}"
    errors: list[BaseException] = []
    with Journal(topics, producer_id=f"surrender-{uuid.uuid4().hex[:6]}", outcome_commit="strict") as journal:
        surrendered = keys.surrendered(journal.producer_id)
        run = journal.start_run("t", "agent", {}, run_id=run_id)

        def pay() -> None:
            try:
                run.call(slow, {"logical": "pay"}, step="pay")
            except BaseException as exc:  # noqa: BLE001 - asserted below
                errors.append(exc)

        payer = threading.Thread(target=pay)
        payer.start()
        assert started.wait(10)  # the payment's request is at the provider
        _lose_ack_of(journal, EventType.TOOL_CALL_INTENDED)
        with pytest.raises(DeliveryError):
            run.call(fast, {"logical": "book"}, step="book")
        time.sleep(1.0)
        assert not r.hexists(surrendered, run_id), "handed over while a request of the run was in flight"
        assert r.sismember(keys.owned(journal.producer_id), run_id)
        release.set()
        payer.join(10)
        assert errors and isinstance(errors[0], DeliveryError), errors  # its outcome could not be written
        assert _eventually(lambda: r.hexists(surrendered, run_id))

        outcome = _outcome(_recover(topics), run_id)
        assert outcome.action == "resumed" and outcome.assigned_to == journal.producer_id, outcome
        assert journal.claim_assignment(timeout_s=5) == run_id
        again = journal.resume(run_id)
        assert again.call(fast, {"logical": "book"}, step="book") == {"booked": 1}  # reconciled: not run, runs once
        assert again.call(slow, {"logical": "pay"}, step="pay") == {"paid": 1}  # reconciled by key: it ran
        again.succeed({})
        journal.flush()
    assert ledger.executions() == 2, "each effect ran once"
    state = _state(topics, run_id)
    assert state.status is RunStatus.SUCCEEDED and not state.parked


def test_two_recovery_jobs_resume_a_surrendered_run_once(topics: Settings) -> None:
    r = redis.Redis.from_url(topics.redis_url)
    keys = RedisKeys(topics.topic_prefix)
    ledger = Ledger(r, f"sur{uuid.uuid4().hex[:8]}")
    tool = LedgerTool(ledger, name="book", result={"booked": 1})
    run_id = f"sur-{uuid.uuid4().hex[:8]}"
    with Journal(topics, producer_id=f"surrender-{uuid.uuid4().hex[:6]}", outcome_commit="strict") as journal:
        run = journal.start_run("t", "agent", {}, run_id=run_id)
        _lose_ack_of(journal, EventType.TOOL_CALL_INTENDED)
        with pytest.raises(DeliveryError):
            run.call(tool, {"logical": "a"})
        assert _eventually(lambda: r.hexists(keys.surrendered(journal.producer_id), run_id))
        reports: list[Any] = []
        barrier = threading.Barrier(2)

        def actor() -> None:
            barrier.wait()
            reports.append(_recover(topics))

        actors = [threading.Thread(target=actor) for _ in range(2)]
        for a in actors:
            a.start()
        for a in actors:
            a.join(120)
        actions = sorted(_outcome(rep, run_id).action for rep in reports if any(o.run_id == run_id for o in rep.runs))
        assert actions.count("resumed") == 1, actions
        assert journal.claim_assignment(timeout_s=5) == run_id
        again = journal.resume(run_id)
        assert again.call(tool, {"logical": "a"}) == {"booked": 1}
        again.succeed({})
        journal.flush()
    resumed = [rec.event for rec in read_committed(topics)
               if rec.event.run_id == run_id and rec.event.type is EventType.RUN_RESUMED]
    assert [e.epoch for e in resumed] == [2], "one RUN_RESUMED"
    assert ledger.executions() == 1


def test_an_instance_killed_inside_its_surrender_is_recovered_as_a_dead_one(topics: Settings,
                                                                              service_env: dict[str, str]) -> None:
    """SIGKILL between the surrender's commit and its Redis write (``producers.surrender.after_flush``): the run is
    still in the dead instance's owned set, so the stale pass fences the instance and resumes the run — once."""
    r = redis.Redis.from_url(topics.redis_url)
    keys = RedisKeys(topics.topic_prefix)
    ns = f"sur{uuid.uuid4().hex[:8]}"
    run_id, writer = f"sur-{uuid.uuid4().hex[:8]}", f"surrender-{uuid.uuid4().hex[:6]}"
    child = subprocess.Popen([sys.executable, "-m", "tests.support.surrender_child", run_id, writer, ns],
                             env={**service_env, "RJ_FAILPOINTS": "producers.surrender.after_flush"},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert child.wait(30) == -signal.SIGKILL, (line, child.stderr.read() if child.stderr else "")
    finally:
        child.kill()
    # killed at the failpoint only the surrender passes (before or after the child printed "broken": two threads)
    assert r.sismember(keys.owned(writer), run_id) and not r.hexists(keys.surrendered(writer), run_id)
    wait_lease_gone(topics, writer)
    ledger = Ledger(r, ns)
    tool = LedgerTool(ledger, name="book", result={"booked": 1})
    with Journal(topics, producer_id=f"taker-{uuid.uuid4().hex[:6]}", outcome_commit="strict") as journal:
        report = _recover(topics)
        outcome = _outcome(report, run_id)
        assert outcome.action == "resumed" and writer in report.fenced, outcome
        assert journal.claim_assignment(timeout_s=5) == run_id
        again = journal.resume(run_id)
        assert again.call(tool, {"logical": "a"}) == {"booked": 1}
        again.succeed({})
        journal.flush()
    assert ledger.executions() == 1

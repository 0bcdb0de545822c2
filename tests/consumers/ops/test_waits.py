"""Durable timers and signals (issue 31): ``run.sleep`` and ``run.wait_signal`` survive a release, a crash and a
restart, fire by Redis's clock, and deliver a signal exactly once — against the real broker and Redis.

docs/design/decisions/0050-durable-waits.md. A waiting run holds no process: past ``hold_after_s`` it is released,
held for nobody, and the recovery sweep (``recover --stale``) resumes it on a live instance when its time comes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from runjournal.consumers.ops.control import Operator
from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core.settings import Settings
from runjournal.model.reducer import RunStatus
from runjournal.producers import Journal, RunHandle
from runjournal.producers.errors import RunWaitingError, SignalTimeoutError
from tests.consumers.ops.test_control import LEASE_MS, Ledger

pytestmark = pytest.mark.integration


@pytest.fixture
def operator(topics: Settings) -> Iterator[Operator]:
    with Operator(topics, wait_s=10, poll_s=0.1) as op:
        yield op


def _journal(topics: Settings, hold_after_s: float) -> Journal:
    return Journal(topics, producer_id=f"w-{uuid.uuid4().hex[:8]}", lease_ttl_ms=LEASE_MS, hold_after_s=hold_after_s)


def sleeper(run: RunHandle, tool: Ledger, seconds: float) -> Any:
    """The agent's code: charge, sleep, charge again."""
    run.call(tool, {"step": "before"})
    run.sleep(seconds)
    return run.call(tool, {"step": "after"})


def test_a_short_sleep_waits_in_the_process_by_redis_clock(topics: Settings, operator: Operator) -> None:
    with _journal(topics, hold_after_s=30) as journal:
        run = journal.start_run("t", "sleeper", {})
        clock = operator.controls
        before = clock.now_ms()
        sleeper(run, Ledger(), 0.4)
        assert clock.now_ms() - before >= 400
        run.succeed()


def test_a_long_sleep_releases_the_run_and_the_sweep_resumes_it_when_it_is_due(topics: Settings,
                                                                               operator: Operator) -> None:
    tool = Ledger()
    with _journal(topics, hold_after_s=0.3) as journal:
        run = journal.start_run("t", "sleeper", {"n": 1})
        with pytest.raises(RunWaitingError) as info:
            sleeper(run, tool, 2.5)
        due = info.value.until_ms
        assert due is not None and info.value.signal is None
        job = RecoveryJob(topics)
        try:
            deadline = time.monotonic() + 10
            while (state := operator._fold(run.run_id)).status is not RunStatus.PAUSED:  # noqa: SLF001
                assert time.monotonic() < deadline, state.status
                job.recover(stale=True)  # takes the surrendered run and holds it until its wake-up time
                time.sleep(0.2)
            assert state.resume_at_ms == due and state.owner is None
            assert journal.claim_assignment(0) is None  # held for nobody
            early = job.recover(stale=True).as_dict()  # not yet due: left held
            assert all(r["run_id"] != run.run_id for r in early["runs"]) or early["actions"].get("resumed") is None
            while operator.controls.now_ms() < due:
                time.sleep(0.1)
            woken = job.recover(stale=True).as_dict()
            assert [r["action"] for r in woken["runs"] if r["run_id"] == run.run_id] == ["resumed"], woken
        finally:
            job.close()
        again = journal.resume(journal.claim_assignment(5) or "")
        assert again.run_id == run.run_id and again.input == {"n": 1}
        started = time.monotonic()
        sleeper(again, tool, 2.5)  # the sleep is over: it passes at once; the first charge returns its record
        assert time.monotonic() - started < 2.0
        again.succeed()
    assert sorted(tool.ran.values()) == [1, 1]  # before and after: each once


def test_a_signal_is_delivered_once_even_before_the_run_waits_for_it(topics: Settings, operator: Operator) -> None:
    with _journal(topics, hold_after_s=30) as journal:
        run = journal.start_run("t", "waiter", {})
        first = operator.signal(run.run_id, "approved", {"by": "alice"})
        second = operator.signal(run.run_id, "approved", {"by": "mallory"})
        assert (first.outcome, second.outcome) == ("delivered", "already_delivered")
        assert run.wait_signal("approved") == {"by": "alice"}
        assert run.wait_signal("approved") == {"by": "alice"}  # a second wait of the same name: the same delivery
        with pytest.raises(SignalTimeoutError):
            run.wait_signal("never", timeout_s=0.4, poll_s=0.05)
        run.succeed()


def test_a_held_run_waiting_for_a_signal_is_woken_by_it_on_a_live_instance(topics: Settings,
                                                                           operator: Operator) -> None:
    tool = Ledger()
    waiter = _journal(topics, hold_after_s=0.2)
    run = waiter.start_run("t", "waiter", {})
    run.call(tool, {"step": "before"})
    with pytest.raises(RunWaitingError) as info:
        run.wait_signal("approved", timeout_s=600, poll_s=0.05)
    assert info.value.signal == "approved"
    waiter.close()  # the process goes away too: the run is held, not owned
    job = RecoveryJob(topics)
    try:
        deadline = time.monotonic() + 15
        while operator._fold(run.run_id).status is not RunStatus.PAUSED:  # noqa: SLF001
            assert time.monotonic() < deadline
            job.recover(stale=True)
            time.sleep(0.2)
    finally:
        job.close()
    assert operator._fold(run.run_id).waiting_for == "approved"  # noqa: SLF001
    with _journal(topics, hold_after_s=30) as journal:
        sent = operator.signal(run.run_id, "approved", {"ok": True}, requested_by="alice")
        assert sent.outcome == "delivered" and "woken" in sent.detail, sent
        again = journal.resume(journal.claim_assignment(5) or "")
        again.call(tool, {"step": "before"})
        assert again.wait_signal("approved", timeout_s=600) == {"ok": True}
        again.call(tool, {"step": "after"})
        again.succeed()
    assert sorted(tool.ran.values()) == [1, 1]


def test_a_timer_due_while_no_instance_is_alive_fires_once_one_is(topics: Settings, operator: Operator) -> None:
    sleeping = _journal(topics, hold_after_s=0.2)
    run = sleeping.start_run("t", "sleeper", {})
    with pytest.raises(RunWaitingError):
        run.sleep(0.5)
    sleeping.close()
    job = RecoveryJob(topics)
    try:
        deadline = time.monotonic() + 15
        while operator._fold(run.run_id).status is not RunStatus.PAUSED:  # noqa: SLF001
            assert time.monotonic() < deadline
            job.recover(stale=True)
            time.sleep(0.2)
        time.sleep(0.6)
        alone = job.recover(stale=True).as_dict()
        assert [r["action"] for r in alone["runs"] if r["run_id"] == run.run_id] == ["no_live_instance"], alone
        with _journal(topics, hold_after_s=30) as journal:
            woken = job.recover(stale=True).as_dict()
            assert [r["action"] for r in woken["runs"] if r["run_id"] == run.run_id] == ["resumed"], woken
            again = journal.resume(journal.claim_assignment(5) or "")
            again.sleep(0.5)  # over
            again.succeed()
        assert job.recover(stale=True).as_dict()["runs"] == []  # fired once: nothing left to wake
    finally:
        job.close()


def test_the_asyncio_handle_sleeps_waits_for_a_signal_and_stops_on_a_cancel(topics: Settings,
                                                                            operator: Operator) -> None:
    """The same steps from asyncio: a sleep by Redis's clock, a signal sent before the wait, a cancel seen by a
    coroutine tool through ``stop_requested()`` and carried out at the next call."""
    import asyncio

    from runjournal.producers import RunCancelledError, stop_requested
    from runjournal.producers.aio import AsyncJournal

    class Crawl:
        name = "crawl"
        side_effect = False
        timeout_ms = 5000

        def __init__(self) -> None:
            self.saw: list[Any] = []

        async def acall(self, args: dict[str, Any], idempotency_key: str) -> Any:
            for _ in range(100):
                if (request := stop_requested()) is not None:
                    self.saw.append(request.action)
                    return "partial"
                await asyncio.sleep(0.05)
            return "done"

        def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:  # pragma: no cover - acall is used
            raise AssertionError("the async driver awaits acall")

    async def main() -> None:
        journal = await AsyncJournal.open(topics, producer_id=f"aw-{uuid.uuid4().hex[:6]}", lease_ttl_ms=LEASE_MS)
        try:
            run = await journal.start_run("t", "crawler", {})
            before = operator.controls.now_ms()
            await run.sleep(0.3)
            assert operator.controls.now_ms() - before >= 300
            operator.signal(run.run_id, "go", {"n": 1})
            assert await run.wait_signal("go") == {"n": 1}
            tool = Crawl()
            asking = asyncio.get_running_loop().run_in_executor(
                None, lambda: operator.cancel(run.run_id, reason="enough"))
            assert await run.call(tool, {}) == "partial" and tool.saw == ["cancel"]
            try:
                await run.call(tool, {"again": 1})
                raise AssertionError("the cancel was not carried out")
            except RunCancelledError:
                pass
            assert (await asking).outcome == "cancelled"
        finally:
            await journal.close()

    asyncio.run(main())
    assert stop_requested() is None

"""One clock per decision (issue 28 case 1): recovery must not reconcile a call while its request can still act,
whatever the writer's wall clock says. The writer's wall clock runs 5 minutes behind or ahead of the recovery host
(``tests.support.skew_child``); its transfer request reaches a slow bank that applies it 2.5 s later (within the
tool's 4 s timeout), after the writer was SIGKILLed. The bank's ledger must show the transfer once: recovery waits
out the writer's effect window (Redis's clock), never ``intent occurred_at + timeout`` against its own clock.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest
import redis

from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core.settings import Settings
from runjournal.producers import Journal
from tests.support.provider import wait_lease_gone
from tests.support.slow_bank import Bank, TransferTool

pytestmark = pytest.mark.integration

@pytest.mark.parametrize("skew_s", [-300, 0, 300], ids=["writer-5min-behind", "no-skew", "writer-5min-ahead"])
def test_recovery_waits_out_a_skewed_writers_request_and_the_transfer_happens_once(
        topics: Settings, service_env: dict[str, str], skew_s: int) -> None:
    r = redis.Redis.from_url(topics.redis_url)
    ns = topics.topic_prefix
    bank = Bank(r, ns, apply_after_s=2.5)
    run_id, writer = f"pay-{uuid.uuid4().hex[:8]}", f"skewed-{uuid.uuid4().hex[:6]}"
    child = subprocess.Popen([sys.executable, "-m", "tests.support.skew_child", run_id, writer, str(skew_s)],
                             env=service_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        if line.strip() != "sent":
            child.kill()
            _out, err = child.communicate(timeout=10)
            pytest.fail(f"the writer did not send: {line!r}, exit {child.returncode}, stderr: {err[-3000:]}")
        child.kill()  # the request is at the bank; the writer dies before its answer
        child.wait(10)
        wait_lease_gone(topics, writer)
        with Journal(topics, producer_id=f"resumer-{uuid.uuid4().hex[:6]}") as journal:
            job = RecoveryJob(topics, max_wait_s=30)
            try:
                report = job.recover(stale=True, assign_to=journal.producer_id)
            finally:
                job.close()
            outcome = next(o for o in report.runs if o.run_id == run_id)
            assert outcome.action == "resumed", outcome
            assert journal.claim_assignment(timeout_s=10) == run_id
            handle = journal.resume(run_id)
            with handle.node("pay"):
                handle.call(TransferTool(r, ns), {"to": "bob", "amount": 100})
            handle.succeed()
        time.sleep(3.0)  # a second request, if one was sent, is applied by now
        applied = bank.applied()
        assert list(applied.values()) == [1], f"the transfer was applied {applied} (writer clock {skew_s:+d} s)"
    finally:
        if child.poll() is None:
            child.kill()
        bank.stop()



def test_the_writer_journals_its_skewed_clock(topics: Settings, service_env: dict[str, str]) -> None:
    """The skew is real where the journal reads time: the skewed writer's RUN_STARTED says 5 minutes ahead."""
    from tests.support.readback import events_of, read_committed

    run_id, writer = f"skew-{uuid.uuid4().hex[:8]}", f"skewed-{uuid.uuid4().hex[:6]}"
    child = subprocess.Popen([sys.executable, "-m", "tests.support.skew_child", run_id, writer, "300"],
                             env=service_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "sent"
    finally:
        child.kill()
        child.wait(10)
    started = events_of(read_committed(topics), run_id)[0]
    assert 290 < started.occurred_at.timestamp() - time.time() < 310


_SLOW_THEN_UNKNOWN = """
import os, sys
import redis
from runjournal.core.settings import Settings
from runjournal.producers import Journal, OutcomeUnknownError
from tests.support.ledger import Ledger, LedgerTool

settings = Settings.load()
ledger = Ledger(redis.Redis.from_url(settings.redis_url), settings.topic_prefix)
with Journal(settings, producer_id=sys.argv[2], lease_ttl_ms=1000) as journal:
    run = journal.start_run("t", "agent", {}, run_id=sys.argv[1])
    with run.node("slow"):
        run.call(LedgerTool(ledger, name="wire", timeout_ms=30_000), {"logical": "wire"})
    with run.node("quick"):
        try:
            run.call(LedgerTool(ledger, name="ping", timeout_ms=50, then="timeout_after"), {"logical": "ping"})
        except OutcomeUnknownError:
            os._exit(9)  # dies with the call unknown; its lease runs out
"""


def test_a_slow_tool_called_once_does_not_make_every_recovery_wait_for_it(topics: Settings,
                                                                           service_env: dict[str, str]) -> None:
    """The window's T is the instance's longest tool timeout (30 s here), but an unknown 50 ms call is waited for
    50 ms past the lease's end (``PTTL - T + t``), not 30 s: the run is resumed, not deferred."""
    run_id, writer = f"quick-{uuid.uuid4().hex[:8]}", f"mixed-{uuid.uuid4().hex[:6]}"
    done = subprocess.run([sys.executable, "-c", _SLOW_THEN_UNKNOWN, run_id, writer], env=service_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 9, done.stderr[-2000:]
    wait_lease_gone(topics, writer)
    with Journal(topics, producer_id=f"taker-{uuid.uuid4().hex[:6]}") as journal:
        job = RecoveryJob(topics, max_wait_s=5)
        try:
            started = time.monotonic()
            report = job.recover(stale=True, assign_to=journal.producer_id)
        finally:
            job.close()
    outcome = next(o for o in report.runs if o.run_id == run_id)
    assert outcome.action == "resumed", outcome
    assert time.monotonic() - started < 5

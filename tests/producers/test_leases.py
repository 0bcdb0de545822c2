"""Leases are compare-and-set; a lapse fences the instance; incarnations of one producer_id are distinct.

Issue 13, cases 1 and 2, with real agent processes (SIGSTOPped, SIGKILLed), the real recovery job, broker
and Redis; the demo provider's ledger is the witness of how many times an email was sent.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from runjournal.consumers.recovery.instances import Instances
from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core.settings import Settings
from runjournal.model.reducer import RunStatus
from runjournal.schemas.keys import partition_for
from tests.support.provider import Provider, child, project, running_provider, wait_lease_gone

pytestmark = [pytest.mark.integration, pytest.mark.crash]


@pytest.fixture
def provider(tmp_path: Path, service_env: dict[str, str]) -> Iterator[Provider]:
    with running_provider(tmp_path, service_env) as running:
        yield running


def _wait(predicate, timeout_s: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_lapsed_lease_is_never_revived_and_fences_the_instance(topics: Settings, service_env: dict[str, str],
                                                                 tmp_path: Path) -> None:
    """Case 1: the instance is paused past its lease; recovery lists it as stale; resumed, its heartbeat must
    not bring the lease back (it would look alive, and least loaded), and every publish of it must raise."""
    r = redis.Redis.from_url(topics.redis_url)
    instances = Instances(r, topics.topic_prefix)
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.lease_child", "chatter", "zombie-1",
                             str(tmp_path)], env=service_env, stderr=subprocess.PIPE, text=True)
    try:
        _wait(lambda: (tmp_path / "ready").exists() or proc.poll() is not None, 60, "the child never started")
        instance = (tmp_path / "ready").read_text()
        proc.send_signal(signal.SIGSTOP)
        _wait(lambda: instance not in instances.live(), 10, "the paused instance's lease never expired")
        assert [v.producer_id for v in instances.stale()] == [instance]
        proc.send_signal(signal.SIGCONT)
        _wait(lambda: proc.poll() is not None, 10, "the resumed zombie kept publishing")
        assert proc.returncode == 3, proc.stderr.read()[-2000:]
        assert (tmp_path / "error").read_text() in {"ProducerFencedError", "LeaseLapsedError"}
        assert instance not in instances.live(), "the lapsed lease came back"
        assert [v.producer_id for v in instances.stale()] == [instance]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        proc.stderr.close()


def test_a_restart_under_the_same_producer_id_does_not_orphan_the_earlier_incarnation(
        topics: Settings, service_env: dict[str, str], provider: Provider) -> None:
    """Case 2: agent-7 dies inside a send; its supervisor restarts it as agent-7 at once. The earlier
    incarnation's run must be recovered (and may be handed to the new incarnation), the email sent once."""
    run_id = "inc-1"
    first = child(service_env, run_id, "agent-7", provider, failpoint="producers.call.after_tool=1")
    assert first.wait(60) == -signal.SIGKILL, first.stderr.read()[-3000:]
    restarted = subprocess.Popen([sys.executable, "-m", "tests.support.lease_child", "restart", "agent-7",
                                  provider.url, run_id], env=service_env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    try:
        wait_lease_gone(topics, "agent-7", timeout_s=10)  # the earlier incarnation's lease
        job = RecoveryJob(topics)
        report = job.recover(stale=True).as_dict()
        job.close()
        assert [r["run_id"] for r in report["runs"]] == [run_id], report
        (outcome,) = report["runs"]
        assert outcome["action"] == "resumed" and report["fenced"] == ["agent-7"]
        assert restarted.wait(60) == 0, restarted.stderr.read()[-3000:]
        new_instance = restarted.stdout.read().strip()
        assert new_instance != "agent-7" and outcome["assigned_to"] == new_instance
    finally:
        if restarted.poll() is None:
            restarted.kill()
        restarted.wait(10)
    assert provider.executions() == 1
    state = project(topics).get(partition_for(run_id, topics.partitions), run_id)
    assert state.status is RunStatus.SUCCEEDED and state.epoch == 2


def _wait_for(predicate, timeout_s: float = 10) -> None:  # noqa: ANN001
    _wait(predicate, timeout_s, "condition not reached")


def test_a_deleted_lease_fences_the_instance_in_process(topics: Settings) -> None:
    """The heartbeat's compare-and-set finds the key gone: it stops, never re-creates it, and every write of
    the instance — publishes, new runs, resumes, tool calls — raises LeaseLapsedError."""
    from runjournal.producers import Journal, LeaseLapsedError

    r = redis.Redis.from_url(topics.redis_url)
    journal = Journal(topics, producer_id="lapsing", lease_ttl_ms=600)
    run = journal.start_run("t", "a", {})
    r.delete(journal._lease.key)  # noqa: SLF001 - what an expiry does
    _wait_for(lambda: journal.lapsed)
    time.sleep(0.5)  # more than one heartbeat period
    assert not r.exists(journal._lease.key), "a lapsed lease is never revived"  # noqa: SLF001
    for write in (lambda: run.message("assistant", "hi"), lambda: journal.start_run("t", "a", {}),
                  lambda: journal.resume(run.run_id)):
        with pytest.raises(LeaseLapsedError):
            write()
    assert journal.stats["lease_lapses"] == 1 and journal.stats["fences"] == 1
    journal.close()


def test_a_fence_at_the_broker_ends_the_lease(topics: Settings) -> None:
    """A fenced instance must not look alive (recovery would hand it runs): its lease goes with the fence."""
    from runjournal.producers import Journal, ProducerFencedError, fence_producer

    instances = Instances(redis.Redis.from_url(topics.redis_url), topics.topic_prefix)
    journal = Journal(topics, producer_id="fenced")
    run = journal.start_run("t", "a", {})
    assert "fenced" in instances.live()
    fence_producer(topics, journal.producer_id)
    with pytest.raises(ProducerFencedError):
        run.request_approval("c", "why")
    assert "fenced" not in instances.live() and [v.producer_id for v in instances.stale()] == ["fenced"]
    try:
        journal.close()
    except ProducerFencedError:
        pass


def test_redis_unreachable_past_the_lease_validity_fences_the_instance(topics: Settings) -> None:
    """Cut off from Redis longer than its TTL, the instance cannot know whether it was declared dead: the key
    has expired in Redis, so it fences itself (the local clock decides) instead of assuming it is alive."""
    from runjournal.producers import Journal, LeaseLapsedError

    journal = Journal(topics, producer_id="cut-off", lease_ttl_ms=600)
    lease = journal._lease  # noqa: SLF001

    def unreachable(*args: object, **kwargs: object) -> object:
        raise redis.ConnectionError("injected: Redis unreachable")

    lease._renew = unreachable  # noqa: SLF001
    lease._r = type("Down", (), {"get": unreachable})()  # noqa: SLF001
    assert lease.still_ours(), "within its validity the lease still counts as held"
    _wait_for(lambda: journal.lapsed, 5)
    with pytest.raises(LeaseLapsedError):
        journal.check_still_owner()
    journal.close()

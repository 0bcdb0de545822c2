"""Crashes and zombies: SIGKILLed child processes, and broker-side fencing of a live Journal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.producers import Journal, ProducerFencedError, fence_producer, transactional_id
from runjournal.schemas import EventType
from tests.support.readback import events_of, read_committed

pytestmark = pytest.mark.integration

CHILD = Path(__file__).resolve().parents[1] / "support" / "journal_child.py"


class Counting:
    name = "charge_card"
    side_effect = True
    timeout_ms = 1000

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        self.runs += 1
        return {"charged": args["amount"]}


def _kill_child_when_ready(mode: str, env: dict[str, str], tmp_path: Path) -> tuple[str, str]:
    """Start the child, wait until it reaches the crash point, SIGKILL it. Returns (run_id, producer_id)."""
    run_id, producer_id = f"crash-{uuid.uuid4().hex[:8]}", f"child-{uuid.uuid4().hex[:8]}"
    ready = tmp_path / f"{mode}.ready"
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), mode, run_id, producer_id, str(ready)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if proc.poll() is not None:
                pytest.fail(
                    f"child exited {proc.returncode} before the crash point: {proc.stderr.read().decode()}"
                )
            assert time.monotonic() < deadline, "child never reached the crash point"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    return run_id, producer_id


@pytest.mark.crash
def test_killed_inside_the_tool_leaves_an_intent_without_outcome(
    topics: Settings, service_env: dict[str, str], tmp_path: Path
) -> None:
    run_id, producer_id = _kill_child_when_ready("in-tool", service_env, tmp_path)
    fence_producer(topics, producer_id)  # what the recovery job does first; aborts any open transaction
    events = events_of(read_committed(topics), run_id)
    assert [e.type for e in events] == [
        EventType.RUN_STARTED,
        EventType.NODE_STARTED,
        EventType.TOOL_CALL_INTENDED,
    ]
    assert events[-1].payload["tool"] == "send_email" and events[-1].node_id == "notify"
    witness = redis.Redis.from_url(topics.redis_url).get(f"{topics.topic_prefix}:witness:{run_id}")
    assert witness == b"1"  # the effect happened exactly once: outcome unknown, not "not done"


@pytest.mark.crash
def test_killed_before_the_intent_was_acknowledged_executes_nothing(
    topics: Settings, service_env: dict[str, str], tmp_path: Path
) -> None:
    run_id, producer_id = _kill_child_when_ready("before-intent-ack", service_env, tmp_path)
    fence_producer(topics, producer_id)
    events = events_of(read_committed(topics), run_id)
    assert EventType.TOOL_CALL_INTENDED not in [e.type for e in events]
    assert events == []  # the whole open transaction (RUN_STARTED, NODE_STARTED, INTENDED) was aborted
    assert redis.Redis.from_url(topics.redis_url).get(f"{topics.topic_prefix}:witness:{run_id}") is None


def test_fenced_journal_refuses_the_run_and_nothing_after_the_fence_is_visible(topics: Settings) -> None:
    producer_id = f"zombie-{uuid.uuid4().hex[:8]}"
    tool = Counting()
    journal = Journal(topics, producer_id=producer_id)
    try:
        run = journal.start_run("tenant-a", "pay-agent", {"amount": 5})
        assert run.call(tool, {"amount": 5}) == {"charged": 5}
        fencer = kafka.producer(topics, **{"transactional.id": transactional_id(topics, producer_id)}
        )
        fencer.init_transactions(30)  # the recovery job's fence: bumps the producer epoch
        fencer.close()
        with pytest.raises(ProducerFencedError):
            run.request_approval("c-1", "refund?")
        with pytest.raises(ProducerFencedError):
            run.call(tool, {"amount": 7})
        with pytest.raises(ProducerFencedError):
            run.message("assistant", "still here?")
        assert tool.runs == 1 and not run.writable and journal.stats["fences"] == 1
        # The instance is done: re-initialising its transactional.id would un-fence it behind the
        # recovery job's read, so even a run begun after the fence is refused.
        with pytest.raises(ProducerFencedError):
            fresh = journal.start_run("tenant-a", "pay-agent", {"amount": 1}, run_id="after-fence")
            fresh.succeed()
        assert tool.runs == 1
    finally:
        try:
            journal.close()
        except ProducerFencedError:
            pass
    records = read_committed(topics)
    assert [e.type for e in events_of(records, run.run_id)] == [
        EventType.RUN_STARTED,
        EventType.TOOL_CALL_INTENDED,
        EventType.TOOL_CALL_COMMITTED,
    ]
    assert events_of(records, "after-fence") == []

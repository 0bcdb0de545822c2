"""Issue 29's acceptance: a run of 20,000 events and a run with a 50 MB result, Redis wiped, the projection rebuilt
from the topic, both runs recovered and resumed by another instance — every recorded result returned, no tool run
again. Redis is a cache: what a resumed run reads comes from the journal."""

from __future__ import annotations

import hashlib
import threading
import uuid
from typing import Any

import pytest

from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core import redis_client
from runjournal.core.settings import Settings
from runjournal.model.reducer import fold, state_digest
from runjournal.producers import Journal, Outcome, partition_for
from tests.support.provider import project
from tests.support.readback import events_of, read_committed

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CALLS = 10_000  # 2 events each, plus the run's start, its node and MESSAGEs: over 20,000 events
BIG = 50 * 1024 * 1024


class Ledger:
    """A side-effecting tool whose executions are counted per idempotency key (the witness)."""

    side_effect = True
    timeout_ms = 2_000

    def __init__(self, name: str, result: Any = None) -> None:
        self.name = name
        self.result = result
        self.executed: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        with self._lock:
            self.executed[idempotency_key] = self.executed.get(idempotency_key, 0) + 1
        return self.result if self.result is not None else {"n": args["n"], "echo": "r" * 40}

    def reconcile(self, idempotency_key: str) -> Outcome | None:
        return None


def _long_run(run: Any, tool: Ledger) -> list[Any]:
    with run.node("loop"):
        return [run.call(tool, {"n": n}) for n in range(CALLS)]


def test_a_20000_event_run_and_a_50_mb_result_survive_a_redis_wipe_and_resume_without_rerunning(
        topics: Settings) -> None:
    small, big_tool = Ledger("step"), Ledger("export", result={"blob": "b" * BIG})
    with Journal(topics, producer_id=f"a-{uuid.uuid4().hex[:6]}") as first:
        long_run = first.start_run("acme", "coder", {"task": "many steps"})
        results = _long_run(long_run, small)
        for i in range(CALLS // 10):
            long_run.message("assistant", f"progress {i}")
        big_run = first.start_run("acme", "exporter", {"task": "one big result"})
        with big_run.node("export"):
            exported = big_run.call(big_tool, {"n": 0})
        first.flush()
    # the instance is gone (its lease released with it); neither run ended
    assert len(small.executed) == CALLS and set(small.executed.values()) == {1}
    assert hashlib.sha256(exported["blob"].encode()).hexdigest() == hashlib.sha256(b"b" * BIG).hexdigest()

    redis_client.client(topics).flushdb()  # Redis is disposable: everything below comes from the journal
    store = project(topics)
    assert len(events_of(read_committed(topics, timeout_s=60), long_run.run_id)) > 20_000
    rebuilt = store.get(partition_for(long_run.run_id, topics.partitions), long_run.run_id)
    assert rebuilt is not None and len(rebuilt.records) == CALLS

    with Journal(topics, producer_id=f"b-{uuid.uuid4().hex[:6]}") as second:
        job = RecoveryJob(topics, max_wait_s=0)
        try:
            report = job.recover(runs=[long_run.run_id, big_run.run_id], assign_to=second.producer_id)
        finally:
            job.close()
        assert sorted(r.action for r in report.runs) == ["resumed", "resumed"], report.as_dict()
        resumed = second.resume(long_run.run_id)
        assert _long_run(resumed, small) == results  # every recorded result, from the journal
        resumed.succeed({"calls": CALLS})
        again = second.resume(big_run.run_id)
        with again.node("export"):
            assert again.call(big_tool, {"n": 0}) == exported
        again.succeed(None)
    assert set(small.executed.values()) == {1} and big_tool.executed == {k: 1 for k in big_tool.executed}
    state = project(topics).get(partition_for(long_run.run_id, topics.partitions), long_run.run_id)
    assert state is not None and state.status.value == "SUCCEEDED" and len(state.records) == CALLS
    records = [r for r in read_committed(topics, timeout_s=60) if r.event.run_id == long_run.run_id]
    assert state_digest(state) == state_digest(fold((r.event, r.partition, r.offset) for r in records))

"""Fork a run from a point of its history (issue 31), against the real broker and Redis.

docs/design/decisions/0049-fork.md. The witness is the tool's own ledger (what ran, by idempotency key): a call
recorded at the fork point never runs again, an unknown one is reconciled under the source's key, and only the calls
after the fork point — exactly those ``--dry-run`` listed — run again, under new keys.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from runjournal.consumers.ops.control import ControlRefusedError, Operator
from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core.settings import Settings
from runjournal.model.reducer import CallStatus, RunStatus
from runjournal.producers import Journal, RunHandle
from runjournal.schemas import EventType
from tests.consumers.ops.test_control import LEASE_MS, Ledger
from tests.support.readback import events_of, read_committed

pytestmark = pytest.mark.integration


@pytest.fixture
def journal(topics: Settings) -> Iterator[Journal]:
    with Journal(topics, producer_id=f"a-{uuid.uuid4().hex[:8]}", lease_ttl_ms=LEASE_MS) as j:
        yield j


@pytest.fixture
def operator(topics: Settings) -> Iterator[Operator]:
    with Operator(topics, wait_s=10, poll_s=0.1) as op:
        yield op


def agent(run: RunHandle, tool: Ledger, steps: int) -> list[Any]:
    """The agent's code: the same for the source, a resumed run and a fork."""
    return [run.call(tool, {"step": i}) for i in range(steps)]


def _seq_of(topics: Settings, run_id: str, etype: EventType, nth: int = 1) -> int:
    seqs = [e.seq for e in events_of(read_committed(topics), run_id) if e.type is etype]
    return seqs[nth - 1]


def _take(journal: Journal, run_id: str) -> RunHandle:
    assert journal.claim_assignment(10) == run_id
    return journal.resume(run_id)


def test_a_fork_returns_what_was_recorded_and_runs_again_only_what_its_dry_run_listed(
        topics: Settings, journal: Journal, operator: Operator) -> None:
    tool = Ledger()
    source = journal.start_run("t", "payer", {"order": 7}, user_id="u-1")
    source_results = agent(source, tool, 3)
    source.succeed("paid")
    first_done = _seq_of(topics, source.run_id, EventType.TOOL_CALL_COMMITTED, 1)  # fork right after the first call
    dry = operator.fork(source.run_id, at_seq=first_done, dry_run=True)
    assert dry.outcome == "would_fork" and [c["tool"] for c in dry.preview["returned"]] == ["charge"]
    assert len(dry.preview["may_repeat"]) == 2 and not dry.preview["reconciled"]
    repeat = {c["call_id"] for c in dry.preview["may_repeat"]}
    assert RecoveryJob(topics).recover(stale=True).as_dict()["runs_recovered"] == 0  # a dry run wrote nothing
    forked = operator.fork(source.run_id, at_seq=first_done, reason="try another card", requested_by="ops@test")
    assert forked.outcome == "forked" and forked.assigned_to == journal.producer_id, forked
    fork = _take(journal, forked.fork_run_id)
    assert fork.forked_from == source.run_id and fork.input == {"order": 7} and fork.epoch == 2
    results = agent(fork, tool, 3)
    fork.succeed("paid again")
    assert results[0] == source_results[0]  # the recorded result, returned
    assert results[1:] != source_results[1:]  # run again, under the fork's keys
    source_keys = set(tool.ran) - {r["key"] for r in results[1:]}
    assert all(n == 1 for n in tool.ran.values()), tool.ran  # nothing ran twice under one key
    assert len(tool.ran) == 5  # 3 of the source + the 2 after the fork point, under new keys
    assert results[0]["key"] in source_keys  # the first call kept the source's key: its result was recorded
    assert repeat == {k for k in source_keys if k != results[0]["key"]}  # what the dry run listed
    state = operator._fold(forked.fork_run_id)  # noqa: SLF001
    assert (state.status, state.forked_from, state.forked_at_seq, state.requested_by) == (
        RunStatus.SUCCEEDED, source.run_id, first_done, "ops@test")
    assert state.fork_lineage == (source.run_id,)
    assert operator._fold(source.run_id).status is RunStatus.SUCCEEDED  # noqa: SLF001 - the source is untouched


def test_a_call_unknown_at_the_fork_point_is_reconciled_under_the_sources_key(
        topics: Settings, journal: Journal, operator: Operator) -> None:
    block = threading.Event()
    tool = Ledger(block=block)
    dying = Journal(topics, producer_id=f"dies-{uuid.uuid4().hex[:6]}", lease_ttl_ms=LEASE_MS)
    source = dying.start_run("t", "payer", {"order": 8})
    caller = threading.Thread(target=lambda: _swallow(lambda: source.call(tool, {"step": 0})), daemon=True)
    caller.start()
    assert tool.started.wait(10)
    dying._lapse("test: dies with a request in flight")  # noqa: SLF001
    dying._stop.set()  # noqa: SLF001
    block.set()
    caller.join(10)
    time.sleep(LEASE_MS / 1000 + 0.5)
    dry = operator.fork(source.run_id, dry_run=True)
    assert len(dry.preview["reconciled"]) == 1 and not dry.preview["may_repeat"], dry.preview
    forked = operator.fork(source.run_id)
    fork = _take(journal, forked.fork_run_id)
    agent(fork, tool, 2)
    fork.succeed()
    assert sum(tool.ran.values()) == 2 and all(n == 1 for n in tool.ran.values())  # step 0 once, step 1 once
    state = operator._fold(forked.fork_run_id)  # noqa: SLF001
    reconciled = [r for r in state.records.values() if r.status is CallStatus.RECONCILED]
    assert len(reconciled) == 1 and reconciled[0].idempotency_key in tool.ran


def test_a_fork_of_a_fork_keeps_every_ancestors_keys_and_survives_its_own_recovery(
        topics: Settings, journal: Journal, operator: Operator) -> None:
    tool = Ledger()
    source = journal.start_run("t", "payer", {"order": 9})
    agent(source, tool, 2)
    source.succeed()
    first = _take(journal, operator.fork(source.run_id).fork_run_id)
    agent(first, tool, 3)  # two returned, one new
    first.succeed()
    assert len(tool.ran) == 3
    # the second fork's owner dies after its first new call; recovery resumes it (its journal has every copied fact)
    dying = Journal(topics, producer_id=f"dies-{uuid.uuid4().hex[:6]}", lease_ttl_ms=LEASE_MS)
    second = operator.fork(first.run_id, assign_to=dying.producer_id)
    run = _take(dying, second.fork_run_id)
    assert run.forked_from == first.run_id
    agent(run, tool, 4)  # three returned (two under the source's keys, one under the first fork's), one new
    dying.close()  # dead, the run unfinished
    report = RecoveryJob(topics).recover(stale=True).as_dict()
    assert [r["action"] for r in report["runs"] if r["run_id"] == second.fork_run_id] == ["resumed"]
    again = _take(journal, second.fork_run_id)
    agent(again, tool, 5)  # four returned, one new
    again.succeed()
    assert len(tool.ran) == 5 and all(n == 1 for n in tool.ran.values()), tool.ran
    state = operator._fold(second.fork_run_id)  # noqa: SLF001
    assert state.fork_lineage == (first.run_id, source.run_id) and state.status is RunStatus.SUCCEEDED


def test_fork_refusals_name_the_fix(topics: Settings, journal: Journal, operator: Operator) -> None:
    run = journal.start_run("t", "payer", {})
    run.succeed()
    with pytest.raises(ControlRefusedError, match="1 to 2"):
        operator.fork(run.run_id, at_seq=9)
    with pytest.raises(ControlRefusedError, match="no event"):
        operator.fork(run.run_id, at_event="nope")
    with pytest.raises(ControlRefusedError, match="exists"):
        operator.fork(run.run_id, new_run_id=run.run_id)
    with pytest.raises(ControlRefusedError, match="no run"):
        operator.fork(f"nobody-{uuid.uuid4().hex[:6]}")


def _swallow(fn: Any) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001 - the dying owner's call: whatever it raises
        pass


def test_a_fork_reads_its_sources_large_result_from_the_payloads_topic(topics: Settings, operator: Operator) -> None:
    """A fork copies the source's ``kafka:`` reference (decision 0052): with the Redis cache gone, the fork's resumed
    run reads the source's records on ``{prefix}.payloads`` and the tool does not run again."""
    from runjournal.core import redis_client
    from runjournal.core.redis_keys import RedisKeys

    ran: list[str] = []

    class Big:
        name, side_effect, timeout_ms = "big", True, 1000

        def __call__(self, args: dict[str, Any], key: str) -> Any:
            ran.append(key)
            return {"blob": "b" * 30_000, "key": key}

    with Journal(topics, producer_id=f"a-{uuid.uuid4().hex[:8]}", lease_ttl_ms=LEASE_MS,
                 inline_result_bytes=1024) as journal:
        source = journal.start_run("t", "fetcher", {})
        recorded = source.call(Big(), {})
        source.succeed("done")
        at = _seq_of(topics, source.run_id, EventType.TOOL_CALL_COMMITTED, 1)
        (ref,) = [e.payload["result_ref"] for e in events_of(read_committed(topics), source.run_id)
                  if e.type is EventType.TOOL_CALL_COMMITTED]
        assert ref.startswith("kafka:")
        r = redis_client.client(topics)
        for key in r.scan_iter(match=RedisKeys(topics.topic_prefix).result("*")):
            r.delete(key)
        forked = operator.fork(source.run_id, at_seq=at, reason="again", requested_by="ops@test")
        assert forked.outcome == "forked", forked
        fork = _take(journal, forked.fork_run_id)
        assert fork.call(Big(), {}) == recorded
        fork.succeed("done again")
    assert len(ran) == 1
    (fork_ref,) = [e.payload["result_ref"] for e in events_of(read_committed(topics), forked.fork_run_id)
                   if e.type is EventType.TOOL_CALL_COMMITTED]
    assert fork_ref == ref  # the source's records, not a copy

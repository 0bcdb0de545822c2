"""Write-behind (``consumers/projector/_writebehind.py``) against the real broker and Redis: a write that fails
while the next batch is folded from it, a reply lost after the script ran, a refused batch, and a revoke or a loss
while a write is in flight. Each ends equal to a fresh fold of the topic, with every applied write continuing the one
before it (``expected`` = the previous write's end: nothing applied twice, nothing skipped) and no group offset ahead
of Redis.

SIGKILLs at the write-behind failpoints (``projector.write_in_flight`` among them) are in ``test_projector_crash.py``.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
import redis
from confluent_kafka import OFFSET_BEGINNING, OFFSET_INVALID, TopicPartition

from runjournal.consumers.projector import ApplyResult, Projector
from runjournal.consumers.projector.store import PreparedBatch
from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.schemas.keys import partition_for
from tests.consumers.projector.test_projector import redis_digests, topic_fold_digests
from tests.support.workload import interleave, publish, run_events

pytestmark = pytest.mark.integration

Call = tuple[int, int, int, str]
"""``(partition, expected offset, new offset, outcome)`` of one apply-script call."""


def workload(settings: Settings, n: int, seed: int, *, partition: int | None = None) -> list[str]:
    """Publish ``n`` interleaved runs (all of one ``partition`` when given); returns their ids."""
    rng = random.Random(seed)
    names = (f"w{seed}-{i}" for i in itertools.count())
    if partition is not None:
        names = (r for r in names if partition_for(r, settings.partitions) == partition)
    runs = [run_events(next(names), calls=rng.randint(1, 4), finish=rng.random() < 0.8) for _ in range(n)]
    publish(settings, interleave(runs, rng))
    return [r[0].run_id for r in runs]


def records(settings: Settings, run_ids: list[str]) -> int:
    from runjournal.consumers.ops.inspect import read_all_events

    by_run = read_all_events(settings)
    return sum(len(by_run.get(r, [])) for r in run_ids)


def instrument(projector: Projector, fault: Callable[[int, PreparedBatch, Callable[[], ApplyResult]], ApplyResult]
               ) -> list[Call]:
    """Route the projector's write-behind calls through ``fault(n, batch, real)`` (n counts from 1); returns the log
    of every call and how it ended."""
    calls: list[Call] = []
    real = projector.writer._run

    def run(batch: PreparedBatch) -> ApplyResult:
        n = len(calls) + 1
        try:
            result = fault(n, batch, lambda: real(batch))
        except Exception:
            calls.append((batch.partition, batch.expected_offset, batch.new_offset, "error"))
            raise
        calls.append((batch.partition, batch.expected_offset, batch.new_offset, result.status))
        return result

    projector.writer._run = run
    return calls


def assert_chained(calls: list[Call]) -> None:
    """Per partition, every applied write starts where the previous applied write ended (the first at -1); after a
    failed call (which may or may not have run the script) either end will do."""
    ends: dict[int, set[int]] = defaultdict(lambda: {-1})
    for partition, expected, new, outcome in calls:
        if outcome == "applied":
            assert expected in ends[partition], (partition, expected, ends[partition], calls)
            ends[partition] = {new}
        elif outcome == "error" and expected in ends[partition]:
            ends[partition] = {expected, new}


def assert_group_not_ahead(settings: Settings, projector: Projector) -> None:
    """The group's committed offset of every partition is at most Redis's applied offset + 1."""
    consumer = kafka.consumer(settings, **{"group.id": projector.group_id})
    try:
        tps = [TopicPartition(settings.events_topic, p) for p in range(settings.partitions)]
        for tp in consumer.committed(tps, timeout=10):
            assert tp.offset <= projector.store.applied_offset(tp.partition) + 1, tp
    finally:
        consumer.close()


def project(settings: Settings, fault: Callable[..., ApplyResult]) -> tuple[Projector, list[Call], list[int]]:
    """Rebuild with ``fault`` on the write path; returns the projector, its write calls and the offsets at which
    each batch was prepared (folded and serialised) — one more than the calls for each batch dropped unwritten."""
    projector = Projector(settings, batch_size=25, group_id=f"{settings.topic_prefix}.wb-{uuid.uuid4().hex[:6]}")
    calls = instrument(projector, fault)
    prepared: list[int] = []
    prepare = projector.store.prepare_batch

    def counted(partition: int, **kw: Any) -> PreparedBatch:
        prepared.append(kw["expected_offset"])
        return prepare(partition, **kw)

    projector.store.prepare_batch = counted  # type: ignore[method-assign]
    projector.run(until_caught_up=True, idle_timeout_s=60)
    return projector, calls, prepared


@pytest.mark.parametrize("when", ["before the script", "after the script (reply lost)"])
def test_a_failed_write_re_seeks_from_redis_and_drops_the_batch_folded_after_it(topics: Settings, when: str) -> None:
    ids = workload(topics, 30, seed=41, partition=0)  # one partition: the batch after the failed one is its own

    def fail_third(n: int, batch: PreparedBatch, real: Callable[[], ApplyResult]) -> ApplyResult:
        if n == 3:
            if when.startswith("after"):
                real()  # applied in Redis; the projector never hears so
            raise redis.ConnectionError("injected: connection reset")
        return real()

    projector, calls, prepared = project(topics, fail_third)
    assert calls[2][3] == "error"
    assert prepared[3] == calls[2][2]  # the 4th batch was folded from the failed write's end (write behind) …
    assert len(prepared) > len(calls)  # … and dropped unwritten
    assert calls[3][1] == (calls[2][2] if when.startswith("after") else calls[2][1])  # re-read from Redis
    assert redis_digests(topics, ids) == topic_fold_digests(topics, ids)
    total = records(topics, ids)
    if when.startswith("before"):  # each record counted once, when its write was applied
        assert projector.stats.events == total
    else:  # the lost reply's records are in Redis but were never confirmed to the projector: not counted
        assert total - projector.batch_size <= projector.stats.events < total
    assert projector.stats.conflicts == 0
    assert_chained(calls)
    assert_group_not_ahead(topics, projector)


def test_a_refused_write_re_seeks_and_the_next_batch_is_not_written(topics: Settings) -> None:
    """A conflict answer (another writer moved the offset) while the next batch was folded from the refused one."""
    ids = workload(topics, 30, seed=42, partition=1)
    moved: dict[str, Any] = {}

    def conflict_third(n: int, batch: PreparedBatch, real: Callable[[], ApplyResult]) -> ApplyResult:
        if n == 3:
            moved["at"] = batch
            return ApplyResult(status="conflict", stored_offset=batch.expected_offset)
        return real()

    projector, calls, prepared = project(topics, conflict_third)
    refused = moved["at"]
    assert prepared[3] == refused.new_offset and len(prepared) > len(calls)  # folded from it, dropped unwritten
    assert calls[3][1] == refused.expected_offset  # folded again from Redis's offset, not from the refused batch
    assert redis_digests(topics, ids) == topic_fold_digests(topics, ids)
    assert projector.stats.conflicts == 1
    assert projector.stats.events == records(topics, ids)
    assert_chained(calls)


@pytest.mark.parametrize("how", ["revoked", "lost"])
def test_a_rebalance_waits_for_the_write_in_flight(topics: Settings, how: str) -> None:
    """A partition revoked (or lost) while its batch's write is in flight: the callback returns only after the write
    ended; a revoke then commits exactly the offset Redis holds, a loss commits nothing; the member forgets it."""
    ids = workload(topics, 10, seed=43, partition=0)
    total = records(topics, ids)
    a = Projector(topics, group_id=f"{topics.topic_prefix}.wb-{uuid.uuid4().hex[:6]}")
    held, release = threading.Event(), threading.Event()

    def hold(n: int, batch: PreparedBatch, real: Callable[[], ApplyResult]) -> ApplyResult:
        held.set()
        assert release.wait(30)
        return real()

    calls = instrument(a, hold)
    a.consumer.incremental_assign([TopicPartition(topics.events_topic, 0, OFFSET_BEGINNING)])
    a.positions.assign(0, -1, set())
    msgs: list[Any] = []
    deadline = time.monotonic() + 30
    while len(msgs) < total and time.monotonic() < deadline:
        msgs += [m for m in a.consumer.consume(1000, timeout=1.0) if m.error() is None]
    assert len(msgs) == total
    try:
        a._handle(msgs)  # folds the batch and hands its write over: it is in flight (held) when _handle returns
        assert held.wait(10) and a.writer.in_flight is not None
        threading.Timer(0.5, release.set).start()
        started = time.monotonic()
        callback = a._on_revoke if how == "revoked" else a._on_lost
        callback(a.consumer, [TopicPartition(topics.events_topic, 0)])
        assert time.monotonic() - started >= 0.4  # it waited for the write …
        assert a.writer.in_flight is None and 0 not in a.applied  # … took its outcome, and forgot the partition
        (committed,) = a.consumer.committed([TopicPartition(topics.events_topic, 0)], timeout=10)
        stored = a.store.applied_offset(0)
        assert calls == [(0, -1, stored, "applied")]
        assert committed.offset == (stored + 1 if how == "revoked" else OFFSET_INVALID)
        assert redis_digests(topics, ids) == topic_fold_digests(topics, ids)
    finally:
        release.set()
        a.writer.close()
        a.consumer.close()


def test_an_already_applied_write_still_commits_its_group_offset(topics: Settings) -> None:
    """Issue 28 case 8: a write whose reply was lost is retried and the script answers that Redis already holds it
    ("duplicate"). The state is right; the group offset must still reach Redis's applied offset + 1 (it stayed one
    batch behind for good: lag never reached 0). Every write here answers "duplicate" after applying."""
    workload(topics, 12, seed=43, partition=0)

    def applied_then_duplicate(n: int, batch: PreparedBatch, real: Callable[[], ApplyResult]) -> ApplyResult:
        real()
        return ApplyResult(status="duplicate", stored_offset=batch.new_offset)

    projector, calls, _prepared = project(topics, applied_then_duplicate)
    assert calls and all(c[3] == "duplicate" for c in calls)
    consumer = kafka.consumer(topics, **{"group.id": projector.group_id})
    try:
        (committed,) = consumer.committed([TopicPartition(topics.events_topic, 0)], timeout=10)
    finally:
        consumer.close()
    assert committed.offset == projector.store.applied_offset(0) + 1, committed

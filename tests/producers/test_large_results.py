"""Large results are as durable as the journal (issue 29): ``{prefix}.payloads`` holds them, Redis only caches them.

Real broker and Redis. A result over ``inline_result_bytes`` is written as records of ``payload_chunk_bytes`` in a
committed transaction before the TOOL_CALL_COMMITTED that references them; a Redis wipe loses nothing; an aborted
transaction's records are never read; a wrong digest or a missing record is a named error; erase tombstones every
record; ``max_result_bytes`` is a named error before anything of the result is produced.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from runjournal.consumers.ops.erase import erase_run
from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core import kafka, redis_client
from runjournal.core.errors import ConfigError
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.producers import Journal, OutcomeUnknownError, RunHandle, canonical_json, partition_for
from runjournal.producers.errors import (
    ArgumentsTooLargeError,
    ResultCorruptError,
    ResultTooLargeError,
    ResultUnavailableError,
    UnrecordableResultError,
)
from runjournal.producers.results import PayloadRef, ResultStore, of_run
from runjournal.schemas import EventType
from tests.support.provider import project
from tests.support.readback import events_of, read_committed

pytestmark = pytest.mark.integration


class Blob:
    """A side-effecting tool returning ``{"blob": <size chars>}`` per call (sizes in order), counting its runs."""

    name = "fetch_blob"
    side_effect = True
    timeout_ms = 1000

    def __init__(self) -> None:
        self.runs: list[int] = []

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        self.runs.append(args["size"])
        return {"blob": blob(args["size"], args.get("seed", 0))}


def blob(size: int, seed: int = 0) -> str:
    """``size`` characters, not all alike (a chunk boundary mistake would show), some of them multi-byte."""
    unit = f"{seed:04d}-abcdefghijklmnopqrstuvwxyz-é€-"
    return (unit * (size // len(unit) + 1))[:size]


def agent(run: RunHandle, tool: Blob, sizes: list[int]) -> list[Any]:
    with run.node("fetch"):
        return [run.call(tool, {"size": size, "seed": i}) for i, size in enumerate(sizes)]


def partition_records(settings: Settings, partition: int, *, committed: bool = True,
                      timeout_s: float = 60) -> list[tuple[bytes, bytes | None, int]]:
    """``(key, value, offset)`` of every record of ``partition`` of the payloads topic, to its end."""
    topic = settings.payloads_topic
    consumer = kafka.consumer(settings, **{"group.id": f"read-{uuid.uuid4()}", "enable.auto.commit": False,
                                           "isolation.level": "read_committed" if committed else "read_uncommitted",
                                           "enable.partition.eof": True})
    out: list[tuple[bytes, bytes | None, int]] = []
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)
        if high <= low:
            return out
        consumer.assign([TopicPartition(topic, partition, low)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msgs = consumer.consume(500, 0.5)
            eof = False
            for msg in msgs:
                if msg.error() is not None:
                    eof = eof or msg.error().code() == -191  # _PARTITION_EOF
                    continue
                out.append((msg.key(), msg.value(), msg.offset()))
            position = consumer.position([TopicPartition(topic, partition)])[0].offset
            if eof or position >= high:
                break
        else:
            raise AssertionError(f"{topic}[{partition}] not read to {high} within {timeout_s} s")
    finally:
        consumer.close()
    return out


def n_chunks(value: Any, chunk_bytes: int) -> int:
    return -(-len(canonical_json(value).encode()) // chunk_bytes)


def result_keys(settings: Settings) -> list[str]:
    r = redis_client.client(settings, decode_responses=True)
    return list(r.scan_iter(match=RedisKeys(settings.topic_prefix).result("*"), count=1000))


def test_a_50_mb_and_a_20_kb_result_survive_a_redis_wipe_and_a_hand_over(topics: Settings) -> None:
    sizes = [20_000, 50_000_000]
    tool = Blob()
    dead = Journal(topics, producer_id=f"dead-{uuid.uuid4().hex[:6]}")
    run = dead.start_run("t", "fetcher", {})
    first = agent(run, tool, sizes)
    run_id = run.run_id
    dead.close()  # the instance is gone with the run unfinished
    committed = [e for e in events_of(read_committed(topics, timeout_s=60), run_id)
                 if e.type is EventType.TOOL_CALL_COMMITTED]
    refs = [e.payload["result_ref"] for e in committed]
    assert [e.payload["result_json"] for e in committed] == [None, None]
    assert all(ref.startswith("kafka:") for ref in refs)
    assert PayloadRef.parse(refs[1]).chunks == n_chunks(first[1], topics.payload_chunk_bytes)
    assert result_keys(topics) == []  # a write does not cache

    redis_client.client(topics).flushdb()  # Redis is disposable: every lease, plan, projection and cached result
    project(topics)  # … and the projector rebuilds the runs' state from the journal (not the results: not needed)
    assert result_keys(topics) == []

    live = Journal(topics, producer_id=f"live-{uuid.uuid4().hex[:6]}")
    with live:
        outcome = _recover_stale(topics)
        assert outcome["action"] == "resumed" and outcome["calls"] == {"COMMITTED": 2}
        assert live.claim_assignment(timeout_s=10) == run_id
        resumed = live.resume(run_id)
        again = agent(resumed, tool, sizes)
        resumed.succeed()
    assert tool.runs == sizes, "no tool runs again on resume"
    assert again == first  # byte-identical: the canonical JSON of each is checked against its digest on read
    assert [len(r["blob"]) for r in again] == sizes
    assert result_keys(topics)  # cached again after the read from Kafka


def _recover_stale(topics: Settings) -> dict[str, Any]:
    """One ``recover --stale`` pass (a fresh job, closed after); the one run it acted on, as JSON values."""
    job = RecoveryJob(topics)
    try:
        (outcome,) = job.recover(stale=True).as_dict()["runs"]
    finally:
        job.close()
    return dict(outcome)


def test_an_aborted_payload_transaction_is_never_read(topics: Settings, service_env: dict[str, str]) -> None:
    """SIGKILL after the result's records are produced, before their commit: recovery fences the dead instance
    (its transaction aborts); the call is OUTCOME_UNKNOWN, never COMMITTED from the orphan records."""
    run_id, producer = f"crash-{uuid.uuid4().hex[:8]}", f"child-{uuid.uuid4().hex[:6]}"
    env = {**service_env, "RJ_FAILPOINTS": "producers.result.before_payload_commit=1"}
    child = subprocess.run([sys.executable, "-m", "tests.support.payload_child", run_id, producer, "3000000"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    partition = partition_for(run_id, topics.partitions)
    orphans = [k for k, _v, _o in partition_records(topics, partition, committed=False) if of_run(k, run_id)]
    assert len(orphans) == -(-3_000_012 // topics.payload_chunk_bytes)  # produced (read_uncommitted sees them)

    r = redis_client.client(topics)
    deadline = time.monotonic() + 15
    while r.exists(RedisKeys(topics.topic_prefix).lease(producer)) and time.monotonic() < deadline:
        time.sleep(0.1)
    live = Journal(topics, producer_id=f"live-{uuid.uuid4().hex[:6]}")
    with live:
        outcome = _recover_stale(topics)
        assert outcome["action"] == "resumed" and outcome["calls"] == {"OUTCOME_UNKNOWN": 1}
        assert [k for k, _v, _o in partition_records(topics, partition) if of_run(k, run_id)] == []  # aborted
        assert live.claim_assignment(timeout_s=10) == run_id
        resumed = live.resume(run_id)

        class NoReconcile:
            name, side_effect, timeout_ms = "big", True, 500

            def __call__(self, args: dict[str, Any], key: str) -> Any:
                raise AssertionError("an unknown outcome is never run blindly")

        with pytest.raises(OutcomeUnknownError):
            resumed.call(NoReconcile(), {})
    assert int(r.get(f"{topics.topic_prefix}:witness:{run_id}") or 0) == 1
    types = [e.type for e in events_of(read_committed(topics), run_id)]
    assert EventType.TOOL_CALL_INTENDED in types and EventType.TOOL_CALL_COMMITTED not in types


@pytest.fixture
def journal(topics: Settings) -> Iterator[Journal]:
    with Journal(topics, producer_id=f"p-{uuid.uuid4().hex[:8]}", inline_result_bytes=1024) as j:
        yield j


def test_a_wrong_digest_or_a_missing_record_is_a_named_error(journal: Journal, topics: Settings) -> None:
    settings = topics.model_copy(update={"payload_chunk_bytes": 4096})
    with Journal(settings, producer_id=f"p-{uuid.uuid4().hex[:8]}", inline_result_bytes=1024) as small:
        run = small.start_run("t", "fetcher", {})
        value = agent(run, Blob(), [20_000])[0]
        ref = next(e.payload["result_ref"] for e in events_of(read_committed(topics), run.run_id)
                   if e.type is EventType.TOOL_CALL_COMMITTED)
    where = PayloadRef.parse(ref)
    assert where.chunks == n_chunks(value, 4096) > 1 and where.last - where.first >= where.chunks - 1
    uncached = ResultStore(redis_client.client(topics), "nocache-" + topics.topic_prefix, topics, read_timeout_s=20)
    assert json.loads(uncached.get(ref) or "null") == value  # straight from Kafka (then cached by digest)
    assert uncached.read_payload(where) == canonical_json(value)
    wrong = PayloadRef(where.partition, where.first, where.last, where.chunks, where.payload_id, "0" * 64)
    with pytest.raises(ResultCorruptError, match="reassemble to digest"):
        uncached.read_payload(wrong)
    fewer = PayloadRef(where.partition, where.first, where.last, where.chunks - 1, where.payload_id, where.digest)
    with pytest.raises(ResultCorruptError, match="beyond"):
        uncached.read_payload(fewer)
    short = PayloadRef(where.partition, where.first, where.last - 1, where.chunks, where.payload_id, where.digest)
    with pytest.raises(ResultUnavailableError, match="missing"):
        uncached.read_payload(short)
    other = PayloadRef(where.partition, where.first, where.last, where.chunks, uuid.uuid4().hex, where.digest)
    with pytest.raises(ResultUnavailableError, match="missing"):
        uncached.read_payload(other)


def test_erase_tombstones_every_record_of_the_run(topics: Settings) -> None:
    settings = topics.model_copy(update={"payload_chunk_bytes": 4096})
    with Journal(settings, producer_id=f"p-{uuid.uuid4().hex[:8]}", inline_result_bytes=1024) as journal:
        run = journal.start_run("t", "fetcher", {})
        values = agent(run, Blob(), [20_000, 9_000])
        ref = journal.publish_payload(run.run_id, json.dumps("an orphan nothing references" * 500))
        run.succeed()
    partition = partition_for(run.run_id, topics.partitions)
    keys = {k for k, _v, _o in partition_records(topics, partition) if of_run(k, run.run_id)}
    assert len(keys) == sum(n_chunks(v, 4096) for v in values) + PayloadRef.parse(ref).chunks
    r, rkeys = redis_client.client(topics), RedisKeys(topics.topic_prefix)
    store = ResultStore(r, topics.topic_prefix, settings=settings)
    commits = [e.payload for e in events_of(read_committed(topics), run.run_id)
               if e.type is EventType.TOOL_CALL_COMMITTED]
    for payload in commits:  # a read fills the Redis cache with the text
        assert store.get(payload["result_ref"]) is not None
    cached = [rkeys.result(p["result_digest"]) for p in commits]
    assert r.exists(*cached) == len(cached) == 2
    report = erase_run(topics, run.run_id, erase_memory=False, force=True)
    assert r.exists(*cached) == 0  # the cached copies of its results go with the run (a break-it finding)
    assert report.payload_records_seen == len(keys) and report.payload_tombstones == len(keys)
    latest: dict[bytes, bytes | None] = {}
    for key, value, _offset in partition_records(topics, partition):
        if of_run(key, run.run_id):
            latest[key] = value
    assert set(latest) == keys and set(latest.values()) == {None}  # a tombstone is the latest record of each key
    # (the values stay in the log until the cleaner compacts the partition, as the events' do: a reader by offset
    # finds them gone only then — test_a_wrong_digest_or_a_missing_record_is_a_named_error covers that read)
    assert erase_run(topics, run.run_id, erase_memory=False, force=True).payload_tombstones == 0  # idempotent


def test_a_result_over_max_result_bytes_is_a_named_error_and_nothing_of_it_is_written(topics: Settings) -> None:
    settings = topics.model_copy(update={"max_result_bytes": 10_000})
    tool = Blob()
    with Journal(settings, producer_id=f"p-{uuid.uuid4().hex[:8]}", inline_result_bytes=1024) as journal:
        run = journal.start_run("t", "fetcher", {})
        with pytest.raises(ResultTooLargeError, match="max_result_bytes") as raised:
            agent(run, tool, [20_000])
        assert raised.value.limit == 10_000 and raised.value.size > 10_000
        with pytest.raises(ArgumentsTooLargeError, match="max_result_bytes"):
            run.call(tool, {"size": 1, "pad": "p" * 10_001})
        run_id = run.run_id
        journal.flush()
    assert tool.runs == [20_000]  # the effect ran once; the oversized arguments never reached the tool
    events = events_of(read_committed(topics), run_id)
    committed = [e for e in events if e.type is EventType.TOOL_CALL_COMMITTED]
    assert len(committed) == 1 and committed[0].payload["result_ref"] is None  # recorded without a result
    assert committed[0].payload["result_json"] is None
    assert sum(e.type is EventType.TOOL_CALL_INTENDED for e in events) == 1  # no intent for the refused args
    partition = partition_for(run_id, topics.partitions)
    assert [k for k, _v, _o in partition_records(topics, partition) if of_run(k, run_id)] == []

    # on resume the call raises, and does not run again
    with Journal(settings, producer_id=f"q-{uuid.uuid4().hex[:8]}") as live:
        job = RecoveryJob(settings)
        job.recover(stale=True)
        job.close()
        if live.claim_assignment(timeout_s=10) == run_id:
            with pytest.raises(UnrecordableResultError):
                agent(live.resume(run_id), tool, [20_000])
    assert tool.runs == [20_000]


def test_payload_settings_are_validated() -> None:
    with pytest.raises(ConfigError, match="RUNJOURNAL_PAYLOAD_CHUNK_BYTES"):
        Settings.load(payload_chunk_bytes=10)
    with pytest.raises(ConfigError, match="RUNJOURNAL_PAYLOAD_CHUNK_BYTES"):  # over the broker's default record size
        Settings.load(payload_chunk_bytes=4 * 1024 * 1024)
    with pytest.raises(ConfigError, match="RUNJOURNAL_MAX_RESULT_BYTES"):
        Settings.load(max_result_bytes=0)
    defaults = Settings.load()
    assert defaults.payload_chunk_bytes == 512 * 1024 and defaults.max_result_bytes == 256 * 1024 * 1024
    assert defaults.payloads_topic in defaults.all_topics


def test_replay_reads_a_large_result_from_the_payloads_topic_after_a_redis_wipe(journal: Journal,
                                                                                  topics: Settings) -> None:
    from runjournal.consumers.ops.replay import replay_run

    tool = Blob()
    run = journal.start_run("t", "fetcher", {})
    live = agent(run, tool, [20_000])
    run.succeed()
    journal.flush()
    redis_client.client(topics).flushdb()
    replayed = replay_run(topics, run.run_id, lambda handle: agent(handle, tool, [20_000]))
    assert [c.result for c in replayed.calls] == live and replayed.stopped is None
    assert tool.runs == [20_000]  # replay never calls a tool


def test_the_asyncio_api_writes_and_reads_back_a_large_result(topics: Settings) -> None:
    """``AsyncRunHandle.call`` records a large result on the payloads topic; a resumed async run (Redis cache wiped)
    gets it back from there without running the tool."""
    import asyncio

    from runjournal.producers.aio import AsyncJournal

    ran: list[str] = []

    class AsyncBlob:
        name, side_effect, timeout_ms = "fetch_blob", True, 1000

        async def __call__(self, args: dict[str, Any], key: str) -> Any:
            ran.append(key)
            return {"blob": blob(30_000)}

    async def scenario() -> tuple[Any, Any]:
        journal = await AsyncJournal.open(topics, producer_id=f"aio-{uuid.uuid4().hex[:6]}", inline_result_bytes=1024)
        try:
            run = await journal.start_run("t", "fetcher", {})
            first = await run.call(AsyncBlob(), {})
        finally:
            await journal.close()
        for key in result_keys(topics):
            redis_client.client(topics).delete(key)
        job = RecoveryJob(topics)
        journal = await AsyncJournal.open(topics, producer_id=f"aio-{uuid.uuid4().hex[:6]}")
        try:
            job.recover(stale=True)
            job.close()
            assert journal.sync.claim_assignment(timeout_s=10) == run.run_id
            resumed = await journal.resume(run.run_id)
            again = await resumed.call(AsyncBlob(), {})
            await resumed.succeed()
        finally:
            await journal.close()
        return first, again

    first, again = asyncio.run(scenario())
    assert first == again == {"blob": blob(30_000)} and len(ran) == 1

"""Journal against the real broker and Redis: ordering, partitioning, durability, leases, limits."""

from __future__ import annotations

import json
import random
import threading
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from runjournal.core import kafka, redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.producers import (
    Journal,
    RunClosedError,
    TopicNotFoundError,
    canonical_json,
    digest,
    partition_for,
    transactional_id,
    use_traceparent,
)
from runjournal.schemas import EventCodec, EventTooLargeError, EventType
from tests.support.readback import events_of, read_committed

pytestmark = pytest.mark.integration

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Echo:
    """A side-effecting tool that counts its executions and echoes its args."""

    name = "echo"
    side_effect = True
    timeout_ms = 500

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, Any], str]] = []
        self._lock = threading.Lock()

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        with self._lock:
            self.calls.append((args, idempotency_key))
        return {"echo": args}


@pytest.fixture
def journal(topics: Settings) -> Iterator[Journal]:
    with Journal(topics, producer_id=f"p-{uuid.uuid4().hex[:8]}") as j:
        yield j


def test_run_events_are_keyed_partitioned_and_contiguous(journal: Journal, topics: Settings) -> None:
    tool = Echo()
    run = journal.start_run("tenant-a", "agent-x", {"q": "hi"}, user_id="u1")
    with run.node("plan"):
        run.message("user", "hello")
        assert run.call(tool, {"n": 1}) == {"echo": {"n": 1}}
    run.correction("tone", "be brief")
    run.succeed({"answer": 42})
    with pytest.raises(RunClosedError):
        run.message("assistant", "late")
    events = events_of(read_committed(topics), run.run_id)
    assert [e.type for e in events] == [
        EventType.RUN_STARTED,
        EventType.NODE_STARTED,
        EventType.MESSAGE,
        EventType.TOOL_CALL_INTENDED,
        EventType.TOOL_CALL_COMMITTED,
        EventType.NODE_SUCCEEDED,
        EventType.USER_CORRECTION,
        EventType.RUN_SUCCEEDED,
    ]
    assert [e.seq for e in events] == list(range(1, 9))
    assert {e.epoch for e in events} == {1} and {e.producer_id for e in events} == {journal.producer_id}
    assert events[0].payload["input_json"] == '{"q":"hi"}' and events[0].payload["user_id"] == "u1"
    intended, committed = events[3].payload, events[4].payload
    assert intended["idempotency_key"] == committed["idempotency_key"] == tool.calls[0][1]
    assert intended["args_digest"] == digest(canonical_json({"n": 1})) and intended["attempt"] == 1
    assert committed["result_json"] == '{"echo":{"n":1}}'
    assert committed["result_digest"] == digest('{"echo":{"n":1}}')
    assert events[3].node_id == "plan" and events[-1].payload["output_json"] == '{"answer":42}'


@pytest.mark.slow
def test_eight_threads_two_hundred_interleaved_runs_stay_ordered_per_partition(
    journal: Journal, topics: Settings
) -> None:
    tool = Echo()
    run_ids = [f"run-{i:03d}-{uuid.uuid4().hex[:6]}" for i in range(200)]
    errors: list[BaseException] = []

    def steps(run: Any, rng: random.Random) -> Iterator[None]:
        for node in ("fetch", "act"):
            with run.node(node):
                yield
                run.message("assistant", f"{node} {rng.random()}")
                yield
                run.call(tool, {"run": run.run_id, "node": node})
                yield
        run.succeed()

    def worker(ids: list[str], seed: int) -> None:
        rng = random.Random(seed)
        try:
            for batch in (ids[i : i + 5] for i in range(0, len(ids), 5)):  # 5 runs interleaved per thread
                live = [steps(journal.start_run("tenant-a", "agent", {"i": r}, run_id=r), rng) for r in batch]
                while live:
                    gen = rng.choice(live)
                    try:
                        next(gen)
                    except StopIteration:
                        live.remove(gen)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(run_ids[i::8], i)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    by_run: dict[str, list[Any]] = defaultdict(list)
    for rec in read_committed(topics, timeout_s=30):
        by_run[rec.event.run_id].append(rec)
    assert sorted(by_run) == sorted(run_ids)
    for run_id, recs in by_run.items():
        assert {r.partition for r in recs} == {partition_for(run_id, topics.partitions)}
        assert [r.event.seq for r in recs] == list(range(1, len(recs) + 1)) == [r.event.seq for r in recs]
        assert [r.key for r in recs] == [f"{run_id}:1:{r.event.seq}" for r in recs]
        assert len(recs) == 12 and recs[-1].event.type == EventType.RUN_SUCCEEDED
    assert len(tool.calls) == 400
    assert len({k for _, k in tool.calls}) == 400  # every call its own idempotency key


def test_nested_and_repeated_nodes_get_deterministic_paths(journal: Journal, topics: Settings) -> None:
    run = journal.start_run("tenant-a", "agent", {})
    seen = []
    with run.node("trip") as trip:
        for _ in range(2):
            with run.node("book") as p:
                seen.append(p)
                with run.node("pay") as q:
                    seen.append(q)
    with pytest.raises(ZeroDivisionError), run.node("trip"):
        1 / 0  # noqa: B018
    run.fail("gave up")
    assert trip == "trip" and seen == ["trip/book", "trip/book/pay", "trip/book#2", "trip/book#2/pay"]
    events = events_of(read_committed(topics), run.run_id)
    failed = [e for e in events if e.type == EventType.NODE_FAILED]
    assert [(e.payload["node_path"], e.payload["error"]) for e in failed] == [
        ("trip#2", "ZeroDivisionError: division by zero")
    ]
    assert events[-1].type == EventType.RUN_FAILED and events[-1].payload["error"] == "gave up"


def test_event_too_large_is_raised_before_anything_is_sent(topics: Settings) -> None:
    with Journal(topics, codec=EventCodec(max_event_bytes=2000, topic=topics.events_topic)) as journal:
        run = journal.start_run("tenant-a", "agent", {})
        with pytest.raises(EventTooLargeError):
            run.message("user", "x" * 5000)
        assert run.last_seq == 1  # the seq was not consumed
        run.message("user", "small")
        journal.flush()
    events = events_of(read_committed(topics), run.run_id)
    assert [(e.seq, e.type) for e in events] == [(1, EventType.RUN_STARTED), (2, EventType.MESSAGE)]


def test_large_result_goes_to_the_payloads_topic_by_reference(topics: Settings) -> None:
    class Big:
        name, side_effect, timeout_ms = "big", True, 100

        def __call__(self, args: dict[str, Any], key: str) -> Any:
            return {"blob": "y" * 20_000}

    with Journal(topics, inline_result_bytes=1024) as journal:
        run = journal.start_run("tenant-a", "agent", {})
        run.call(Big(), {})
        committed = events_of(read_committed(topics), run.run_id)[-1]
        ref = committed.payload["result_ref"]
        assert committed.payload["result_json"] is None and ref.startswith("kafka:")
        assert ref.endswith(":" + committed.payload["result_digest"])
        assert json.loads(journal.results.get(ref) or "null") == {"blob": "y" * 20_000}


def test_lease_heartbeats_with_ttl_and_is_deleted_on_close(topics: Settings) -> None:
    r = redis_client.client(topics, decode_responses=True)
    pid = f"lease-{uuid.uuid4().hex[:8]}"
    key, owned = RedisKeys(topics.topic_prefix).lease(pid), RedisKeys(topics.topic_prefix).owned(pid)
    journal = Journal(topics, producer_id=pid, lease_ttl_ms=900)
    try:
        value = json.loads(r.get(key) or "{}")
        assert value["producer_id"] == pid and value["transactional_id"] == transactional_id(topics, pid)
        assert {"pid", "host", "started_at_ms"} <= value.keys()
        assert 0 < r.pttl(key) <= 900
        run = journal.start_run("tenant-a", "agent", {})
        assert r.smembers(owned) == {run.run_id}
        threading.Event().wait(1.5)  # > ttl: only the heartbeat keeps it alive
        assert r.exists(key) and 0 < r.pttl(key) <= 900
        run.succeed()
        assert r.smembers(owned) == set()
        unfinished = journal.start_run("tenant-a", "agent", {})
    finally:
        journal.close()
    assert not r.exists(key)
    assert r.smembers(owned) == {unfinished.run_id}  # left for the recovery job
    assert journal.stats["lease_lapses"] == 0


def test_traceparent_from_argument_or_context_goes_to_envelope_and_header(
    journal: Journal, topics: Settings
) -> None:
    explicit = journal.start_run("tenant-a", "agent", {}, traceparent=TRACEPARENT)
    implicit = journal.start_run("tenant-a", "agent", {})
    other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with use_traceparent(other):
        implicit.message("user", "traced")
    implicit.message("user", "untraced")
    journal.flush()
    records = read_committed(topics)
    mine = [r for r in records if r.event.run_id == explicit.run_id]
    assert mine[0].event.traceparent == TRACEPARENT and mine[0].headers["traceparent"] == TRACEPARENT.encode()
    theirs = [r for r in records if r.event.run_id == implicit.run_id]
    assert [r.event.traceparent for r in theirs] == [None, other, None]
    assert "traceparent" not in theirs[0].headers
    with pytest.raises(ValueError):
        journal.start_run("tenant-a", "agent", {}, traceparent="nope")


def test_emit_refuses_reserved_types_and_non_durable_durable_types(journal: Journal) -> None:
    run = journal.start_run("tenant-a", "agent", {})
    with pytest.raises(ValueError):
        run.emit(EventType.RUN_RESUMED, {})
    with pytest.raises(ValueError):
        run.emit(EventType.APPROVAL_GRANTED, {"call_id": "c", "approver": "a"}, durable=False)
    event = run.emit(EventType.APPROVAL_GRANTED, {"call_id": "c", "approver": "ann"})
    assert event.seq == 2 and run.last_seq == 2


def test_missing_topic_is_refused_and_a_reused_producer_id_is_a_new_incarnation(
    settings: Settings, topics: Settings
) -> None:
    r = redis_client.client(settings)
    other = settings.model_copy(update={"topic_prefix": f"missing{uuid.uuid4().hex[:8]}"})
    with pytest.raises(TopicNotFoundError):
        Journal(other, producer_id="lonely")
    assert not r.exists(RedisKeys(other.topic_prefix).lease("lonely"))  # released again
    admin = kafka.admin_client(other)
    assert other.events_topic not in admin.list_topics(timeout=10).topics  # the probe did not create it
    with Journal(topics, producer_id="twin") as first:
        # A second Journal under the same name is the name's next incarnation, a distinct instance: its own
        # lease, owned set and transactional id — it neither takes over nor fences the first.
        with Journal(topics, producer_id="twin") as second:
            assert (first.producer_id, second.producer_id) == ("twin", "twin#2")
            assert second.transactional_id != first.transactional_id and second.incarnation == 2
            second.start_run("tenant-a", "agent", {}).succeed()
        first.start_run("tenant-a", "agent", {}).succeed()  # the first was not fenced by the twin
    with pytest.raises(ValueError, match="#"):
        Journal(topics, producer_id="bad#name")


def test_on_acked_reports_every_committed_record_at_its_partition_and_offset(topics: Settings) -> None:
    """Issue 17: the broker's acknowledgements as a caller's witness (the demo's ack log) — every record of every
    committed transaction, with the partition and offset of its delivery report, exactly as the topic holds it.
    Only events: a large result's chunks on ``{prefix}.payloads`` have another topic's offsets (the fault campaign
    found them reported as events missing from the events topic)."""
    acked: list[tuple[str, int, int]] = []
    with Journal(topics, producer_id=f"p-{uuid.uuid4().hex[:8]}", on_acked=acked.extend,
                 inline_result_bytes=1024) as journal:
        for i in range(3):
            run = journal.start_run("tenant-a", "agent", {"i": i})
            run.message("user", "hello")
            assert run.call(Echo(), {"n": i, "pad": "p" * 2_000 * i}) == {"echo": {"n": i, "pad": "p" * 2_000 * i}}
            run.succeed({})
    records = read_committed(topics)
    assert sorted(acked) == sorted((r.key, r.partition, r.offset) for r in records)
    assert len(acked) == len({k for k, _, _ in acked}) == 3 * 5  # each record once (5 per run)

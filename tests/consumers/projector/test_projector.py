"""The projector against the real broker and Redis: equals a fold of the topic, DLQ, erase, gaps, rebuild."""

from __future__ import annotations

import random
import threading
import uuid

import pytest
from confluent_kafka import TopicPartition

from runjournal.consumers.ops.inspect import read_all_events
from runjournal.consumers.projector import ProjectionStore, Projector
from runjournal.core import kafka, redis_client
from runjournal.core.settings import Settings
from runjournal.model.reducer import RunStatus, fold, state_digest
from runjournal.schemas.keys import partition_for
from tests.support.workload import interleave, publish, run_events

pytestmark = pytest.mark.integration


def project(settings: Settings, **kw) -> Projector:  # noqa: ANN003
    projector = Projector(settings, **kw)
    projector.run(until_caught_up=True, idle_timeout_s=60)
    return projector


def topic_fold_digests(settings: Settings, run_ids: list[str]) -> dict[str, str | None]:
    """A fresh fold of each run's records read from the topic (the independent reference)."""
    by_run = read_all_events(settings)
    out = {}
    for run_id in run_ids:
        state = fold(by_run.get(run_id, []))
        out[run_id] = state_digest(state) if state is not None else None
    return out




def redis_digests(settings: Settings, run_ids: list[str]) -> dict[str, str | None]:
    store = ProjectionStore(redis_client.client(settings), settings.topic_prefix)
    out = {}
    for run_id in run_ids:
        state = store.get(partition_for(run_id, settings.partitions), run_id)
        out[run_id] = state_digest(state) if state is not None else None
    return out


def test_projection_equals_a_fold_of_the_topic(topics: Settings) -> None:
    rng = random.Random(7)
    runs = [run_events(f"run-{i}", calls=rng.randint(0, 3), finish=i % 3 != 0) for i in range(40)]
    publish(topics, interleave(runs, rng))
    projector = project(topics)
    assert projector.stats.events == sum(len(r) for r in runs)
    ids = [r[0].run_id for r in runs]
    assert redis_digests(topics, ids) == topic_fold_digests(topics, ids)
    store = projector.store
    done = store.get(partition_for("run-1", topics.partitions), "run-1")
    assert done.status == RunStatus.SUCCEEDED and done.last_seq == len(runs[1])
    # The group offset was committed (for lag tools): next offset = last handled + 1 == high watermark.
    c = kafka.consumer(topics, **{"group.id": projector.group_id})
    committed = c.committed([TopicPartition(topics.events_topic, p) for p in range(topics.partitions)], timeout=10)
    for tp in committed:
        _low, high = c.get_watermark_offsets(tp, timeout=10)
        assert tp.offset == high
    c.close()


def test_second_pass_changes_nothing(topics: Settings) -> None:
    runs = [run_events(f"r{i}") for i in range(10)]
    publish(topics, [e for r in runs for e in r])
    project(topics)
    ids = [f"r{i}" for i in range(10)]
    before = redis_digests(topics, ids)
    # A new group re-reads everything from the broker; Redis's offsets make it a no-op.
    second = project(topics, group_id=f"{topics.topic_prefix}.other")
    assert second.stats.events == 0
    assert redis_digests(topics, ids) == before


def test_undecodable_event_is_quarantined_and_blocks_only_its_run(topics: Settings) -> None:
    # Both runs share a partition, to show the partition itself is not blocked.
    good_id = next(f"good-{i}" for i in range(100) if partition_for(f"good-{i}", 3) == partition_for("bad-run", 3))
    good = run_events(good_id)
    bad = run_events("bad-run", finish=False)
    publish(topics, bad[:2] + [("bad-run:1:3", b"\xc3\x01garbage-not-avro")] + good)
    projector = project(topics)
    assert projector.stats.dead_lettered == 1
    p_bad = partition_for("bad-run", topics.partitions)
    blocked = projector.store.get(p_bad, "bad-run")
    assert blocked.status == RunStatus.BLOCKED and "offset" in blocked.blocked_reason
    assert projector.store.get(p_bad, good_id).status == RunStatus.SUCCEEDED
    c = kafka.consumer(topics, **{"group.id": f"dlq-{uuid.uuid4()}",
                  "auto.offset.reset": "earliest"})
    c.subscribe([topics.events_dlq_topic])
    msgs = []
    for _ in range(40):
        msgs += [m for m in c.consume(10, timeout=0.5) if not m.error()]
        if msgs:
            break
    c.close()
    assert len(msgs) == 1
    dead = msgs[0]
    headers = {k: v.decode() for k, v in dead.headers()}
    assert dead.value() == b"\xc3\x01garbage-not-avro" and dead.key() == b"bad-run:1:3"
    assert headers["rj.source.partition"] == str(p_bad) and headers["rj.source.offset"] == "2"
    assert headers["rj.error.type"] in {"CorruptEventError", "UnsupportedSchemaError"}


def test_empty_value_is_corrupt_not_a_tombstone_and_tombstones_erase(topics: Settings) -> None:
    publish(topics, run_events("erase-me") + run_events("keep-me"))
    project(topics)
    p = partition_for("erase-me", topics.partitions)
    store = ProjectionStore(redis_client.client(topics), topics.topic_prefix)
    assert store.get(p, "erase-me") is not None
    publish(topics, [(e.key, None) for e in run_events("erase-me")] + [("keep-me:1:99", b"")])
    projector = project(topics)
    assert store.get(p, "erase-me") is None and "erase-me" not in store.run_ids(p)
    assert projector.stats.erased == 1
    keep = store.get(partition_for("keep-me", 3), "keep-me")
    assert keep.status == RunStatus.BLOCKED  # b"" is corrupt, never a tombstone


def test_seq_gap_parks_only_that_run(topics: Settings) -> None:
    gappy = run_events("gappy")
    publish(topics, gappy[:2] + gappy[3:] + run_events("fine"))
    projector = project(topics)
    state = projector.store.get(partition_for("gappy", 3), "gappy")
    assert (state.status, state.gap_expected_seq, state.gap_seen_seq) == (RunStatus.GAP, 3, 4), (
        state.to_json(), projector.stats.as_dict())
    assert projector.store.get(partition_for("fine", 3), "fine").status == RunStatus.SUCCEEDED
    assert "gappy" in projector.stats.parked_runs


def test_wipe_and_rebuild_gives_identical_states(topics: Settings) -> None:
    rng = random.Random(3)
    runs = [run_events(f"w{i}", calls=rng.randint(0, 4)) for i in range(30)]
    publish(topics, interleave(runs, rng))
    first = project(topics)
    ids = [r[0].run_id for r in runs]
    before = redis_digests(topics, ids)
    assert first.store.wipe() > 0
    assert set(redis_digests(topics, ids).values()) == {None}
    project(topics)  # same group: its committed offsets are ignored, Redis's (none) rule
    assert redis_digests(topics, ids) == before


def test_script_flush_midstream_reloads_and_applies_once(topics: Settings) -> None:
    runs = [run_events(f"n{i}") for i in range(6)]
    publish(topics, [e for r in runs[:3] for e in r])
    projector = Projector(topics)
    stop = threading.Event()
    worker = threading.Thread(target=projector.run, kwargs={"stop": stop})
    worker.start()
    try:
        client = redis_client.client(topics)
        for _ in range(100):
            if ProjectionStore(client, topics.topic_prefix).get(partition_for("n2", 3), "n2"):
                break
            threading.Event().wait(0.1)
        client.script_flush()  # what a Redis restart does to the script cache: next EVALSHA is NOSCRIPT
        publish(topics, [e for r in runs[3:] for e in r])
        for _ in range(100):
            if all(ProjectionStore(client, topics.topic_prefix).get(partition_for(f"n{i}", 3), f"n{i}")
                   for i in range(6)):
                break
            threading.Event().wait(0.1)
    finally:
        stop.set()
        worker.join(30)
    ids = [f"n{i}" for i in range(6)]
    assert redis_digests(topics, ids) == topic_fold_digests(topics, ids)
    assert projector.stats.events == sum(len(r) for r in runs)

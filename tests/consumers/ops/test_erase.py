"""``runjournal erase``: tombstones for every key of the run, its Redis state gone (and never rebuilt by a
projector), its memory points gone; every other run untouched. Real broker, Redis and local Qdrant."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from runjournal.adapters._checkpoints import FrameworkRecordStore, Record
from runjournal.consumers.memory import ItemKind, MemoryItem, Provenance, QdrantMemoryStore, Scope
from runjournal.consumers.ops.erase import RunStillLiveError, erase_run
from runjournal.core import kafka, redis_client
from runjournal.core.checkpoint_records import KINDS, PART, SEP, part_field
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.model.reducer import state_digest
from runjournal.producers import Journal
from runjournal.producers.approvals import ApprovalInbox
from runjournal.schemas.keys import partition_for
from runjournal.testing import HashingEmbedder
from tests.support.provider import project
from tests.support.workload import publish, run_events

pytestmark = [pytest.mark.integration]


def topic_records(settings: Settings, topic: str | None = None) -> list[tuple[str, bytes | None]]:
    """Every record of ``topic`` (default the events topic) as ``(key, value)``, partition by partition, with a
    plain ``read_committed`` consumer."""
    topic = topic or settings.events_topic
    consumer = kafka.consumer(settings, **{"group.id": f"check-{uuid.uuid4()}",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    out: list[tuple[str, bytes | None]] = []
    try:
        for p in range(settings.partitions):
            tp = TopicPartition(topic, p)
            end = consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1]
            if end == 0:
                continue
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING)])
            while consumer.position([tp])[0].offset < end:
                for msg in consumer.consume(1000, timeout=1):
                    if not msg.error():
                        out.append((msg.key().decode(), msg.value()))
    finally:
        consumer.close()
    return out


def memory_item(settings: Settings, run_id: str, text: str) -> MemoryItem:
    return MemoryItem(text=text, kind=ItemKind.FACT, subject=None, scope=Scope("acme", "u1"),
                      created_at=datetime.now(UTC),
                      provenance=Provenance(run_id=run_id, event_id=str(uuid.uuid4()), event_type="MESSAGE",
                                            topic=settings.events_topic, partition=0, offset=0, schema="test",
                                            extractor="test", event_key=f"{run_id}:1:7"))


def memory_runs(settings: Settings) -> list[str]:
    with QdrantMemoryStore.open(settings, HashingEmbedder()) as store:
        return sorted(h.provenance["run_id"] for h in store.search(Scope("acme"), "booking email", limit=50))


def test_erase_a_finished_run(topics: Settings) -> None:
    gone, kept = "erase-me", "keep-me"
    events = {run_id: run_events(run_id, calls=2) for run_id in (gone, kept)}
    publish(topics, events[gone] + events[kept])
    r, keys = redis_client.client(topics), RedisKeys(topics.topic_prefix)
    inbox = ApprovalInbox(r, topics.topic_prefix)
    for run_id in (gone, kept):
        r.set(keys.plan(run_id), "{}")
        inbox.requested(run_id, "c0")
        inbox.decide(run_id, "c0", granted=True, approver="alice")
    with QdrantMemoryStore.open(topics, HashingEmbedder()) as store:
        store.upsert([memory_item(topics, gone, "the booking email was sent"),
                      memory_item(topics, gone, "user prefers email"),
                      memory_item(topics, kept, "the booking was confirmed by email")])
    store = project(topics)
    p_gone, p_kept = (partition_for(run_id, topics.partitions) for run_id in (gone, kept))
    kept_before = state_digest(store.get(p_kept, kept))
    assert store.get(p_gone, gone) is not None

    report = erase_run(topics, gone, embedder=HashingEmbedder())

    assert report.records_seen == report.tombstones == len(events[gone])
    assert report.redis_keys_deleted == 3  # projected state, recovery plan, approvals inbox
    assert report.redis_entries_removed == 3  # the partition's runs set and runs index, the pending approvals set
    assert report.memory_points_deleted == 2 and report.memory_note is None
    records = topic_records(topics)
    latest: dict[str, bytes | None] = dict(records)
    assert {k for k in latest if k.startswith(f"{gone}:")} == {e.key for e in events[gone]}
    assert all(latest[e.key] is None for e in events[gone]), "every key of the run ends in a tombstone"
    assert all(v is not None for k, v in records if k.startswith(f"{kept}:")), "no other run is touched"
    assert r.get(keys.plan(gone)) is None and inbox.decision(gone, "c0") is None
    assert inbox.pending() == [] and inbox.decision(kept, "c0") is not None  # kept's request was decided
    assert memory_runs(topics) == [kept]

    # the projector, incrementally and rebuilt from the topic, leaves no state for the erased run
    store = project(topics)
    assert store.get(p_gone, gone) is None and gone not in store.run_ids(p_gone)
    store.wipe()
    store = project(topics)
    assert store.get(p_gone, gone) is None and gone not in store.run_ids(p_gone)
    assert state_digest(store.get(p_kept, kept)) == kept_before

    again = erase_run(topics, gone, embedder=HashingEmbedder())
    assert again.tombstones == 0 and again.redis_keys_deleted == 0 and again.memory_points_deleted == 0


def test_erase_cli_with_memory_held_by_a_running_extractor(topics: Settings, service_env: dict[str, str]) -> None:
    """The local Qdrant directory locked by another process (a running extractor): erase still tombstones
    and cleans Redis, reports that the extractor erases the items from the tombstones, and exits 0."""
    run_id = "erase-cli"
    events = run_events(run_id, calls=1)
    publish(topics, events)
    project(topics)
    with QdrantMemoryStore.open(topics, HashingEmbedder()) as held:  # holds the directory's lock
        held.upsert([memory_item(topics, run_id, "a note")])
        done = subprocess.run([sys.executable, "-m", "runjournal", "erase", run_id, "--yes", "--json"],
                              env=service_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["tombstones"] == len(events) and out["redis_keys_deleted"] == 1
    assert out["memory_points_deleted"] is None and "memory extractor" in out["memory_note"]
    refused = subprocess.run([sys.executable, "-m", "runjournal", "erase", "never-was", "--yes"], env=service_env,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "never held run never-was" in refused.stderr
    steps = [line for line in refused.stderr.splitlines() if line.startswith("… ")]  # issue 35: progress, each step
    assert steps[0].startswith("… reading partition") and any("tombstone(s)" in s for s in steps), refused.stderr
    assert "… " not in done.stdout and "… " not in done.stderr  # --json: stdout is pure JSON, no progress lines


def test_erase_refuses_a_live_run(topics: Settings) -> None:
    run_id = "live-1"
    publish(topics, run_events(run_id, calls=1, finish=False))
    project(topics)
    r = redis_client.client(topics)
    r.set(RedisKeys(topics.topic_prefix).lease("agent-1"), "x", px=30_000)  # run_events' writer holds a lease
    with pytest.raises(RunStillLiveError, match="live lease"):
        erase_run(topics, run_id, erase_memory=False)
    assert all(v is not None for _k, v in topic_records(topics))
    assert erase_run(topics, run_id, erase_memory=False, force=True).tombstones == 6


def test_erase_removes_the_runs_framework_checkpoints(topics: Settings) -> None:
    """A LangGraph / Agents SDK run keeps framework records on ``{prefix}.checkpoints`` and their projection in
    Redis (``rj:{P:t:<run>}:lg:<kind>``, the thread list): erase tombstones every record key of the run and
    deletes those keys; another thread's records and keys are untouched. A record written in parts (past one
    Kafka record) loses every part too."""
    gone, kept = "lg-erase-me", "lg-keep-me"
    records = [Record("cp", f"{SEP}cp-1", '{"v": 1}'), Record("cp", f"{SEP}cp-2", '{"v": 2}'),
               Record("blob", f"{SEP}messages{SEP}1", '"hi"'), Record("w", f"{SEP}cp-2{SEP}task{SEP}0", '"w"'),
               Record("item", "000000000000", '{"role": "user"}'), Record("state", "paused", '{"s": 1}'),
               Record("blob", f"{SEP}history{SEP}2", '"' + "y" * 200 + '"')]
    big = json.dumps({"kind": "blob", "field": records[-1].field, "data": records[-1].data}).encode()  # as written
    parts = {f"{PART}{SEP}{part_field(i, 'blob', records[-1].field)}" for i in range(-(-len(big) // 128))}
    assert len(parts) == 3
    with Journal(topics, producer_id="erase-lg") as journal:
        store = FrameworkRecordStore(journal)
        store.part_bytes = 128  # every other record is smaller
        for run_id in (gone, kept):
            handle = journal.start_run("acme", "lg", {"thread_id": run_id}, run_id=run_id)
            store.write(run_id, records)
            store.write(run_id, [Record("cp", f"{SEP}cp-1", None)])  # a tombstone already on the topic
            handle.succeed({"answer": "done"})
    r, keys = redis_client.client(topics), RedisKeys(topics.topic_prefix)
    assert r.exists(*(keys.checkpoint(gone, kind) for kind in KINDS)) == len(KINDS)
    project(topics)

    report = erase_run(topics, gone, erase_memory=False)

    assert r.exists(*(keys.checkpoint(gone, kind) for kind in KINDS)) == 0
    assert not r.sismember(keys.checkpoint_threads(), gone) and r.sismember(keys.checkpoint_threads(), kept)
    assert r.exists(*(keys.checkpoint(kept, kind) for kind in KINDS)) == len(KINDS)
    latest = dict(topic_records(topics, topics.checkpoints_topic))
    assert {k for k in latest if k.startswith(gone + SEP)} == {f"{gone}{SEP}{rec.kind}{SEP}{rec.field}"
                                                              for rec in records} | {f"{gone}{SEP}{p}" for p in parts}
    assert all(v is None for k, v in latest.items() if k.startswith(gone + SEP)), "every record key tombstoned"
    assert sum(1 for k, v in latest.items() if k.startswith(kept + SEP) and v is not None) == \
        len(records) - 1 + len(parts)
    assert report.checkpoint_records_seen == len(records) + 1 + len(parts)
    assert report.checkpoint_tombstones == len(records) - 1 + len(parts)  # cp-1 was tombstoned before

    again = erase_run(topics, gone, erase_memory=False)
    assert again.checkpoint_tombstones == 0 and again.redis_keys_deleted == 0

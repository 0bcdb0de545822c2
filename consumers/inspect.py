"""Read one run: its projected state (Redis) and its timeline (the run's records in its partition)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from consumers.projector.store import ProjectionStore
from producers.partitioner import partition_for
from runjournal.settings import Settings
from schemas import codec_from_settings
from schemas.errors import SchemaError

__all__ = ["inspect_run", "read_run_events"]


def _partition_count(settings: Settings, consumer: Consumer) -> int:
    meta = consumer.list_topics(settings.events_topic, timeout=10)
    return len(meta.topics[settings.events_topic].partitions)


def read_run_events(settings: Settings, run_id: str, *, until_offset: int | None = None) -> list[dict[str, Any]]:
    """The run's records in offset order: ``[{offset, key, seq, epoch, type, node_id, event | error}]``.

    Scans the run's partition from the beginning to its end offset (read_committed). Cost grows
    with the partition's size; fine for inspection and tests, not for a hot path.
    """
    codec = codec_from_settings(settings)
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": f"inspect-{uuid.uuid4()}",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        partition = partition_for(run_id, _partition_count(settings, consumer))
        tp = TopicPartition(settings.events_topic, partition)
        _low, high = consumer.get_watermark_offsets(tp, timeout=10)
        end = high if until_offset is None else min(high, until_offset + 1)
        consumer.assign([TopicPartition(settings.events_topic, partition, OFFSET_BEGINNING)])
        out: list[dict[str, Any]] = []
        prefix = f"{run_id}:".encode()
        idle = 0
        while idle < 6:  # control records (transaction markers) leave offsets no message reaches
            msgs = consumer.consume(1000, timeout=0.5)
            if not msgs:
                idle += 1
                if consumer.position([tp])[0].offset >= end:
                    break
                continue
            idle = 0
            for msg in msgs:
                if msg.error() or msg.offset() >= end:
                    continue
                if msg.key() and msg.key().startswith(prefix):
                    out.append(_row(codec, msg))
            if msgs[-1].offset() + 1 >= end:
                break
        return out
    finally:
        consumer.close()


def _row(codec: Any, msg: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"offset": msg.offset(), "key": msg.key().decode()}
    if msg.value() is None:
        return {**row, "type": "TOMBSTONE", "seq": None, "epoch": None}
    try:
        event = codec.decode(msg.value(), topic=msg.topic(), partition=msg.partition(), offset=msg.offset())
    except SchemaError as exc:
        return {**row, "type": "UNDECODABLE", "seq": None, "epoch": None, "error": str(exc)}
    return {**row, "seq": event.seq, "epoch": event.epoch, "type": str(event.type), "node_id": event.node_id,
            "event": event}


def inspect_run(settings: Settings, run_id: str, *, with_timeline: bool = True) -> dict[str, Any] | None:
    """``{"run_id", "partition", "state": {...}, "timeline": [...]}``, or None when the run has no state."""
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": f"inspect-{uuid.uuid4()}"})
    try:
        partition = partition_for(run_id, _partition_count(settings, consumer))
    finally:
        consumer.close()
    store = ProjectionStore(redis.Redis.from_url(settings.redis_url), settings.topic_prefix)
    state = store.get(partition, run_id)
    if state is None:
        return None
    report: dict[str, Any] = {"run_id": run_id, "partition": partition, "state": json.loads(state.to_json())}
    if with_timeline:
        report["timeline"] = [{k: v for k, v in row.items() if k != "event"}
                              for row in read_run_events(settings, run_id)]
    return report

"""Read one run: its projected state (Redis) and its timeline (the run's records in its partition)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from runjournal.consumers.projector.store import ProjectionStore
from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.producers.partitioner import partition_for
from runjournal.schemas import EventType, codec_from_settings
from runjournal.schemas.errors import RegistryError, SchemaError

__all__ = ["inspect_run", "read_run_events"]


def _partition_count(settings: Settings, consumer: Consumer) -> int:
    meta = consumer.list_topics(settings.events_topic, timeout=10)
    return len(meta.topics[settings.events_topic].partitions)


def read_run_events(settings: Settings, run_id: str, *, until_offset: int | None = None) -> list[dict[str, Any]]:
    """The run's records in offset order: ``[{offset, key, seq, epoch, type, node_id, event | error}]``.

    A type this reader does not know has ``type`` ``UNKNOWN`` and ``writer_type`` the writer's symbol.

    Raises:
        RegistryError: a writer schema's source (registry, ``{prefix}.schemas``) is unavailable; records
            the codec cannot read for content reasons come back as ``UNDECODABLE`` rows instead.

    Scans the run's partition from the beginning to its end offset (read_committed). Cost grows
    with the partition's size; fine for inspection and tests, not for a hot path.
    """
    codec = codec_from_settings(settings)
    consumer = kafka.consumer(settings, **{"group.id": f"inspect-{uuid.uuid4()}",
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
    except RegistryError:
        raise  # an outage of the schema source says nothing about the record: never shown as UNDECODABLE
    except SchemaError as exc:
        return {**row, "type": "UNDECODABLE", "seq": None, "epoch": None, "error": str(exc)}
    row.update(seq=event.seq, epoch=event.epoch, type=str(event.type), node_id=event.node_id, event=event)
    if event.type is EventType.UNKNOWN:  # a newer writer's type: recorded, named as the writer wrote it
        row["writer_type"] = event.payload.get("type")
    return row


def inspect_run(settings: Settings, run_id: str, *, with_timeline: bool = True) -> dict[str, Any] | None:
    """``{"run_id", "partition", "state": {...}, "timeline": [...]}``, or None when the run has no state."""
    consumer = kafka.consumer(settings, **{"group.id": f"inspect-{uuid.uuid4()}"})
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


def read_all_events(settings: Settings, *, idle_limit: int = 20) -> dict[str, list[tuple[Any, int, int]]]:
    """Every decodable event of the events topic, per run, as ``(event, partition, offset)`` in offset order.

    Reads each partition from the beginning to the end offset seen at the start (read_committed).
    Undecodable records and tombstones are left out. For verification and tests — cost grows with history.
    """
    codec = codec_from_settings(settings)
    consumer = kafka.consumer(settings, **{"group.id": f"read-all-{uuid.uuid4()}",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        n = _partition_count(settings, consumer)
        tps = [TopicPartition(settings.events_topic, p) for p in range(n)]
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1] for tp in tps}
        consumer.assign([TopicPartition(settings.events_topic, p, OFFSET_BEGINNING) for p in range(n)])
        by_run: dict[str, list[tuple[Any, int, int]]] = {}
        todo = {p for p, end in ends.items() if end > 0}
        idle = 0
        while todo and idle < idle_limit:
            msgs = consumer.consume(2000, timeout=0.5)
            if not msgs:
                idle += 1
                for tp in consumer.position([TopicPartition(settings.events_topic, p) for p in todo]):
                    if tp.offset >= ends[tp.partition]:
                        todo.discard(tp.partition)
                continue
            idle = 0
            for m in msgs:
                if m.error() or m.offset() >= ends[m.partition()]:
                    continue
                if m.offset() + 1 >= ends[m.partition()]:
                    todo.discard(m.partition())
                if m.value() is None:
                    continue
                try:
                    ev = codec.decode(m.value(), topic=m.topic(), partition=m.partition(), offset=m.offset())
                except RegistryError:
                    raise
                except SchemaError:
                    continue
                by_run.setdefault(ev.run_id, []).append((ev, m.partition(), m.offset()))
        return by_run
    finally:
        consumer.close()

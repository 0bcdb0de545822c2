"""Read one run: its projected state (Redis) and its timeline (the run's records in its partition)."""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka import Message

from runjournal.consumers.projector.store import ProjectionStore
from runjournal.consumers.runtime.partitions import events_partition_count, range_consumer, read_ranges, watermarks
from runjournal.core import redis_client
from runjournal.core.ids import RUN_ID
from runjournal.core.settings import Settings
from runjournal.producers.encryption import ContentCrypto
from runjournal.schemas import EventType, codec_from_settings
from runjournal.schemas.errors import RegistryError, SchemaError
from runjournal.schemas.keys import partition_for

__all__ = ["inspect_run", "read_run_events"]


def read_run_events(settings: Settings, run_id: str, *, until_offset: int | None = None,
                    partition: int | None = None) -> list[dict[str, Any]]:
    """The run's records in offset order: ``[{offset, key, seq, epoch, type, node_id, event | error}]``.

    Scans the run's partition from its log start to its end offset (read_committed), deciding the end from
    positions (:func:`runjournal.consumers.runtime.partitions.read_ranges`). Cost grows with the partition's size;
    fine for inspection and tests, not for a hot path.

    Args:
        settings: the stack and topic prefix.
        run_id: the run.
        until_offset: read no further than this offset (inclusive); None: to the end.
        partition: the run's partition when the caller has it (``partition_for(run_id, count)`` with the events
            topic's count, checked against the journal's as :func:`events_partition_count` does); None: looked up
            here (one more metadata request).

    A type this reader does not know has ``type`` ``UNKNOWN`` and ``writer_type`` the writer's symbol.

    Raises:
        TopicNotFoundError: the events topic does not exist (``runjournal topics create``).
        TimeoutError: the partition could not be read to its end within 60 s.
        RegistryError: a writer schema's source (registry, ``{prefix}.schemas``) is unavailable; records
            the codec cannot read for content reasons come back as ``UNDECODABLE`` rows instead.
    """
    codec = codec_from_settings(settings)
    if partition is None:
        partition = partition_for(run_id, events_partition_count(settings))
    ((low, high),) = watermarks(settings, [partition]).values()
    end = high if until_offset is None else min(high, until_offset + 1)
    out: list[dict[str, Any]] = []
    prefix = f"{run_id}:".encode()

    def on_record(msg: Message) -> None:
        if msg.key() and msg.key().startswith(prefix):
            out.append(_row(codec, msg))

    consumer = range_consumer(settings, "inspect")
    try:
        if read_ranges(consumer, settings.events_topic, {partition: (low, end)}, on_record, timeout_s=60):
            raise TimeoutError(f"could not read partition {partition} of {settings.events_topic} to offset {end}")
    finally:
        consumer.close()
    return out


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
    """``{"run_id", "partition", "state": {...}, "timeline": [...]}``, or None when the run has no state. Encrypted
    content (decision 0059) is shown decrypted when this reader has its key, else as ``"encrypted"``.

    Raises:
        InvalidIdError: ``run_id`` is not text (``runjournal.core.ids`` ``check_lookup``: any id a run was started
            with is looked up, rules or not).
        TopicNotFoundError: the events topic does not exist (``runjournal topics create``).
    """
    RUN_ID.check_lookup(run_id)
    partition = partition_for(run_id, events_partition_count(settings))
    store = ProjectionStore(redis_client.client(settings), settings.topic_prefix)
    state = store.get(partition, run_id)
    if state is None:
        return None
    shown = ContentCrypto(settings, encrypt=False).reveal_state(json.loads(state.to_json()))  # decision 0059
    report: dict[str, Any] = {"run_id": run_id, "partition": partition, "state": shown}
    if with_timeline:
        report["timeline"] = [{k: v for k, v in row.items() if k != "event"}
                              for row in read_run_events(settings, run_id, partition=partition)]
    return report


def read_all_events(settings: Settings, *, timeout_s: float = 120.0) -> dict[str, list[tuple[Any, int, int]]]:
    """Every decodable event of the events topic, per run, as ``(event, partition, offset)`` in offset order.

    Reads each partition from its log start to the end offset seen at the start (read_committed).
    Undecodable records and tombstones are left out. For verification and tests — cost grows with history.

    Raises:
        TopicNotFoundError: the events topic does not exist.
        TimeoutError: some partition could not be read to its end within ``timeout_s`` seconds.
    """
    codec = codec_from_settings(settings)
    ranges = watermarks(settings, range(events_partition_count(settings)))
    by_run: dict[str, list[tuple[Any, int, int]]] = {}

    def on_record(m: Message) -> None:
        if m.value() is None:
            return
        try:
            ev = codec.decode(m.value(), topic=m.topic(), partition=m.partition(), offset=m.offset())
        except RegistryError:
            raise
        except SchemaError:
            return
        by_run.setdefault(ev.run_id, []).append((ev, m.partition(), m.offset()))

    consumer = range_consumer(settings, "read-all")
    try:
        left = read_ranges(consumer, settings.events_topic, ranges, on_record, timeout_s=timeout_s)
    finally:
        consumer.close()
    if left:
        raise TimeoutError(f"could not read partitions {sorted(left)} of {settings.events_topic} to their ends")
    return by_run

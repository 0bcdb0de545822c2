"""The events topic's partition count, a run's partition, and reading partitions to their end offsets.

Shared by replay, erase, approve/deny, inspect and the recovery job."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from runjournal.core import dependency_errors, kafka
from runjournal.core.settings import Settings
from runjournal.producers.errors import PartitionCountChangedError, TopicNotFoundError
from runjournal.schemas.keys import partition_for

__all__ = ["events_partition_count", "range_consumer", "read_ranges", "run_partition", "watermarks"]


def events_partition_count(settings: Settings, *, timeout_s: float = 10.0) -> int:
    """Partition count of ``settings.events_topic``, read from the broker's metadata.

    Args:
        settings: bootstrap servers and topic prefix.
        timeout_s: metadata request timeout, seconds (default 10).

    Returns:
        The count (fixed at topic creation; docs/design/protocol.md § Topic layout).

    Raises:
        TopicNotFoundError: the events topic does not exist.
        PartitionCountChangedError: the count is not the one the journal was created with (the topic identity
            stored in Redis; docs/design/protocol.md § Topic layout).
        KafkaException: the broker is unreachable.
    """
    consumer = kafka.consumer(settings, **{"group.id": f"meta-{uuid.uuid4()}",
                         "allow.auto.create.topics": False})
    try:
        meta = consumer.list_topics(settings.events_topic, timeout=timeout_s)
    finally:
        consumer.close()
    topic = meta.topics.get(settings.events_topic)
    if topic is None or topic.error is not None or not topic.partitions:
        raise TopicNotFoundError(f"topic {settings.events_topic} does not exist (run `runjournal topics create`)")
    count = len(topic.partitions)
    _check_journal_count(settings, count)
    return count


def _check_journal_count(settings: Settings, count: int) -> None:
    """Refuse a count that is not the one the journal was created with (the stored topic identity): every run
    would be looked for in the wrong partition. Best effort: with Redis unreachable the reader's own Redis use
    fails soon enough, and a reader of Kafka alone (inspect) goes on.

    Raises:
        PartitionCountChangedError: the count is not the journal's.
    """
    import json

    from runjournal.core import redis_client
    from runjournal.core.redis_keys import RedisKeys

    try:
        raw = redis_client.client(settings).get(RedisKeys(settings.topic_prefix).topic_identity())
        stored = int(json.loads(raw)["partitions"]) if raw else None
    except Exception:  # noqa: BLE001 - the guard only: Redis away or an unreadable identity decides nothing here
        return
    if stored is not None and stored != count:
        raise PartitionCountChangedError(topic=settings.events_topic, expected=stored, actual=count, at_start=True)


def run_partition(settings: Settings, run_id: str) -> int:
    """The partition holding every event of ``run_id``: murmur2(run_id) mod the topic's partition count.

    Raises:
        TopicNotFoundError: the events topic does not exist.
    """
    return partition_for(run_id, events_partition_count(settings))


def watermarks(settings: Settings, partitions: Iterable[int], *, timeout_s: float = 10.0) -> dict[int, tuple[int, int]]:
    """``(log start offset, high watermark)`` of each partition of the events topic (``read_uncommitted``).

    The high watermark, not the last stable offset: a record committed beyond another producer's
    open transaction is part of what a reader must reach (``runjournal.consumers.recovery.tail``).

    Raises:
        KafkaException: the broker did not answer within ``timeout_s`` seconds.
    """
    consumer = kafka.consumer(settings, **{"group.id": f"wm-{uuid.uuid4()}", "enable.auto.commit": False,
                                           "isolation.level": "read_uncommitted"})
    try:
        return {p: tuple(consumer.get_watermark_offsets(TopicPartition(settings.events_topic, p),  # type: ignore[misc]
                                                        timeout=timeout_s, cached=False)) for p in partitions}
    finally:
        consumer.close()


def range_consumer(settings: Settings, purpose: str, **props: Any) -> Consumer:
    """A group-less ``read_committed`` consumer for :func:`read_ranges` (partition EOF events on; a metadata request
    for one topic never creates it); ``props`` add librdkafka properties (a consumer that reads many ranges one
    after another passes a short ``fetch.wait.max.ms``: the broker answers a connection's requests in order, so a
    watermark request waits behind a fetch long-polling at the end of the last range)."""
    return kafka.consumer(settings, **{"group.id": f"{purpose}-{uuid.uuid4()}", "enable.auto.commit": False,
                                       "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                                       "enable.partition.eof": True, "allow.auto.create.topics": False, **props})


def read_ranges(consumer: Consumer, topic: str, ranges: Mapping[int, tuple[int, int]],
                on_record: Callable[[Message], bool | None], *, timeout_s: float = 30.0) -> set[int]:
    """Read each partition ``p`` from ``ranges[p][0]`` up to (not including) ``ranges[p][1]``; hand every data
    record to ``on_record`` in offset order. Returns the partitions NOT read to their end within ``timeout_s``.

    A partition is done when its *position* reaches its end offset, decided from positions, never from
    "a data record sits at end-1" or "a poll came back empty" (docs/design/protocol.md § Recovery job; issue 14 (a)):

    * a record at or beyond the end was delivered (a writer keeps appending: done);
    * a partition-EOF event or ``position()`` at or past the end (control markers and aborted records
      move the position without delivering anything; a compacted tail may hold no record at all);
    * the range is empty: start ≥ end (nothing written since), or the log start offset is past
      the start (truncated / compacted away: the read starts at the log start; when that is ≥ end, done).

    Each pass takes what the consumer holds (up to 1,000 records) or waits at most 0.2 s for the next one, returning as
    soon as it arrives: a small range is read in milliseconds, a large one in batches.

    A partition still short of its end (a transaction that began before the end offset and is still open)
    is waited for until ``timeout_s`` and then returned: the caller decides nothing from it, and the other
    partitions' results stand. ``on_record`` returning False gives its partition up (returned as well).

    Raises:
        KafkaException: a read error no waiting fixes (fatal, unauthorised, topic gone:
            ``runjournal.core.dependency_errors.kafka_stops``); any other read error is waited out like an open
            transaction.
    """
    todo = {p for p, (start, end) in ranges.items() if start < end}
    if not todo:
        return set()
    consumer.assign([TopicPartition(topic, p, max(0, ranges[p][0])) for p in sorted(todo)])
    deadline = time.monotonic() + timeout_s
    given_up: set[int] = set()

    def done(p: int) -> None:
        if p in todo:
            todo.discard(p)
            consumer.pause([TopicPartition(topic, p)])

    while todo and time.monotonic() < deadline:
        for msg in _next_batch(consumer):
            p, off, err = msg.partition(), msg.offset(), msg.error()
            if p not in todo:
                continue
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF and off >= ranges[p][1]:  # noqa: SLF001
                    done(p)
                elif err.code() != KafkaError._PARTITION_EOF and \
                        dependency_errors.kafka_stops(err, uses_group=False):  # noqa: SLF001
                    raise KafkaException(err)  # fatal, unauthorised, topic gone: no waiting fixes it
                continue
            if off >= ranges[p][1]:
                done(p)
                continue
            if on_record(msg) is False:  # the caller gives this partition up (e.g. a dependency stayed away)
                done(p)
                given_up.add(p)
            elif off + 1 >= ranges[p][1]:
                done(p)
        for tp in consumer.position([TopicPartition(topic, p) for p in todo]) if todo else []:
            if tp.offset >= ranges[tp.partition][1]:
                done(tp.partition)
    return todo | given_up


def _next_batch(consumer: Consumer, *, wait_s: float = 0.2) -> list[Message]:
    """The records (and partition events) the consumer holds now, up to 1000; when it holds none, the next one to
    arrive within ``wait_s`` seconds. Returns as soon as there is something: ``consume(1000, timeout)`` waits out
    its whole timeout unless 1000 arrive, which cost every small read (a run's history for ``inspect``, the
    console's run page, approve, erase) 0.2 s per pass."""
    batch = consumer.consume(1000, timeout=0)
    if batch:
        return batch
    msg = consumer.poll(wait_s)
    return [] if msg is None else [msg]

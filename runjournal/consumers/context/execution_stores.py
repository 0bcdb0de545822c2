"""The execution plane's store contracts, implemented: :class:`KafkaEventStore` (the events topic) and
:class:`RedisRunStore` (the Redis projection as :class:`~runjournal.stores.StateStore`,
:class:`~runjournal.stores.ExecutionRecordStore` and :class:`~runjournal.stores.CheckpointStore`).

These are the only sources of execution facts: recovery folds from them and the ContextManager takes its
facts from them. They import neither memory nor knowledge (import-linter contract in ``pyproject.toml``).

**CheckpointStore = the projected state with its applied offset, not a compacted snapshot topic.** The
projector already writes each run's state together with the ``(partition, offset)`` it covers, and the
partition's applied offset, in one atomic Redis script; a checkpoint is exactly that record, so a snapshot
topic would be a second derived copy written on the projector's hot path and kept consistent by hand.
Redis is disposable — wiped, it is rebuilt from the compacted events topic — so what a snapshot topic would
add is only a faster rebuild after losing Redis, at the cost of every batch. Recovery reads the checkpoint
and folds the tail from ``offset + 1`` (``runjournal.consumers.recovery``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from runjournal.consumers.projector.store import ProjectionStore
from runjournal.consumers.runtime.partitions import events_partition_count
from runjournal.core import dependency_errors, kafka, redis_client
from runjournal.core.errors import RunjournalError
from runjournal.core.settings import Settings
from runjournal.model import ExecutionRecord, RunState, unsettled_calls
from runjournal.schemas import EventCodec, codec_from_settings
from runjournal.schemas.errors import RegistryError, SchemaError
from runjournal.schemas.events import Event
from runjournal.schemas.keys import partition_for
from runjournal.stores import Authority, Checkpoint, EventPosition, Plane, StoredEvent

__all__ = ["EventStoreError", "KafkaEventStore", "RedisRunStore"]


class EventStoreError(RunjournalError):
    """The broker refused an append or did not acknowledge it in time."""


class KafkaEventStore:
    """The :class:`~runjournal.stores.EventStore` on ``{prefix}.events``.

    Appends go through an idempotent producer (``acks=all``) to partition murmur2(run_id), key
    ``{run_id}:{epoch}:{seq}``; reads are ``read_committed``. Agents publish through ``runjournal.producers``
    (transactions, fencing, the side-effect protocol); this store's ``append`` is for tools and tests.

    Args:
        settings: bootstrap servers and topic prefix.
        codec: event codec (default from settings).
        timeout_s: append acknowledgement and read timeout, seconds (default 30).
    """

    plane = Plane.EXECUTION
    authority = Authority.AUTHORITATIVE

    def __init__(self, settings: Settings, *, codec: EventCodec | None = None, timeout_s: float = 30.0) -> None:
        self.settings = settings
        self.topic = settings.events_topic
        self.codec = codec or codec_from_settings(settings)
        self.timeout_s = timeout_s
        self._partitions: int | None = None

    @property
    def partitions(self) -> int:
        """The topic's partition count (read once from the broker)."""
        if self._partitions is None:
            self._partitions = events_partition_count(self.settings)
        return self._partitions

    def append(self, events: Sequence[Event]) -> list[EventPosition]:
        """See :meth:`runjournal.stores.EventStore.append`.

        Raises:
            EventStoreError: a delivery failed or was not acknowledged within ``timeout_s``.
        """
        producer = kafka.producer(self.settings, **{"acks": "all", "enable.idempotence": True})
        out: list[EventPosition | None] = [None] * len(events)
        errors: list[str] = []

        def on_delivery(index: int) -> Any:
            def report(err: KafkaError | None, msg: Message) -> None:
                if err is not None:
                    errors.append(str(err))
                else:
                    out[index] = EventPosition(msg.partition(), msg.offset())
            return report

        for i, event in enumerate(events):
            producer.produce(self.topic, key=event.key.encode(), value=self.codec.encode(event, topic=self.topic),
                             partition=partition_for(event.run_id, self.partitions), on_delivery=on_delivery(i))
            producer.poll(0)
        left = producer.flush(self.timeout_s)
        if left or errors or any(p is None for p in out):
            raise EventStoreError(f"append: {left} event(s) unacknowledged, errors {errors[:3]}")
        return [p for p in out if p is not None]

    def read_run(self, run_id: str) -> list[StoredEvent]:
        """See :meth:`runjournal.stores.EventStore.read_run` (scans the run's partition; cost grows with it)."""
        partition = partition_for(run_id, self.partitions)
        prefix = f"{run_id}:"
        out: list[StoredEvent] = []
        offset = 0
        while True:
            batch = self.read_from(partition, offset, limit=2000)
            out.extend(r for r in batch if r.key.startswith(prefix))
            if not batch:
                return out
            offset = batch[-1].offset + 1

    def read_from(self, partition: int, offset: int, *, limit: int = 1000) -> list[StoredEvent]:
        """See :meth:`runjournal.stores.EventStore.read_from`. Reads up to the high watermark seen at the start."""
        consumer = kafka.consumer(self.settings, **{"group.id": f"eventstore-{uuid.uuid4()}",
                                                    "enable.auto.commit": False, "isolation.level": "read_committed"})
        try:
            tp = TopicPartition(self.topic, partition)
            _low, high = consumer.get_watermark_offsets(tp, timeout=self.timeout_s, cached=False)
            if offset >= high:
                return []
            consumer.assign([TopicPartition(self.topic, partition, max(offset, 0))])
            out: list[StoredEvent] = []
            idle = 0
            while len(out) < limit and idle < 6:
                msgs = consumer.consume(min(1000, limit - len(out)), timeout=0.5)
                if not msgs:  # transaction markers leave offsets no record reaches
                    idle += 1
                    if consumer.position([tp])[0].offset >= high:
                        break
                    continue
                idle = 0
                for msg in msgs:
                    if (err := msg.error()) is not None:
                        if dependency_errors.kafka_stops(err, uses_group=False):  # fatal, unauthorised, topic gone
                            raise KafkaException(err)
                        continue
                    if msg.offset() < high:
                        out.append(self._stored(msg))
                if msgs[-1].offset() + 1 >= high:
                    break
            return out[:limit]
        finally:
            consumer.close()

    def _stored(self, msg: Message) -> StoredEvent:
        key = (msg.key() or b"").decode("utf-8", "replace")
        if msg.value() is None:
            return StoredEvent(msg.partition(), msg.offset(), key, None)
        try:
            event = self.codec.decode(msg.value(), topic=msg.topic(), partition=msg.partition(), offset=msg.offset())
        except RegistryError:
            raise  # transient: the record is fine, its writer schema's source is away
        except SchemaError as exc:
            return StoredEvent(msg.partition(), msg.offset(), key, None, error=f"{type(exc).__name__}: {exc}")
        return StoredEvent(msg.partition(), msg.offset(), key, event)


class RedisRunStore:
    """The Redis projection as :class:`~runjournal.stores.StateStore`, :class:`~runjournal.stores.ExecutionRecordStore`
    and :class:`~runjournal.stores.CheckpointStore` — read-only: only the projector writes
    (:meth:`~runjournal.consumers.projector.store.ProjectionStore.apply_batch`, a compare-and-set on the
    partition's applied offset).

    Args:
        client: redis-py client.
        prefix: topic prefix (key namespace).
        partitions: the events topic's partition count (a run's key lives under its partition's hash tag).
    """

    plane = Plane.EXECUTION
    authority = Authority.DERIVED

    def __init__(self, client: Any, prefix: str, partitions: int) -> None:
        self.store = ProjectionStore(client, prefix)
        self.partitions = partitions

    @classmethod
    def open(cls, settings: Settings) -> RedisRunStore:
        """The projection ``settings`` name, with the partition count read from the broker.

        Raises:
            TopicNotFoundError: the events topic does not exist.
        """
        return cls(redis_client.client(settings), settings.topic_prefix, events_partition_count(settings))

    def _partition(self, run_id: str) -> int:
        return partition_for(run_id, self.partitions)

    # StateStore
    def get(self, run_id: str) -> RunState | None:
        """See :meth:`runjournal.stores.StateStore.get`."""
        return self.store.get(self._partition(run_id), run_id)

    def version(self, run_id: str) -> tuple[int, int] | None:
        """See :meth:`runjournal.stores.StateStore.version`."""
        state = self.get(run_id)
        return (state.applied_partition, state.applied_offset) if state is not None else None

    # ExecutionRecordStore
    def records(self, run_id: str) -> Mapping[str, ExecutionRecord]:
        """See :meth:`runjournal.stores.ExecutionRecordStore.records`."""
        state = self.get(run_id)
        return dict(state.records) if state is not None else {}

    def record(self, run_id: str, call_id: str) -> ExecutionRecord | None:
        """See :meth:`runjournal.stores.ExecutionRecordStore.record`."""
        return self.records(run_id).get(call_id)

    # CheckpointStore
    def checkpoint(self, run_id: str) -> Checkpoint | None:
        """See :meth:`runjournal.stores.CheckpointStore.checkpoint` (state read first, then the partition's
        applied offset, so ``partition_offset`` ≥ ``offset``)."""
        partition = self._partition(run_id)
        state = self.store.get(partition, run_id)
        if state is None:
            return None
        return Checkpoint(run_id=run_id, state=state, partition=partition, offset=state.applied_offset,
                          partition_offset=self.store.applied_offset(partition),
                          pending_approvals=tuple(sorted(state.pending_approvals)),
                          unsettled_calls=unsettled_calls(state))

    def applied_offset(self, partition: int) -> int:
        """See :meth:`runjournal.stores.CheckpointStore.applied_offset`."""
        return self.store.applied_offset(partition)

"""Fold the tail of each partition onto the Redis snapshot: the recovery job's view of a run.

For each partition: the projector's applied offset ``a`` is read from Redis first, then the
run states (a snapshot at or after ``a``); records ``a+1 … end-1`` of the runs of interest
are folded onto them with the pure reducer. ``end`` is the high watermark read once, after
fencing, by a ``read_uncommitted`` query: nothing of a fenced zombie can land before it
unseen. It must be the high watermark, not the last stable offset a ``read_committed``
reader is shown: a live instance's open transaction holds the LSO back, and a record
committed beyond it (e.g. a RUN_RESUMED of an earlier pass) would be missed. The tail is
read ``read_committed`` until the position reaches ``end`` — the position advances past
aborted records and transaction markers, and waits (bounded) while a transaction that
started before ``end`` is still open. An empty tail is done at once. Cost grows with the
tail since the projector's position, not with history.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition

from runjournal.consumers.projector.store import ProjectionStore
from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.model.reducer import RunState, apply, block
from runjournal.schemas import EventCodec
from runjournal.schemas.errors import RegistryError, SchemaError

__all__ = ["PartitionRead", "end_offsets", "fold_tails"]


@dataclass(frozen=True)
class PartitionRead:
    """What recovery read of one partition."""

    partition: int
    """Partition number."""
    start: int
    """First offset read (the projector's applied offset + 1)."""
    end: int
    """End offset read at start (exclusive)."""
    records: int
    """Records consumed from the tail (all runs)."""
    folded: int
    """Records of the recovered runs folded onto their snapshots."""


def _consumer(settings: Settings) -> Consumer:
    return kafka.consumer(settings, **{"group.id": f"recovery-{uuid.uuid4()}",
                     "enable.auto.commit": False, "isolation.level": "read_committed",
                     "auto.offset.reset": "earliest"})


def end_offsets(settings: Settings, partitions: Iterable[int], *, timeout_s: float = 10.0) -> dict[int, int]:
    """High watermark of each partition of the events topic (a ``read_uncommitted`` ListOffsets)."""
    consumer = kafka.consumer(settings, **{"group.id": f"recovery-{uuid.uuid4()}",
                         "enable.auto.commit": False, "isolation.level": "read_uncommitted"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(settings.events_topic, p), timeout=timeout_s,
                                                  cached=False)[1] for p in partitions}
    finally:
        consumer.close()


def fold_tails(
    settings: Settings, store: ProjectionStore, codec: EventCodec, runs_by_partition: dict[int, set[str]],
    ends: dict[int, int], *, timeout_s: float = 30.0,
) -> tuple[dict[str, RunState | None], list[PartitionRead]]:
    """Snapshot + tail fold for every run in ``runs_by_partition``.

    Returns:
        ``(states, reads)``: run_id -> state (None: the run has no fact at all), and one
        :class:`PartitionRead` per partition.

    Raises:
        KafkaException: the broker is unreachable.
        TimeoutError: a partition's position did not reach its end offset within ``timeout_s`` seconds
            (a transaction opened before the end offset is still undecided); nothing was decided.
        RegistryError: a record's writer schema could not be fetched (registry or ``{prefix}.schemas``
            unavailable); nothing was decided — an outage never marks a run BLOCKED.
    """
    starts = {p: store.applied_offset(p) + 1 for p in runs_by_partition}  # the offset first, then states
    states: dict[str, RunState | None] = {}
    for p, runs in runs_by_partition.items():
        states.update({r: None for r in runs})
        states.update(store.load(p, runs))
    todo = {p for p in runs_by_partition if starts[p] < ends[p]}
    counts = {p: [0, 0] for p in runs_by_partition}
    if todo:
        consumer = _consumer(settings)
        try:
            consumer.assign([TopicPartition(settings.events_topic, p, starts[p]) for p in todo])
            _consume(consumer, settings, codec, todo, ends, runs_by_partition, states, counts,
                     time.monotonic() + timeout_s)
        finally:
            consumer.close()
    reads = [PartitionRead(p, starts[p], ends[p], counts[p][0], counts[p][1]) for p in sorted(runs_by_partition)]
    return states, reads


def _consume(consumer: Consumer, settings: Settings, codec: EventCodec, todo: set[int], ends: dict[int, int],
             runs_by_partition: dict[int, set[str]], states: dict[str, RunState | None],
             counts: dict[int, list[int]], deadline: float) -> None:
    topic, critical = settings.events_topic, settings.critical_types
    prefixes = {p: tuple(f"{r}:".encode() for r in runs) for p, runs in runs_by_partition.items()}
    while todo and time.monotonic() < deadline:
        msgs = consumer.consume(2000, timeout=0.25)
        if not msgs:
            for tp in consumer.position([TopicPartition(topic, p) for p in todo]):
                if tp.offset >= ends[tp.partition]:
                    todo.discard(tp.partition)
            continue
        for msg in msgs:
            p, off = msg.partition(), msg.offset()
            if msg.error() or p not in todo or off >= ends[p]:
                continue
            counts[p][0] += 1
            if off + 1 >= ends[p]:
                todo.discard(p)
            key = msg.key() or b""
            if not key.startswith(prefixes[p]):
                continue
            run_id = key.decode().rsplit(":", 2)[0]
            if run_id not in states:
                continue
            counts[p][1] += 1
            states[run_id] = _fold_one(codec, states[run_id], run_id, msg, critical)
    if todo:
        raise TimeoutError(f"recovery could not read partitions {sorted(todo)} to their end offsets {ends}")


def _fold_one(codec: EventCodec, state: RunState | None, run_id: str, msg: object,
              critical: frozenset[str]) -> RunState | None:
    value = msg.value()  # type: ignore[attr-defined]
    p, off = msg.partition(), msg.offset()  # type: ignore[attr-defined]
    if value is None:
        return None  # tombstone: the run is being erased
    try:
        event = codec.decode(value, topic=msg.topic(), partition=p, offset=off)  # type: ignore[attr-defined]
    except RegistryError:
        raise  # the schema source is away, the record is fine: decide nothing (never BLOCKED by an outage)
    except SchemaError as exc:
        return block(state, run_id, f"{type(exc).__name__}: {exc}", partition=p, offset=off)
    return apply(state, event, partition=p, offset=off, critical=critical)

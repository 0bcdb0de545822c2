"""Consumer-group mechanics shared by the projector and the memory extractor: offset commits and lag."""

from __future__ import annotations

import logging

from confluent_kafka import Consumer, KafkaException, TopicPartition

__all__ = ["commit_pending", "partition_lags"]


def commit_pending(consumer: Consumer, topic: str, pending: dict[int, int], partitions: set[int], *,
                   asynchronous: bool, log: logging.Logger) -> None:
    """Commit (and remove from ``pending``) the next offsets of ``partitions`` that have one.

    A failed commit is logged, not raised: both services' truth is elsewhere (Redis's applied
    offset; Qdrant's deterministic ids), so a lost group commit only means a harmless redelivery.
    """
    offsets = [TopicPartition(topic, p, pending.pop(p)) for p in partitions if p in pending]
    if not offsets:
        return
    try:
        consumer.commit(offsets=offsets, asynchronous=asynchronous)
    except KafkaException as exc:
        log.warning("offset commit failed", extra={"error": str(exc)})


def partition_lags(consumer: Consumer, done: dict[int, int]) -> dict[int, int]:
    """Records behind, per assigned partition: end offset minus max(position, last done + 1, log start); ``{}``
    when nothing is assigned. The end offset is what a ``read_committed`` reader may read (the LSO). The log
    start counts: a partition whose records were all deleted or compacted away (low = high) has nothing to
    read although nothing was consumed (issue 14 (a))."""
    assignment = consumer.assignment()
    if not assignment:
        return {}
    lags = {}
    for tp in consumer.position(assignment):
        low, high = consumer.get_watermark_offsets(tp, timeout=5, cached=False)
        lags[tp.partition] = max(0, high - max(tp.offset, done.get(tp.partition, -1) + 1, low))
    return lags

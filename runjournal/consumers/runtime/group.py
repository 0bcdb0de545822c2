"""Consumer-group mechanics shared by the projector, the memory extractor and the archiver: their consumer
settings, offset commits and lag."""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

__all__ = ["GROUP_SESSION_TIMEOUT_MS", "LagExport", "commit_pending", "group_consumer_config", "partition_lags"]

GROUP_SESSION_TIMEOUT_MS = 10_000
"""How long a dead member of a service's group holds its partitions before the group moves them (ms): 10 s instead
of Kafka's 45 s default, so a SIGKILLed projector, extractor or archiver stalls its partitions for at most that
long (docs/guide/archive.md § Run the archiver)."""


def group_consumer_config(group_id: str, *, session_timeout_ms: int = GROUP_SESSION_TIMEOUT_MS,
                          instance_id: str | None = None) -> dict[str, Any]:
    """The consumer settings every service's group shares: offsets stored and committed by hand after the durable
    write, ``read_committed``, cooperative-sticky assignment (a rebalance moves only the partitions that change
    hands), ``session.timeout.ms`` (ms; heartbeats every quarter of it, at least 1 s) and, given
    ``instance_id``, static membership (KIP-345: a restarted member takes its partitions back at once).

    Returns:
        librdkafka properties for ``runjournal.core.kafka.consumer``.
    """
    return {"group.id": group_id, "enable.auto.commit": False, "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest", "isolation.level": "read_committed",
            "partition.assignment.strategy": "cooperative-sticky", "session.timeout.ms": session_timeout_ms,
            "heartbeat.interval.ms": max(1000, session_timeout_ms // 4),
            **({"group.instance.id": instance_id} if instance_id else {})}


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


def partition_lags(consumer: Consumer, done: dict[int, int], *, cached: bool = False) -> dict[int, int]:
    """Records behind, per assigned partition: end offset minus max(position, last done + 1, log start); ``{}``
    when nothing is assigned. The end offset is what a ``read_committed`` reader may read (the LSO). The log
    start counts: a partition whose records were all deleted or compacted away (low = high) has nothing to
    read although nothing was consumed (issue 14 (a)).

    With ``cached`` the offsets are the ones the last fetch responses carried (no request to the broker; used
    for the lag metrics); a partition without them yet is left out.
    """
    assignment = consumer.assignment()
    if not assignment:
        return {}
    lags = {}
    for tp in consumer.position(assignment):
        low, high = consumer.get_watermark_offsets(tp, timeout=5, cached=cached)
        if high < 0:
            continue
        lags[tp.partition] = max(0, high - max(tp.offset, done.get(tp.partition, -1) + 1, low))
    return lags


class LagExport:
    """Sets a per-partition records-lag gauge from the consumer's cached end offsets, at most every
    ``every_s`` seconds (the services' main loops call :meth:`maybe` on every poll).

    Args:
        gauge: a Prometheus gauge with one label, ``partition``.
        every_s: the shortest interval between two exports, seconds (default 1).
    """

    def __init__(self, gauge: Any, every_s: float = 1.0) -> None:
        self.gauge = gauge
        self.every_s = every_s
        self._next = 0.0
        self._exported: set[int] = set()

    def maybe(self, consumer: Consumer, done: dict[int, int]) -> None:
        """Export the lags now if ``every_s`` passed; partitions no longer assigned are removed."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every_s
        lags = partition_lags(consumer, done, cached=True)
        for partition in self._exported - set(lags):
            self.gauge.remove(str(partition))
        for partition, lag in lags.items():
            self.gauge.labels(str(partition)).set(lag)
        self._exported = set(lags)

"""The events topic's partition count and a run's partition (shared by replay, erase and approve/deny)."""

from __future__ import annotations

import uuid

from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.producers.errors import TopicNotFoundError
from runjournal.producers.partitioner import partition_for

__all__ = ["events_partition_count", "run_partition"]


def events_partition_count(settings: Settings, *, timeout_s: float = 10.0) -> int:
    """Partition count of ``settings.events_topic``, read from the broker's metadata.

    Args:
        settings: bootstrap servers and topic prefix.
        timeout_s: metadata request timeout, seconds (default 10).

    Returns:
        The count (fixed at topic creation; DESIGN.md § Topic layout).

    Raises:
        TopicNotFoundError: the events topic does not exist.
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
    return len(topic.partitions)


def run_partition(settings: Settings, run_id: str) -> int:
    """The partition holding every event of ``run_id``: murmur2(run_id) mod the topic's partition count.

    Raises:
        TopicNotFoundError: the events topic does not exist.
    """
    return partition_for(run_id, events_partition_count(settings))

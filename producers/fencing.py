"""Instance identity at the broker: the transactional id, and fencing a presumed-dead instance.

DESIGN.md § Zombies: fence first, then read. Every event of an instance goes through one
transactional producer whose ``transactional.id`` derives from the instance's ``producer_id``
(:func:`transactional_id`). The recovery job fences a presumed-dead instance with
:func:`fence_producer` — ``init_transactions()`` with that id bumps the producer epoch and aborts
the instance's open transaction, so its next write (an intent included) fails — and only then
reads the end offsets. Use the fencing producer for nothing else: publish RUN_RESUMED with the
recovery job's own transactional id.
"""

from __future__ import annotations

import os
import socket
import uuid

from confluent_kafka import KafkaException

from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.producers.errors import JournalError

__all__ = ["default_producer_id", "fence_producer", "transactional_id"]


def transactional_id(settings: Settings, producer_id: str) -> str:
    """The Kafka ``transactional.id`` of instance ``producer_id``: ``{topic_prefix}.{producer_id}``.

    The recovery job calls ``init_transactions()`` with exactly this id to fence a presumed-dead
    instance (DESIGN.md § Zombies: fence first, then read). Never change the format.
    """
    return f"{settings.topic_prefix}.{producer_id}"


def fence_producer(settings: Settings, producer_id: str, *, timeout_s: float = 30.0) -> None:
    """Fence instance ``producer_id`` at the broker: ``init_transactions()`` with its transactional id.

    Bumps the producer epoch and aborts its open transaction; its next transactional write fails.

    Raises:
        JournalError: the broker did not complete ``init_transactions`` (Kafka error chained).
    """
    producer = kafka.producer(settings, **{"transactional.id": transactional_id(settings, producer_id)}
    )
    try:
        producer.init_transactions(timeout_s)
    except KafkaException as exc:
        raise JournalError(f"could not fence {producer_id}: {exc}") from exc
    finally:
        producer.close()


def default_producer_id() -> str:
    """``{host}-{pid}-{8 hex}``: unique per process start."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"

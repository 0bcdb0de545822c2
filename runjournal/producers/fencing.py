"""Instance identity at the broker: the transactional id, and fencing a presumed-dead instance.

docs/design/protocol.md § Zombies: fence first, then read. Every event of an instance goes through one
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

from confluent_kafka import KafkaException, Producer

from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.producers.errors import JournalError

__all__ = ["default_producer_id", "fence_producer", "init_transactions", "transactional_id"]


def transactional_id(settings: Settings, producer_id: str) -> str:
    """The Kafka ``transactional.id`` of instance ``producer_id``: ``{topic_prefix}.{producer_id}``.

    The recovery job calls ``init_transactions()`` with exactly this id to fence a presumed-dead
    instance (docs/design/protocol.md § Zombies: fence first, then read). Never change the format.
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
        init_transactions(producer, timeout_s)
    except KafkaException as exc:
        raise JournalError(f"could not fence {producer_id}: {exc}") from exc
    finally:
        producer.close()


def init_transactions(producer: Producer, timeout_s: float) -> None:
    """``producer.init_transactions(timeout_s)`` once a broker connection is up (one metadata request first).

    On a fresh producer librdkafka looks up the transaction coordinator at once, and when no broker connection
    is up yet it tries again on a 500 ms timer: one init in five took ~0.5 s instead of ~0.06 s on the local
    broker (30 tries each, 2026-12-01; with the metadata request first: none of 30). The request lists the
    topics the client may describe (no topic named: nothing is auto-created).

    Args:
        producer: a transactional producer that has not been initialised.
        timeout_s: for each of the two requests, seconds.

    Raises:
        KafkaException: no broker answered, or ``init_transactions`` failed (as the client raised it).
    """
    producer.list_topics(timeout=timeout_s)
    producer.init_transactions(timeout_s)


def default_producer_id() -> str:
    """``{host}-{pid}-{8 hex}``: unique per process start; the host name cut to 64 characters, so the id stays within
    the producer-id rules (``runjournal.core.ids.PRODUCER_ID``: 128 bytes) on a host with a long name."""
    return f"{socket.gethostname()[:64] or 'host'}-{os.getpid()}-{uuid.uuid4().hex[:8]}"

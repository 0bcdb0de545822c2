"""Dead-letter publishing: quarantine a record with its original bytes, headers, error and source offset.

A malformed record is never skipped silently and never blocks its partition: it is copied
to the DLQ topic (durably: :meth:`DeadLetters.flush` waits for the broker's ack) before the
consumer's offset moves past it. Headers added (all UTF-8):

* ``rj.error`` — the error message; ``rj.error.type`` — the error class name;
* ``rj.source.topic`` / ``rj.source.partition`` / ``rj.source.offset`` — where it came from;
* the original headers are kept, in order, before these.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, Message

from runjournal.core import kafka
from runjournal.core.errors import RunjournalError
from runjournal.core.settings import Settings

__all__ = ["DeadLetterError", "DeadLetters"]


class DeadLetterError(RunjournalError):
    """A record could not be written to the DLQ; the consumer must not move past it.

    Attributes:
        errors: the delivery errors librdkafka reported (none when records were only left unacknowledged); the
            failure policy reads them: an outage waits, a DLQ topic gone or not writable stops
            (docs/design/protocol.md § One failure policy).
    """

    def __init__(self, message: str, errors: tuple[KafkaError, ...] = ()) -> None:
        super().__init__(message)
        self.errors = errors


class DeadLetters:
    """An idempotent producer to one DLQ topic.

    Args:
        settings: where the cluster is (the client configuration comes from ``runjournal.core.kafka``).
        topic: the DLQ topic (``Settings.events_dlq_topic`` or ``memory_dlq_topic``).
    """

    def __init__(self, settings: Settings, topic: str) -> None:
        self.topic = topic
        self._producer = kafka.producer(settings, **{"acks": "all", "enable.idempotence": True, "linger.ms": 5})
        self._errors: list[KafkaError] = []
        self.sent = 0

    def send(self, msg: Message, error: BaseException, *, redact: bool = False) -> None:
        """Queue ``msg`` (a consumed record) with ``error`` for the DLQ; call :meth:`flush` before committing.
        ``redact``: the ``rj.error`` header names the error's class only — for a consumer that opened encrypted
        content, whose error text may quote it (decision 0059)."""
        self.send_raw(key=msg.key(), value=msg.value(), headers=msg.headers() or [], error=error,
                      source=(msg.topic(), msg.partition(), msg.offset()), redact=redact)

    def send_raw(self, *, key: bytes | None, value: bytes | None, headers: list[tuple[str, Any]],
                 error: BaseException, source: tuple[str | None, int | None, int | None],
                 redact: bool = False) -> None:
        """Queue a record given by parts (``source``: ``(topic, partition, offset)``; ``redact``: see :meth:`send`)."""
        topic, partition, offset = source
        extra = [
            ("rj.error", (f"{type(error).__name__} (text withheld: encrypted content)" if redact
                          else str(error)).encode()),
            ("rj.error.type", type(error).__name__.encode()),
            ("rj.source.topic", str(topic).encode()),
            ("rj.source.partition", str(partition).encode()),
            ("rj.source.offset", str(offset).encode()),
        ]
        self._producer.produce(self.topic, key=key, value=value, headers=[*headers, *extra],
                               on_delivery=self._on_delivery)
        self._producer.poll(0)
        self.sent += 1

    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self._errors.append(err)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait for every queued record's ack.

        Raises:
            DeadLetterError: a record was not acknowledged within ``timeout_s`` seconds or failed.
        """
        left = self._producer.flush(timeout_s)
        if left or self._errors:
            errors, self._errors = self._errors, []
            raise DeadLetterError(f"{left} DLQ record(s) unacknowledged, errors: {errors}", tuple(errors))

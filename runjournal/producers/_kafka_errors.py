"""Mapping librdkafka errors to what the journal does about them (pure; tested without a broker).

* FENCED — ``_FENCED``, ``PRODUCER_FENCED``, ``INVALID_PRODUCER_EPOCH``: another producer took the
  transactional id. The journal stops the runs that existed, rebuilds, raises ProducerFencedError.
* FATAL — ``error.fatal()`` (OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID, …), or ``_FATAL`` (what every
  call on a producer already in its fatal state raises, without the fatal flag): rebuild the producer (new
  ``init_transactions``), raise FatalProducerError — unless the fatal error that put it there was a fence
  (``TxnPublisher`` keeps it from ``error_cb`` and classifies ``_FATAL`` by it: FENCED, never rebuilt).
* ABORTABLE — ``error.txn_requires_abort()`` (e.g. a record's delivery failed): ``abort_transaction``,
  raise TransactionAbortedError.
* RETRIABLE — ``error.retriable()`` (e.g. a commit timed out): call again, a bounded number of times.
* LOCAL — anything else (bad argument, unknown partition, wrong state): that one call fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from confluent_kafka import KafkaError, KafkaException

from runjournal.producers.errors import DeliveryError

__all__ = ["Failure", "Severity", "classify", "kafka_error"]

# librdkafka's local _FENCED plus the broker codes a fenced producer can get.
_FENCED_CODES = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}  # noqa: SLF001
)


class Severity(StrEnum):
    """What a Kafka error means for the open transaction (see the module table)."""

    FENCED = "FENCED"
    FATAL = "FATAL"
    ABORTABLE = "ABORTABLE"
    RETRIABLE = "RETRIABLE"
    LOCAL = "LOCAL"


def kafka_error(exc: BaseException) -> KafkaError | None:
    """The ``KafkaError`` a ``KafkaException`` carries, or None."""
    arg = exc.args[0] if exc.args else None
    return arg if isinstance(arg, KafkaError) else None


def classify(error: KafkaError | KafkaException | None) -> Severity:
    """The :class:`Severity` of ``error`` (an exception is unwrapped; None counts as FATAL: unknown state)."""
    err = kafka_error(error) if isinstance(error, KafkaException) else error
    if err is None:
        return Severity.FATAL
    if err.code() in _FENCED_CODES:
        return Severity.FENCED
    if err.fatal() or err.code() == KafkaError._FATAL:  # noqa: SLF001 - librdkafka's own code
        return Severity.FATAL
    if err.txn_requires_abort():
        return Severity.ABORTABLE
    if err.retriable():
        return Severity.RETRIABLE
    return Severity.LOCAL


@dataclass(frozen=True, slots=True)
class Failure:
    """How a transaction generation was lost; every waiter on it raises a fresh :meth:`error`."""

    kind: type[DeliveryError]
    """The error class to raise."""
    message: str
    """Its message."""
    cause: BaseException
    """The Kafka exception, chained as ``__cause__``."""
    retryable: bool
    """False when the outcome is ambiguous or the instance is fenced: the seq cannot be reused."""
    ambiguous: bool = False
    """True when the commit may have happened (see ``DeliveryError.ambiguous``)."""
    refused_keys: frozenset[str] = frozenset()
    """Keys of the records the broker refused for themselves (see ``DeliveryError.refused_keys``)."""

    def error(self) -> DeliveryError:
        """A fresh exception for one waiter."""
        err = self.kind(self.message)
        err.retryable = self.retryable
        err.ambiguous = self.ambiguous
        err.refused_keys = self.refused_keys
        err.__cause__ = self.cause
        return err

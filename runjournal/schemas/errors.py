"""Named errors of the event contract's wire side (codec, schema versions, compatibility gate).

Every error here subclasses :class:`SchemaError` (itself a :class:`runjournal.core.errors.RunjournalError`).
Third-party errors (fastavro, confluent_kafka) are chained as ``__cause__``.

Decode-side errors (:class:`DecodeError` and its subclasses) carry where the bad value was
read (``topic``, ``partition``, ``offset``) so a consumer can quarantine it with its offset
(docs/design/protocol.md § Events: never guessed at, never silently skipped).
"""

from __future__ import annotations

from runjournal.core.errors import RunjournalError

__all__ = [
    "CorruptEventError",
    "DecodeError",
    "EventTooLargeError",
    "InvalidEventError",
    "RegistryError",
    "SchemaError",
    "TombstoneError",
    "UnregisteredSchemaError",
    "UnsupportedSchemaError",
]


class SchemaError(RunjournalError):
    """Base of every error raised by the ``schemas`` package."""


class DecodeError(SchemaError):
    """A Kafka record value could not be turned into an :class:`~runjournal.schemas.events.Event`.

    Attributes:
        fingerprint: CRC-64-AVRO fingerprint (unsigned 64-bit int) of the writer schema, when known.
        schema_id: Confluent Schema Registry id of the writer schema (registry framing only), else None.
        topic: topic the value was read from, when the caller said.
        partition: partition, when the caller said.
        offset: offset, when the caller said.
    """

    def __init__(
        self,
        message: str,
        *,
        fingerprint: int | None = None,
        schema_id: int | None = None,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.fingerprint = fingerprint
        self.schema_id = schema_id
        self.topic = topic
        self.partition = partition
        self.offset = offset
        super().__init__(f"{message} (at {self.location})")

    @property
    def location(self) -> str:
        """``topic[partition]@offset`` with ``?`` for any part not given."""
        part = "?" if self.partition is None else self.partition
        off = "?" if self.offset is None else self.offset
        return f"{self.topic or '?'}[{part}]@{off}"


class UnsupportedSchemaError(DecodeError):
    """The value is well framed but written with a schema this reader does not support.

    Raised for an unknown writer fingerprint (or registry schema id / schema), a type symbol
    unknown to this reader (the wire enum's ``UNKNOWN`` default), or a writer that cannot be
    resolved to the current reader schema. Quarantine the record; a newer reader may read it.
    """


class CorruptEventError(DecodeError):
    """The bytes are not a valid event: empty, bad magic, truncated or trailing body, or a
    payload branch that does not match the event type."""


class TombstoneError(DecodeError, TypeError):
    """``decode(None)``: a tombstone (erased event) has no event to decode.

    Check :func:`runjournal.schemas.codec.is_tombstone` before decoding. Also a :class:`TypeError`.
    """


class EventTooLargeError(SchemaError):
    """The encoded event is larger than the codec's cap; nothing was sent.

    The message says what the caller can do about it: a tool's result over ``inline_result_bytes`` already goes by
    reference on its own, so what is too large is something the caller wrote — a run's input or output, a message,
    an error text — and the fix is to keep the large value in their own storage and journal its key.

    Attributes:
        size_bytes: encoded size in bytes (framing included).
        limit_bytes: the codec's ``max_event_bytes``.
        event_id: the offending event's id.
        event_type: its type's symbol (``RUN_SUCCEEDED`` …), when known.
    """

    def __init__(self, *, size_bytes: int, limit_bytes: int, event_id: str, event_type: str | None = None) -> None:
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes
        self.event_id = event_id
        self.event_type = event_type
        what = _TOO_LARGE.get(event_type or "", "a value of this event")
        super().__init__(
            f"{event_type or 'event'} {event_id} encodes to {size_bytes} bytes, over the cap of {limit_bytes} bytes "
            f"(the broker's message limit, less framing): {what} is too large — keep it in your own storage (an object "
            "store, a database) and journal its key or URL instead"
        )


#: What the caller wrote that made an event too large, by type (tool results go by reference on their own).
_TOO_LARGE = {
    "RUN_STARTED": "the run's input", "RUN_SUCCEEDED": "the run's output (succeed())", "MESSAGE": "the message",
    "RUN_FAILED": "the error text", "USER_CORRECTION": "the correction", "NODE_FAILED": "the error text",
    "APPROVAL_REQUESTED": "the reason", "TOOL_CALL_FAILED": "the error text",
}


class InvalidEventError(SchemaError, ValueError):
    """An :class:`~runjournal.schemas.events.Event` does not fit the current schema (encode side).

    Attributes:
        field: dotted path of the offending field (``payload.attempt``), when known.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(message)


class RegistryError(SchemaError):
    """A source of writer schemas is unavailable: the schema registry unreachable, timing out or
    answering 5xx, or the ``{prefix}.schemas`` topic unreadable or unwritable.

    A **transient** failure, not a content problem: the record is fine and decodes once the source
    is back, so a consumer waits and retries the same record (never dead-letters it). Content
    problems are :class:`UnsupportedSchemaError` / :class:`CorruptEventError`.
    """


class UnregisteredSchemaError(SchemaError):
    """A writer's schema is not registered under its subject (writers never register on the hot path).

    Register the version with ``runjournal schemas publish --registry`` first.
    """

"""EventCodec: :class:`~runjournal.schemas.events.Event` ⇄ Kafka record value bytes.

Two steps, reversed on read (style note 10):

1. converter — Event ⇄ envelope record dict in the current schema's shape (payload in
   fastavro tuple notation ``(record_fullname, fields)`` so a union never takes the wrong branch);
2. framing — record ⇄ bytes: Avro single-object encoding by default, Confluent Schema
   Registry framing when a registry URL is given.

Single-object wire format (Avro spec § Single object encoding)::

    +------+------+---------------------------------+---------------------------+
    | 0xC3 | 0x01 | CRC-64-AVRO fingerprint, 8 B LE | Avro binary body (N bytes) |
    +------+------+---------------------------------+---------------------------+

On read the fingerprint selects the writer version among every published one; fastavro
resolves it to the current reader schema; upcasters (:mod:`runjournal.schemas.upcasters`) then fix meaning.
"""

from __future__ import annotations

from io import BytesIO
from typing import TYPE_CHECKING, Any

from fastavro import schemaless_writer
from fastavro.validation import ValidationError, validate

from runjournal.core.errors import ConfigError
from runjournal.schemas._avro_body import read_body
from runjournal.schemas._validate import RecordValidator
from runjournal.schemas.errors import (
    CorruptEventError,
    EventTooLargeError,
    InvalidEventError,
    TombstoneError,
    UnsupportedSchemaError,
)
from runjournal.schemas.events import PAYLOAD_FIELDS, Event, EventType, NaiveDatetimeError
from runjournal.schemas.upcasters import upcast
from runjournal.schemas.versions import MAGIC, SchemaVersion, load_versions, payload_record_name

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from runjournal.core.settings import Settings

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "DEFAULT_TOPIC", "EventCodec", "codec_from_settings", "is_tombstone"]

#: Default cap on one encoded event, bytes: headroom below the broker's 1 MiB ``max.message.bytes``
#: for the key, headers and record-batch overhead.
DEFAULT_MAX_EVENT_BYTES = 900_000
#: Topic used for the registry subject (``{topic}-value``) when ``encode`` is not given one.
DEFAULT_TOPIC = "runjournal.events"

_HEADER_BYTES = 10
_TYPE_BY_SYMBOL: dict[str, EventType] = {t.value: t for t in EventType}
_RECORD_NAME: dict[EventType, str] = {t: payload_record_name(t.value) for t in EventType}
_SYMBOL_BY_RECORD: dict[str, str] = {name: t.value for t, name in _RECORD_NAME.items()}
_FIELDS: dict[EventType, tuple[tuple[str, type, bool], ...]] = {
    t: tuple((name, py, required) for name, (py, required) in fields.items())
    for t, fields in PAYLOAD_FIELDS.items()
}
_FIELD_NAMES: dict[EventType, frozenset[str]] = {t: frozenset(f) for t, f in PAYLOAD_FIELDS.items()}
_BAD_RECORD = (TypeError, ValueError, AttributeError, OverflowError, KeyError)


def is_tombstone(value: bytes | None) -> bool:
    """True when a record value is a tombstone (``None``: an erased event).

    Consumers check this before :meth:`EventCodec.decode`, which rejects ``None``.
    """
    return value is None


class EventCodec:
    """Encodes and decodes journal events; thread-safe after construction.

    Args:
        max_event_bytes: cap on one encoded event in bytes (framing included); default 900 000.
        schema_registry_url: Confluent Schema Registry URL (env ``RUNJOURNAL_SCHEMA_REGISTRY_URL``);
            None (default) means Avro single-object encoding. ``mock://<name>`` is an in-memory
            registry shared per URL within the process (tests).
        schema_registry_client: an existing registry client (overrides ``schema_registry_url``).
        topic: registry framing: the topic whose ``{topic}-value`` subject ``encode`` uses when given none.

    Raises:
        SchemaError: the published ``.avsc`` files cannot be loaded.
    """

    def __init__(
        self,
        *,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        schema_registry_url: str | None = None,
        schema_registry_client: SchemaRegistryClient | None = None,
        topic: str = DEFAULT_TOPIC,
    ) -> None:
        if max_event_bytes <= _HEADER_BYTES:
            raise ValueError(f"max_event_bytes must exceed {_HEADER_BYTES}, got {max_event_bytes}")
        versions = load_versions()
        self._current: SchemaVersion = versions[-1]
        self._validate = RecordValidator(self._current.parsed)  # type and range of every value, before writing
        self._max_event_bytes = max_event_bytes
        self._topic = topic
        # fingerprint -> (writer version, reader schema or None when writer is current: no resolution)
        self._readers: dict[int, tuple[SchemaVersion, dict[str, Any] | None]] = {
            v.fingerprint: (v, None if v is self._current else self._current.parsed) for v in versions
        }
        self._registry = None
        if schema_registry_client is not None or schema_registry_url:
            try:
                from runjournal.schemas._confluent import ConfluentWire, registry_client
            except ModuleNotFoundError as exc:
                raise ConfigError(
                    f"RUNJOURNAL_SCHEMA_REGISTRY_URL is set but the registry client is not installed ({exc.name}): "
                    "pip install 'runjournal[registry]'") from exc

            client = schema_registry_client or registry_client(schema_registry_url or "")
            self._registry = ConfluentWire(client, versions)

    @property
    def fingerprint(self) -> int:
        """CRC-64-AVRO fingerprint (unsigned 64-bit int) of the current writer schema."""
        return self._current.fingerprint

    @property
    def schema_version(self) -> SchemaVersion:
        """The current envelope version every event is written with."""
        return self._current

    @property
    def wire_format(self) -> str:
        """``"single-object"`` or ``"confluent"``."""
        return "single-object" if self._registry is None else "confluent"

    @property
    def max_event_bytes(self) -> int:
        """The cap on one encoded event, bytes."""
        return self._max_event_bytes

    def encode(self, event: Event, *, topic: str | None = None) -> bytes:
        """Encode ``event`` with the current schema. Never returns ``b""``.

        Args:
            event: the event; ``occurred_at`` is written as UTC milliseconds (sub-ms truncated).
            topic: registry framing only: subject ``{topic}-value`` (default: the codec's topic).

        Returns:
            The record value: single-object (``C3 01`` + 8-byte fingerprint + body) or Confluent framed.

        Raises:
            NaiveDatetimeError: ``occurred_at`` has no timezone.
            InvalidEventError: a field is missing, unknown, of the wrong type or out of its Avro type's range
                (``.field`` names it; ``runjournal.schemas._validate``).
            EventTooLargeError: the encoded size in bytes is over ``max_event_bytes``.
            RegistryError: registry framing only: the registry failed or refused the schema.
        """
        record = self._to_record(event)
        self._validate(record)
        if self._registry is not None:
            data = self._registry.dumps(record, topic or self._topic)
        else:
            buf = BytesIO()
            buf.write(self._current.header)
            try:
                schemaless_writer(buf, self._current.parsed, record)
            except _BAD_RECORD as exc:
                raise self._invalid(record, exc) from exc
            data = buf.getvalue()
        if len(data) > self._max_event_bytes:
            raise EventTooLargeError(
                size_bytes=len(data), limit_bytes=self._max_event_bytes, event_id=event.event_id
            )
        return data

    def decode(
        self,
        value: bytes | None,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> Event:
        """Decode a record value into the current :class:`Event` shape (resolved, then upcast).

        Args:
            value: the Kafka record value. Check :func:`is_tombstone` first.
            topic, partition, offset: where it was read; only carried into errors.

        Returns:
            The event; ``occurred_at`` is an aware UTC datetime.

        Raises:
            TombstoneError: ``value`` is None.
            CorruptEventError: empty or short value, bad magic, truncated or trailing body, or a
                type/payload mismatch.
            UnsupportedSchemaError: unknown writer fingerprint (``.fingerprint``) or schema id, or a type
                symbol this reader does not know.
            RegistryError: registry framing only: the registry could not be reached.
        """
        where: dict[str, Any] = {"topic": topic, "partition": partition, "offset": offset}
        if value is None:
            raise TombstoneError("tombstone (None value) has no event; check is_tombstone() first", **where)
        if self._registry is not None:
            record, version = self._registry.loads(value, where)
        else:
            record, version = self._read_single_object(value, where)
        return self._to_event(record, version, where)

    # -- single-object framing ------------------------------------------------------------
    def _read_single_object(
        self, value: bytes, where: dict[str, Any]
    ) -> tuple[dict[str, Any], SchemaVersion]:
        if len(value) <= _HEADER_BYTES or value[:2] != MAGIC:
            raise CorruptEventError(
                f"not an Avro single-object value ({len(value)} bytes, "
                f"starts {bytes(value[:2]).hex() or 'empty'})",
                **where,
            )
        fingerprint = int.from_bytes(value[2:_HEADER_BYTES], "little")
        known = self._readers.get(fingerprint)
        if known is None:
            raise UnsupportedSchemaError(
                f"unknown writer schema fingerprint {fingerprint:#018x}", fingerprint=fingerprint, **where
            )
        version, reader = known
        return read_body(value, _HEADER_BYTES, version, reader, where), version

    # -- converter --------------------------------------------------------------------------
    def _to_record(self, event: Event) -> dict[str, Any]:
        at = event.occurred_at
        if at.tzinfo is None or at.utcoffset() is None:
            raise NaiveDatetimeError(
                f"occurred_at must be timezone-aware (got naive {at!r}) for {event.event_id}"
            )
        etype = event.type
        return {
            "event_id": event.event_id,
            "run_id": event.run_id,
            "tenant_id": event.tenant_id,
            "seq": event.seq,
            "epoch": event.epoch,
            "producer_id": event.producer_id,
            "type": etype.value,
            "occurred_at": at,
            "node_id": event.node_id,
            "traceparent": event.traceparent,
            "payload": (_RECORD_NAME[etype], _payload_body(etype, event.payload)),
        }

    def _to_event(self, record: dict[str, Any], version: SchemaVersion, where: dict[str, Any]) -> Event:
        symbol, payload = record["type"], record["payload"]
        if symbol not in _TYPE_BY_SYMBOL:
            raise UnsupportedSchemaError(
                f"event type {symbol!r} is unknown to this reader (written as {version.label})",
                fingerprint=version.fingerprint,
                **where,
            )
        if not isinstance(payload, tuple) or _SYMBOL_BY_RECORD.get(payload[0]) != symbol:
            branch = payload[0] if isinstance(payload, tuple) else type(payload).__name__
            raise CorruptEventError(
                f"type {symbol} carries payload branch {branch}", fingerprint=version.fingerprint, **where
            )
        record["payload"] = payload[1]
        if version is not self._current:
            try:
                record = upcast(record, version.version, self._current.version)
            except (KeyError, TypeError, ValueError) as exc:
                raise CorruptEventError(
                    f"cannot upcast {version.label} {symbol}: {exc!r}",
                    fingerprint=version.fingerprint,
                    **where,
                ) from exc
        return Event(
            event_id=record["event_id"],
            run_id=record["run_id"],
            tenant_id=record["tenant_id"],
            seq=record["seq"],
            epoch=record["epoch"],
            producer_id=record["producer_id"],
            type=_TYPE_BY_SYMBOL[record["type"]],
            occurred_at=record["occurred_at"],
            payload=record["payload"],
            node_id=record["node_id"],
            traceparent=record["traceparent"],
        )

    def _invalid(self, record: dict[str, Any], exc: Exception) -> InvalidEventError:
        try:
            validate(record, self._current.parsed, raise_errors=True)
        except ValidationError as verr:
            return InvalidEventError(f"event {record['event_id']} does not fit {self._current.label}: {verr}")
        return InvalidEventError(f"event {record['event_id']} does not fit {self._current.label}: {exc!r}")


def _payload_body(etype: EventType, payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` checked against PAYLOAD_FIELDS and completed with None for absent optional fields."""
    unknown = payload.keys() - _FIELD_NAMES[etype]
    if unknown:
        name = sorted(unknown)[0]
        raise InvalidEventError(f"{etype} has no payload field {name!r}", field=f"payload.{name}")
    body: dict[str, Any] = {}
    for name, py, required in _FIELDS[etype]:
        value = payload.get(name)
        if value is None:
            if required:
                raise InvalidEventError(f"{etype} payload needs {name!r}", field=f"payload.{name}")
        elif not _fits(value, py):
            raise InvalidEventError(
                f"{etype} payload {name!r} must be {py.__name__}, got {type(value).__name__}",
                field=f"payload.{name}",
            )
        body[name] = value
    return body


def _fits(value: Any, py: type) -> bool:
    if py is bool:
        return type(value) is bool
    if py is int:
        return isinstance(value, int) and type(value) is not bool
    if py is list:
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    return isinstance(value, py)


def codec_from_settings(settings: Settings, *, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> EventCodec:
    """The codec the settings ask for: registry framing when ``settings.schema_registry_url`` is set.

    Args:
        settings: ``runjournal.core.settings.Settings`` (env ``RUNJOURNAL_SCHEMA_REGISTRY_URL``,
            ``RUNJOURNAL_TOPIC_PREFIX``).
        max_event_bytes: cap on one encoded event, bytes.

    Returns:
        An :class:`EventCodec` whose default topic is ``settings.events_topic``.
    """
    return EventCodec(
        max_event_bytes=max_event_bytes,
        schema_registry_url=settings.schema_registry_url,
        topic=settings.events_topic,
    )

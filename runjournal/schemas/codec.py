"""EventCodec: :class:`~runjournal.schemas.events.Event` ⇄ Kafka record value bytes.

Two steps, reversed on read (style note 10):

1. converter — Event ⇄ envelope record dict in the current schema's shape (payload in
   fastavro tuple notation ``(record_fullname, fields)`` so a union never takes the wrong branch);
2. framing — record ⇄ bytes. **Writers** use the configured framing: Avro single-object encoding
   by default, Confluent Schema Registry framing when a registry URL is given. **Readers** decode
   by the leading bytes, whatever is configured, so a topic may hold both (switching is reversible)::

    C3 01 | CRC-64-AVRO fingerprint, 8 B LE | Avro body      single-object (Avro spec)
    00    | schema id, 4 B big-endian       | Avro body      Confluent

On read the writer schema is found by fingerprint or id (:mod:`runjournal.schemas._writers`: shipped
versions, the registry, the ``{prefix}.schemas`` topic); fastavro resolves it to the current reader
schema (an open payload union for types this reader does not know: ``UNKNOWN`` events); upcasters
(:mod:`runjournal.schemas.upcasters`) then fix meaning for older writers.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from io import BytesIO
from typing import TYPE_CHECKING, Any

from fastavro import schemaless_writer
from fastavro.validation import ValidationError, validate

from runjournal.core.errors import ConfigError
from runjournal.schemas._avro_body import read_body
from runjournal.schemas._direct import DirectWriter
from runjournal.schemas._open_union import writer_symbol_by_branch
from runjournal.schemas._record import payload_body
from runjournal.schemas._validate import RecordValidator
from runjournal.schemas._writers import WriterSchemas
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
    from runjournal.schemas.catalog import SchemaCatalog

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "DEFAULT_TOPIC", "EventCodec", "codec_from_settings", "is_tombstone"]

#: Default cap on one encoded event, bytes: headroom below the broker's 1 MiB ``max.message.bytes``
#: for the key, headers and record-batch overhead.
DEFAULT_MAX_EVENT_BYTES = 900_000
#: Topic used for the registry subject (``{topic}-value``) when ``encode`` is not given one.
DEFAULT_TOPIC = "runjournal.events"

_HEADER_BYTES = 10
_CONFLUENT_HEADER_BYTES = 5
_UNKNOWN = EventType.UNKNOWN.value
_TYPE_BY_SYMBOL: dict[str, EventType] = {t.value: t for t in EventType if t is not EventType.UNKNOWN}
_RECORD_NAME: dict[EventType, str] = {t: payload_record_name(t.value) for t in _TYPE_BY_SYMBOL.values()}
_SYMBOL_BY_RECORD: dict[str, str] = {name: t.value for t, name in _RECORD_NAME.items()}
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
            when set, ``encode`` writes Confluent framing with the id the schema is registered under
            (looked up, never registered) and ``decode`` resolves schema ids there. None (default):
            ``encode`` writes Avro single-object encoding. ``decode`` reads both framings either way.
        schema_registry_client: an existing registry client (overrides ``schema_registry_url``).
        topic: the topic whose ``{topic}-value`` subject ``encode`` uses when given none.
        catalog: the ``{prefix}.schemas`` topic: ``encode`` publishes the writer schema there before
            the first event, ``decode`` finds unknown fingerprints (and, with no registry, ids) there.
            None: only the shipped versions (and the registry) are known.

    Raises:
        SchemaError: the published ``.avsc`` files cannot be loaded.
        ConfigError: a registry is asked for but ``runjournal[registry]`` is not installed.
    """

    def __init__(
        self,
        *,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        schema_registry_url: str | None = None,
        schema_registry_client: SchemaRegistryClient | None = None,
        topic: str = DEFAULT_TOPIC,
        catalog: SchemaCatalog | None = None,
    ) -> None:
        if max_event_bytes <= _HEADER_BYTES:
            raise ValueError(f"max_event_bytes must exceed {_HEADER_BYTES}, got {max_event_bytes}")
        versions = load_versions()
        self._current: SchemaVersion = versions[-1]
        self._validate = RecordValidator(self._current.parsed)  # type and range of every value, before writing
        self._max_event_bytes = max_event_bytes
        self._topic = topic
        self._catalog = catalog
        self._registry = None
        if schema_registry_client is not None or schema_registry_url:
            try:
                from runjournal.schemas._confluent import ConfluentWire, registry_client
            except ModuleNotFoundError as exc:
                raise ConfigError(
                    f"RUNJOURNAL_SCHEMA_REGISTRY_URL is set but the registry client is not installed ({exc.name}): "
                    "pip install 'runjournal[registry]'") from exc

            client = schema_registry_client or registry_client(schema_registry_url or "")
            self._registry = ConfluentWire(client)
        self._writers = WriterSchemas(versions, registry=self._registry, catalog=catalog)
        self._headers: dict[str, bytes] = {}
        self._header_lock = threading.Lock()
        self._branch_symbols: dict[int, dict[str, str]] = {}

    @functools.cached_property
    def _direct(self) -> DirectWriter | None:
        """The generated writer: the same bytes for the events it accepts, without walking the schema per value
        (schemas/_direct.py). Compiled on first use — a codec that only decodes (``inspect``, the console, the
        readers of the recovery job) never pays for it."""
        return DirectWriter.compile(self._current.parsed, record_names=_RECORD_NAME, contract=PAYLOAD_FIELDS,
                                    repeated=("run_id", "tenant_id", "producer_id"))

    @functools.cached_property
    def _direct_by_type(self) -> Mapping[EventType, Any]:
        """Event type → its generated writer (empty when the schema has no generated writer)."""
        return self._direct.writers if self._direct is not None else {}

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
        """The framing ``encode`` writes: ``"single-object"`` or ``"confluent"`` (``decode`` reads both)."""
        return "single-object" if self._registry is None else "confluent"

    @property
    def max_event_bytes(self) -> int:
        """The cap on one encoded event, bytes."""
        return self._max_event_bytes

    def encode(self, event: Event, *, topic: str | None = None) -> bytes:
        """Encode ``event`` with the current schema. Never returns ``b""``.

        The first call (per registry subject) publishes the writer schema to the schemas topic and
        waits for the broker's ack, so no reader ever meets an event whose schema it cannot find.
        After that, an event the generated writer accepts (``runjournal.schemas._direct``: exact types, values in
        range, ``occurred_at`` in UTC) is written by it — the same bytes — and any other goes through the checked
        path (record dict, validation, fastavro), which raises the errors below.

        Args:
            event: the event; ``occurred_at`` is written as UTC milliseconds (sub-ms truncated).
            topic: registry framing only: subject ``{topic}-value`` (default: the codec's topic).

        Returns:
            The record value: single-object (``C3 01`` + 8-byte fingerprint + body) or Confluent framed.

        Raises:
            NaiveDatetimeError: ``occurred_at`` has no timezone.
            InvalidEventError: a field is missing, unknown, of the wrong type or out of its Avro type's range
                (``.field`` names it; ``runjournal.schemas._validate``), or the type is the read-only ``UNKNOWN``.
            EventTooLargeError: the encoded size in bytes is over ``max_event_bytes``.
            UnregisteredSchemaError: registry framing: the schema is not registered under the subject.
            RegistryError: the registry or the schemas topic is unavailable; nothing was encoded.
        """
        topic = topic or self._topic
        header = self._headers.get(topic if self._registry is not None else "")  # None before the first event
        etype, data = event.type, None
        if header is not None and etype.__class__ is EventType and (write := self._direct_by_type.get(etype)):
            data = write(event, header)
        if data is None:
            data = self._encode_checked(event, topic)
        if len(data) > self._max_event_bytes:
            raise EventTooLargeError(
                size_bytes=len(data), limit_bytes=self._max_event_bytes, event_id=event.event_id,
                event_type=str(event.type)
            )
        return data

    def _encode_checked(self, event: Event, topic: str) -> bytes:
        """The checked path: record dict, :class:`RecordValidator`, then fastavro (raises as :meth:`encode`)."""
        record = self._to_record(event)
        self._validate(record)
        buf = BytesIO()
        buf.write(self._header(topic))
        try:
            schemaless_writer(buf, self._current.parsed, record)
        except _BAD_RECORD as exc:
            raise self._invalid(record, exc) from exc
        return buf.getvalue()

    def _header(self, topic: str) -> bytes:
        """The framing header for ``topic``'s events; announces the writer schema on first use."""
        key = topic if self._registry is not None else ""
        header = self._headers.get(key)
        if header is not None:
            return header
        with self._header_lock:
            schema_id = None
            if self._registry is not None:
                schema_id = self._registry.schema_id(self._current, f"{topic}-value")
                header = b"\x00" + schema_id.to_bytes(4, "big")
            else:
                header = self._current.header
            if self._catalog is not None:
                self._catalog.announce(self._current, registry_id=schema_id)
            self._headers[key] = header
        return header

    def decode(
        self,
        value: bytes | None,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> Event:
        """Decode a record value into the current :class:`Event` shape (resolved, then upcast).

        The framing is told by the leading bytes (``C3 01`` single-object, ``00`` Confluent),
        whatever framing this codec writes.

        Args:
            value: the Kafka record value. Check :func:`is_tombstone` first.
            topic, partition, offset: where it was read; only carried into errors.

        Returns:
            The event; ``occurred_at`` is an aware UTC datetime. A type this reader does not know
            comes back as ``EventType.UNKNOWN`` with ``payload = {"type": symbol, "fields": {...}}``.

        Raises:
            TombstoneError: ``value`` is None.
            CorruptEventError: empty or short value, unknown magic, truncated or trailing body, or a
                type/payload mismatch.
            UnsupportedSchemaError: a writer fingerprint or schema id no source knows, Confluent GUID
                framing, or a writer schema that cannot be resolved to the current one.
            RegistryError: the registry or the schemas topic is unavailable (transient: retry the record).
        """
        where: dict[str, Any] = {"topic": topic, "partition": partition, "offset": offset}
        if value is None:
            raise TombstoneError("tombstone (None value) has no event; check is_tombstone() first", **where)
        if value[:2] == MAGIC and len(value) > _HEADER_BYTES:
            fingerprint = int.from_bytes(value[2:_HEADER_BYTES], "little")
            (version, reader), start = self._writers.by_fingerprint(fingerprint, where), _HEADER_BYTES
        elif value[:1] == b"\x00" and len(value) > _CONFLUENT_HEADER_BYTES:
            schema_id = int.from_bytes(value[1:_CONFLUENT_HEADER_BYTES], "big")
            where["schema_id"] = schema_id
            (version, reader), start = self._writers.by_id(schema_id, where), _CONFLUENT_HEADER_BYTES
        elif value[:1] == b"\x01":
            raise UnsupportedSchemaError("Confluent GUID framing (magic 01) is not supported", **where)
        else:
            raise CorruptEventError(
                f"neither Avro single-object (C3 01) nor Confluent (00) framing: {len(value)} bytes, "
                f"starts {bytes(value[:2]).hex() or 'empty'}", **where)
        record = read_body(value, start, version, reader, where)
        return self._to_event(record, version, where)

    # -- converter --------------------------------------------------------------------------
    def _to_record(self, event: Event) -> dict[str, Any]:
        at = event.occurred_at
        if at.tzinfo is None or at.utcoffset() is None:
            raise NaiveDatetimeError(
                f"occurred_at must be timezone-aware (got naive {at!r}) for {event.event_id}"
            )
        etype = event.type
        if etype is EventType.UNKNOWN:
            raise InvalidEventError(f"event {event.event_id}: UNKNOWN is read-only (what an older reader "
                                    "decodes a newer type as); a writer never writes it", field="type")
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
            "payload": (_RECORD_NAME[etype], payload_body(etype, event.payload)),
        }

    def _to_event(self, record: dict[str, Any], version: SchemaVersion, where: dict[str, Any]) -> Event:
        symbol, payload = record["type"], record["payload"]
        if symbol == _UNKNOWN:
            return self._unknown_event(record, version, where)
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
        if 0 < version.version < self._current.version:
            try:
                record = upcast(record, version.version, self._current.version)
            except (KeyError, TypeError, ValueError) as exc:
                raise CorruptEventError(
                    f"cannot upcast {version.label} {symbol}: {exc!r}",
                    fingerprint=version.fingerprint,
                    **where,
                ) from exc
        return self._event(record, _TYPE_BY_SYMBOL[record["type"]], record["payload"])

    def _unknown_event(self, record: dict[str, Any], version: SchemaVersion, where: dict[str, Any]) -> Event:
        """A record whose type symbol this reader does not know (resolved to the enum default)."""
        payload = record["payload"]
        branch = payload[0] if isinstance(payload, tuple) else None
        symbols = self._branch_symbols.get(version.fingerprint)
        if symbols is None:
            symbols = self._branch_symbols.setdefault(version.fingerprint, writer_symbol_by_branch(version.raw))
        writer_symbol = symbols.get(branch or "")
        if branch is None or writer_symbol is None or writer_symbol in _TYPE_BY_SYMBOL:
            # The writer wrote UNKNOWN itself, or a known type's record under an unknown symbol.
            raise CorruptEventError(f"type UNKNOWN carries payload branch {branch} ({version.label})",
                                    fingerprint=version.fingerprint, **where)
        return self._event(record, EventType.UNKNOWN, {"type": writer_symbol, "fields": dict(payload[1])})

    @staticmethod
    def _event(record: dict[str, Any], etype: EventType, payload: dict[str, Any]) -> Event:
        return Event(
            event_id=record["event_id"],
            run_id=record["run_id"],
            tenant_id=record["tenant_id"],
            seq=record["seq"],
            epoch=record["epoch"],
            producer_id=record["producer_id"],
            type=etype,
            occurred_at=record["occurred_at"],
            payload=payload,
            node_id=record["node_id"],
            traceparent=record["traceparent"],
        )

    def _invalid(self, record: dict[str, Any], exc: Exception) -> InvalidEventError:
        try:
            validate(record, self._current.parsed, raise_errors=True)
        except ValidationError as verr:
            return InvalidEventError(f"event {record['event_id']} does not fit {self._current.label}: {verr}")
        return InvalidEventError(f"event {record['event_id']} does not fit {self._current.label}: {exc!r}")


def codec_from_settings(settings: Settings, *, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> EventCodec:
    """The codec the settings ask for, with the ``{prefix}.schemas`` catalog attached.

    Args:
        settings: ``runjournal.core.settings.Settings`` (env ``RUNJOURNAL_SCHEMA_REGISTRY_URL``,
            ``RUNJOURNAL_TOPIC_PREFIX``, ``RUNJOURNAL_BOOTSTRAP``).
        max_event_bytes: cap on one encoded event, bytes.

    Returns:
        An :class:`EventCodec` whose default topic is ``settings.events_topic``: Confluent framing
        when a registry URL is set, single-object otherwise; reading both either way.
    """
    from runjournal.schemas.catalog import SchemaCatalog

    return EventCodec(
        max_event_bytes=max_event_bytes,
        schema_registry_url=settings.schema_registry_url,
        topic=settings.events_topic,
        catalog=SchemaCatalog(settings),
    )

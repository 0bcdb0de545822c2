"""Confluent Schema Registry framing (``00`` + 4-byte big-endian schema id + Avro body).

Private: used by :class:`runjournal.schemas.codec.EventCodec` when a registry URL is configured.
Writing goes through ``confluent_kafka.schema_registry.avro.AvroSerializer`` (registration,
subject ``{topic}-value`` by the topic name strategy, framing). Reading parses the 5-byte
framing here and fetches the writer schema from the registry by id; the bytes are the
same ones AvroDeserializer reads (tests check both directions).
"""

from __future__ import annotations

import json
import threading
from typing import Any

from confluent_kafka.schema_registry import (
    Schema,
    SchemaRegistryClient,
    SchemaRegistryError,
    topic_subject_name_strategy,
)
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from fastavro.schema import SchemaParseException, parse_schema

from runjournal.schemas._avro_body import read_body
from runjournal.schemas.errors import CorruptEventError, InvalidEventError, RegistryError, UnsupportedSchemaError
from runjournal.schemas.versions import SchemaVersion, fingerprint_of

__all__ = ["ConfluentWire", "registry_client"]

_MOCK_CLIENTS: dict[str, SchemaRegistryClient] = {}
_MOCK_LOCK = threading.Lock()
_HEADER_BYTES = 5


def registry_client(url: str) -> SchemaRegistryClient:
    """A registry client for ``url``.

    ``mock://…`` gives an in-memory registry shared per URL within this process (tests).
    """
    if not url.startswith("mock://"):
        return SchemaRegistryClient.new_client({"url": url})
    with _MOCK_LOCK:
        if url not in _MOCK_CLIENTS:
            _MOCK_CLIENTS[url] = SchemaRegistryClient.new_client({"url": url})
        return _MOCK_CLIENTS[url]


class ConfluentWire:
    """Record dict ⇄ Confluent-framed bytes, with the writer's envelope version found by fingerprint."""

    def __init__(self, client: SchemaRegistryClient, versions: tuple[SchemaVersion, ...]) -> None:
        current = versions[-1]
        schema = Schema(current.text, "AVRO")
        self._client = client
        self._serializer = AvroSerializer(
            client,
            schema,
            conf={"auto.register.schemas": True, "subject.name.strategy": topic_subject_name_strategy},
        )
        self._by_fingerprint = {v.fingerprint: v for v in versions}
        self._current = current
        self._by_schema_id: dict[int, tuple[SchemaVersion, dict[str, Any] | None]] = {}

    def dumps(self, record: dict[str, Any], topic: str) -> bytes:
        """Serialise ``record`` (current shape, payload in tuple notation); registers the schema if new.

        Raises:
            RegistryError: the registry is unreachable or refused the schema.
            InvalidEventError: the record does not fit the schema.
        """
        ctx = SerializationContext(topic, MessageField.VALUE)
        try:
            data = self._serializer(record, ctx)
        except SchemaRegistryError as exc:
            raise RegistryError(f"schema registry refused subject {topic}-value: {exc}") from exc
        except (TypeError, ValueError, AttributeError, OverflowError, KeyError) as exc:
            raise InvalidEventError(f"event {record.get('event_id')} does not fit the schema: {exc}") from exc
        except Exception as exc:  # transport errors of the registry's HTTP client
            raise RegistryError(f"schema registry unreachable for subject {topic}-value: {exc!r}") from exc
        if not data:
            raise InvalidEventError(f"serializer produced no bytes for event {record.get('event_id')}")
        return bytes(data)

    def loads(self, value: bytes, where: dict[str, Any]) -> tuple[dict[str, Any], SchemaVersion]:
        """Deserialise to a record resolved to the current schema, plus the writer's envelope version.

        Reads the framing itself (``00`` + 4-byte big-endian schema id) and the body with the
        precompiled local schemas: AvroDeserializer re-expands the reader schema and walks it for
        data-contract tags on every call (~4k events/s here), which we do not use. The writer
        schema still comes from the registry by id (cached), and must be a known version.

        Raises:
            CorruptEventError: not Confluent framing, or an unreadable body.
            UnsupportedSchemaError: schema id unknown to the registry, or a schema that is no known version.
            RegistryError: the registry could not be reached.
        """
        if len(value) <= _HEADER_BYTES or value[0] != 0:
            if value[:1] == b"\x01":
                raise UnsupportedSchemaError("Confluent GUID framing (magic 01) is not supported", **where)
            raise CorruptEventError(f"not Confluent framing: starts {bytes(value[:5]).hex()!r}", **where)
        schema_id = int.from_bytes(value[1:_HEADER_BYTES], "big")
        version, reader = self._reader_of(schema_id, where)
        return read_body(value, _HEADER_BYTES, version, reader, {**where, "schema_id": schema_id}), version

    def _reader_of(
        self, schema_id: int, where: dict[str, Any]
    ) -> tuple[SchemaVersion, dict[str, Any] | None]:
        known = self._by_schema_id.get(schema_id)
        if known is None:
            version = self._version_of(schema_id, where)
            known = (version, None if version is self._current else self._current.parsed)
            self._by_schema_id[schema_id] = known
        return known

    def _version_of(self, schema_id: int, where: dict[str, Any]) -> SchemaVersion:
        try:
            schema = self._client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise UnsupportedSchemaError(
                    f"schema id {schema_id} is unknown to the registry", schema_id=schema_id, **where
                ) from exc
            raise RegistryError(f"schema registry failed reading schema id {schema_id}: {exc}") from exc
        except Exception as exc:  # transport errors of the registry's HTTP client
            raise RegistryError(
                f"schema registry unreachable reading schema id {schema_id}: {exc!r}"
            ) from exc
        try:
            fingerprint = fingerprint_of(parse_schema(json.loads(schema.schema_str or "")))
        except (ValueError, SchemaParseException) as exc:
            raise UnsupportedSchemaError(
                f"schema id {schema_id} is not a valid Avro schema", **where
            ) from exc
        version = self._by_fingerprint.get(fingerprint)
        if version is None:
            raise UnsupportedSchemaError(
                f"schema id {schema_id} (fingerprint {fingerprint:#018x}) is no known envelope version",
                fingerprint=fingerprint,
                schema_id=schema_id,
                **where,
            )
        return version

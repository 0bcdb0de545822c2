"""Confluent Schema Registry framing (``00`` + 4-byte big-endian schema id + Avro body).

Private: used by :class:`schemas.codec.EventCodec` when a registry URL is configured.
Serialisation goes through ``confluent_kafka.schema_registry.avro`` AvroSerializer /
AvroDeserializer; the subject is ``{topic}-value`` (topic name strategy).
"""

from __future__ import annotations

import json
import threading
from typing import Any

from confluent_kafka.schema_registry import (
    Schema,
    SchemaRegistryClient,
    SchemaRegistryError,
    prefix_schema_id_deserializer,
    topic_subject_name_strategy,
)
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from fastavro.read import SchemaResolutionError
from fastavro.schema import SchemaParseException, parse_schema

from schemas.errors import CorruptEventError, InvalidEventError, RegistryError, UnsupportedSchemaError
from schemas.versions import SchemaVersion, fingerprint_of

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
        self._deserializer = AvroDeserializer(
            client,
            schema,
            return_record_name=True,
            conf={
                "subject.name.strategy": topic_subject_name_strategy,
                "schema.id.deserializer": prefix_schema_id_deserializer,
            },
        )
        self._by_fingerprint = {v.fingerprint: v for v in versions}
        self._by_schema_id: dict[int, SchemaVersion] = {}

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
        if not data:
            raise InvalidEventError(f"serializer produced no bytes for event {record.get('event_id')}")
        return data

    def loads(self, value: bytes, topic: str, where: dict[str, Any]) -> tuple[dict[str, Any], SchemaVersion]:
        """Deserialise to a record resolved to the current schema, plus the writer's envelope version.

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
        version = self._version_of(schema_id, where)
        ctx = SerializationContext(topic, MessageField.VALUE)
        try:
            record = self._deserializer(value, ctx)
        except SchemaResolutionError as exc:
            raise UnsupportedSchemaError(
                f"cannot resolve {version.label}: {exc}",
                fingerprint=version.fingerprint,
                schema_id=schema_id,
                **where,
            ) from exc
        except SchemaRegistryError as exc:
            raise RegistryError(f"schema registry failed reading schema id {schema_id}: {exc}") from exc
        except Exception as exc:  # any other failure to parse foreign bytes means corrupt input
            raise CorruptEventError(
                f"unreadable Avro body: {type(exc).__name__}: {exc}", schema_id=schema_id, **where
            ) from exc
        if not isinstance(record, dict):
            raise CorruptEventError(f"body decoded to {type(record).__name__}, not a record", **where)
        return record, version

    def _version_of(self, schema_id: int, where: dict[str, Any]) -> SchemaVersion:
        known = self._by_schema_id.get(schema_id)
        if known is not None:
            return known
        try:
            schema = self._client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise UnsupportedSchemaError(
                    f"schema id {schema_id} is unknown to the registry", schema_id=schema_id, **where
                ) from exc
            raise RegistryError(f"schema registry failed reading schema id {schema_id}: {exc}") from exc
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
        self._by_schema_id[schema_id] = version
        return version

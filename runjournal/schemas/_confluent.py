"""Confluent Schema Registry framing (``00`` + 4-byte big-endian schema id + Avro body).

Private: used by :class:`runjournal.schemas.codec.EventCodec` when a registry URL is configured.

* Writing never registers: the writer **looks up** the id of its (already registered) schema under
  subject ``{topic}-value`` once per subject and caches it. Versions are registered by the publish
  tool (``runjournal schemas publish --registry``), never by producers on the hot path.
* Reading fetches the writer schema text by id (cached by the client and by the codec).
  The body is read with our precompiled schemas; the bytes are the ones ``AvroSerializer`` /
  ``AvroDeserializer`` write and read (tests check both directions).

Errors are split by kind: a registry that cannot be reached or answers 5xx is a
:class:`RegistryError` (transient: wait and retry the same record); an id or subject the registry
does not have is :class:`UnsupportedSchemaError` / :class:`UnregisteredSchemaError` (content).
"""

from __future__ import annotations

import threading
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, SchemaRegistryError

from runjournal.schemas.errors import RegistryError, UnregisteredSchemaError, UnsupportedSchemaError
from runjournal.schemas.versions import SchemaVersion

__all__ = ["HEADER_BYTES", "ConfluentWire", "registry_client"]

#: ``00`` + 4-byte big-endian schema id.
HEADER_BYTES = 5
_TIMEOUT_S = 10
#: The client's own retries are kept short (one retry after 250 ms): waiting out an outage is the
#: consumers' one failure policy's job, not a second, hidden backoff inside every decode (the client's
#: default is 3 retries with exponential waits, ~7 s per failed call against a stopped registry).
_CLIENT_RETRIES = {"max.retries": 1, "retries.wait.ms": 250, "retries.max.wait.ms": 1000}


def registry_client(url: str) -> SchemaRegistryClient:
    """A registry client for ``url`` (``http://host:port/apis/ccompat/v6`` for Apicurio).

    Raises:
        RegistryError: the URL is not usable (the client refuses its configuration).
    """
    try:
        return SchemaRegistryClient({"url": url, "timeout": _TIMEOUT_S, **_CLIENT_RETRIES})
    except (ValueError, TypeError) as exc:
        raise RegistryError(f"bad schema registry URL {url!r}: {exc}") from exc


def _is_missing(exc: SchemaRegistryError) -> bool:
    return exc.http_status_code == 404


def _transient(exc: SchemaRegistryError) -> bool:
    status = exc.http_status_code
    return status is None or status < 0 or status >= 500 or status in (408, 429)


class ConfluentWire:
    """Schema id lookup (writers) and schema text by id (readers) for one registry."""

    def __init__(self, client: SchemaRegistryClient) -> None:
        self._client = client
        self._ids: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    @property
    def client(self) -> SchemaRegistryClient:
        """The registry client."""
        return self._client

    def schema_id(self, version: SchemaVersion, subject: str) -> int:
        """The id under which ``version``'s schema is registered in ``subject`` (looked up once, cached).

        Raises:
            UnregisteredSchemaError: the subject does not hold this schema (publish it first).
            RegistryError: the registry is unreachable or failed.
        """
        key = (subject, version.fingerprint)
        with self._lock:
            known = self._ids.get(key)
        if known is not None:
            return known
        try:
            registered = self._client.lookup_schema(subject, Schema(version.text, "AVRO"))
        except SchemaRegistryError as exc:
            if _is_missing(exc):
                raise UnregisteredSchemaError(
                    f"schema {version.label} is not registered under subject {subject}: register it with "
                    f"`runjournal schemas publish --registry` (producers never register)") from exc
            raise RegistryError(f"schema registry failed looking up {version.label} in {subject}: {exc}") from exc
        except Exception as exc:  # transport errors of the registry's HTTP client
            raise RegistryError(f"schema registry unreachable looking up {subject}: {exc!r}") from exc
        if registered.schema_id is None:
            raise RegistryError(f"schema registry answered no id for {version.label} in {subject}")
        schema_id = int(registered.schema_id)
        with self._lock:
            self._ids[key] = schema_id
        return schema_id

    def schema_text(self, schema_id: int, where: dict[str, Any]) -> str:
        """The writer schema registered under ``schema_id``.

        Raises:
            UnsupportedSchemaError: the registry has no such id.
            RegistryError: the registry is unreachable or failed (5xx, timeout).
        """
        where = {**where, "schema_id": schema_id}
        try:
            schema = self._client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if _is_missing(exc):
                raise UnsupportedSchemaError(f"schema id {schema_id} is unknown to the registry", **where) from exc
            if _transient(exc):
                raise RegistryError(f"schema registry failed reading schema id {schema_id}: {exc}") from exc
            raise UnsupportedSchemaError(f"schema registry refused schema id {schema_id}: {exc}", **where) from exc
        except Exception as exc:  # transport errors of the registry's HTTP client
            raise RegistryError(f"schema registry unreachable reading schema id {schema_id}: {exc!r}") from exc
        return schema.schema_str or ""

"""Writer schemas by fingerprint (single-object) or registry id (Confluent), with the reader to resolve each.

Private: used by :class:`runjournal.schemas.codec.EventCodec`. Lookup order:

* fingerprint: the published versions this package ships → the ``{prefix}.schemas`` topic
  (:class:`~runjournal.schemas.catalog.SchemaCatalog`);
* registry id: the registry, when one is configured → else the schemas topic's ``id:`` records.

Whatever is found is cached for the life of the codec (a schema under a fingerprint or id never
changes). Each writer gets the reader schema it is resolved with: None when it *is* the current
version (no resolution), the current schema otherwise, opened by :mod:`runjournal.schemas._open_union`
when the writer has type symbols this reader does not know.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

from fastavro.schema import SchemaParseException, parse_schema

from runjournal.schemas._open_union import open_reader_raw
from runjournal.schemas.errors import SchemaError, UnsupportedSchemaError
from runjournal.schemas.versions import SchemaVersion, foreign_version

if TYPE_CHECKING:  # the registry client is the optional [registry] extra; the catalog needs only the core
    from runjournal.schemas._confluent import ConfluentWire
    from runjournal.schemas.catalog import SchemaCatalog

__all__ = ["Writer", "WriterSchemas"]

#: ``(writer version, reader schema to resolve it with, or None for no resolution)``.
Writer = tuple[SchemaVersion, dict[str, Any] | None]


class WriterSchemas:
    """Finds and caches writer schemas; thread-safe.

    Args:
        versions: the published versions this package ships, oldest first (the last is current).
        registry: the registry wire, when a registry URL is configured.
        catalog: the ``{prefix}.schemas`` topic, when the codec was built from settings.
    """

    def __init__(self, versions: tuple[SchemaVersion, ...], *, registry: ConfluentWire | None = None,
                 catalog: SchemaCatalog | None = None) -> None:
        self._current = versions[-1]
        self._shipped = {v.fingerprint: v for v in versions}
        self._registry = registry
        self._catalog = catalog
        self._lock = threading.Lock()
        self._by_fingerprint: dict[int, Writer] = {}
        self._by_id: dict[int, Writer] = {}
        for version in versions:
            self._remember(version)

    def by_fingerprint(self, fingerprint: int, where: dict[str, Any]) -> Writer:
        """The writer schema whose CRC-64-AVRO fingerprint is ``fingerprint``.

        Raises:
            UnsupportedSchemaError: no shipped version and no schemas-topic record has it.
            RegistryError: the schemas topic could not be read (transient).
        """
        known = self._by_fingerprint.get(fingerprint)
        if known is not None:
            return known
        text = self._catalog.schema_text(fingerprint) if self._catalog is not None else None
        if text is None:
            source = f" (nor in {self._catalog.topic})" if self._catalog is not None else ""
            raise UnsupportedSchemaError(
                f"unknown writer schema fingerprint {fingerprint:#018x}{source}", fingerprint=fingerprint, **where)
        writer = self._parse(text, self._catalog.topic if self._catalog else "?", where)
        if writer.fingerprint != fingerprint:
            raise UnsupportedSchemaError(
                f"the schema published under fingerprint {fingerprint:#018x} has fingerprint "
                f"{writer.fingerprint:#018x}", fingerprint=fingerprint, **where)
        return self._remember(writer)

    def by_id(self, schema_id: int, where: dict[str, Any]) -> Writer:
        """The writer schema registered under Confluent schema id ``schema_id``.

        Raises:
            UnsupportedSchemaError: the registry (or, without one, the schemas topic) has no such id.
            RegistryError: the registry or the schemas topic is unavailable (transient).
        """
        known = self._by_id.get(schema_id)
        if known is not None:
            return known
        where = {**where, "schema_id": schema_id}
        if self._registry is not None:
            text = self._registry.schema_text(schema_id, where)
            writer = self._parse(text, f"registry id {schema_id}", where)
            found = self._by_fingerprint.get(writer.fingerprint) or self._remember(writer)
        else:
            fingerprint = self._catalog.fingerprint_of_id(schema_id) if self._catalog is not None else None
            if fingerprint is None:
                raise UnsupportedSchemaError(
                    f"schema id {schema_id}: no schema registry is configured and no writer recorded that id"
                    + (f" in {self._catalog.topic}" if self._catalog is not None else ""), **where)
            found = self.by_fingerprint(fingerprint, where)
        with self._lock:
            self._by_id[schema_id] = found
        return found

    def _parse(self, text: str, source: str, where: dict[str, Any]) -> SchemaVersion:
        try:
            writer = foreign_version(text, source)
        except SchemaError as exc:
            raise UnsupportedSchemaError(str(exc), **where) from exc
        return self._shipped.get(writer.fingerprint, writer)

    def _remember(self, writer: SchemaVersion) -> Writer:
        if writer is self._current:
            entry: Writer = (writer, None)
        else:
            entry = (writer, self._reader_for(writer))
        with self._lock:
            return self._by_fingerprint.setdefault(writer.fingerprint, entry)

    def _reader_for(self, writer: SchemaVersion) -> dict[str, Any]:
        raw = open_reader_raw(self._current.raw, writer.raw)
        if raw is self._current.raw:
            return self._current.parsed
        try:
            parsed = parse_schema(json.loads(json.dumps(raw)))
        except (SchemaParseException, ValueError, TypeError):
            return self._current.parsed  # resolution then fails on the new type's records: quarantined
        return parsed if isinstance(parsed, dict) else self._current.parsed

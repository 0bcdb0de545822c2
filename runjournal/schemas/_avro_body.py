"""Read one Avro binary body (after whatever framing) into a record resolved to the reader schema.

Private: shared by the single-object and the Confluent framings of :mod:`runjournal.schemas.codec`.
"""

from __future__ import annotations

from io import BytesIO
from typing import Any

from fastavro import schemaless_reader
from fastavro.read import SchemaResolutionError

from runjournal.schemas.errors import CorruptEventError, UnsupportedSchemaError
from runjournal.schemas.versions import SchemaVersion

__all__ = ["read_body"]

# Errors fastavro raises on bytes that are not a valid body (EOFError: truncated; IndexError: bad
# union/enum index; ValueError incl. UnicodeDecodeError: bad UTF-8 or out-of-range timestamp).
_BAD_BODY = (EOFError, IndexError, ValueError, OverflowError, KeyError, TypeError, MemoryError)


def read_body(
    value: bytes,
    start: int,
    writer: SchemaVersion,
    reader: dict[str, Any] | None,
    where: dict[str, Any],
) -> dict[str, Any]:
    """Decode ``value[start:]`` written with ``writer``, resolved to ``reader`` (None: no resolution).

    The payload union comes back in tuple notation ``(record_fullname, fields)``.

    Raises:
        UnsupportedSchemaError: the writer cannot be resolved to the reader.
        CorruptEventError: the body is truncated, malformed, or followed by trailing bytes.
    """
    buf = BytesIO(value)
    buf.seek(start)
    try:
        record = schemaless_reader(buf, writer.parsed, reader, return_record_name=True)
    except SchemaResolutionError as exc:
        raise UnsupportedSchemaError(
            f"cannot resolve writer {writer.label} to the current schema: {exc}",
            fingerprint=writer.fingerprint,
            **where,
        ) from exc
    except _BAD_BODY as exc:
        raise CorruptEventError(
            f"unreadable {writer.label} body: {type(exc).__name__}: {exc}",
            fingerprint=writer.fingerprint,
            **where,
        ) from exc
    if buf.tell() != len(value):
        raise CorruptEventError(
            f"{len(value) - buf.tell()} trailing bytes after the {writer.label} body",
            fingerprint=writer.fingerprint,
            **where,
        )
    if not isinstance(record, dict):
        raise CorruptEventError(f"the {writer.label} body is not a record", fingerprint=writer.fingerprint, **where)
    return record

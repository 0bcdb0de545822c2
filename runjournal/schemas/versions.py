"""The published envelope schema versions, loaded from ``schemas/avro/envelope/v<N>.avsc``.

Files are read relative to this module (never the current directory), parsed once with
``fastavro.parse_schema`` and identified by the CRC-64-AVRO fingerprint of their Parsing
Canonical Form (Avro spec § Schema Fingerprints), the same number the single-object header carries.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from fastavro.schema import SchemaParseException, fingerprint, parse_schema, to_parsing_canonical_form

from runjournal.schemas.errors import SchemaError

__all__ = [
    "ENVELOPE_DIR",
    "MAGIC",
    "NAMESPACE",
    "SchemaVersion",
    "current_version",
    "fingerprint_of",
    "foreign_version",
    "load_version",
    "load_versions",
    "payload_record_name",
]

#: Directory of the envelope's published versions, one self-contained file per version.
ENVELOPE_DIR = Path(__file__).resolve().parent / "avro" / "envelope"
#: Avro namespace of every named type (fixed forever).
NAMESPACE = "runjournal"
#: The two marker bytes that open an Avro single-object encoded value.
MAGIC = b"\xc3\x01"

_VERSION_FILE = re.compile(r"v(\d+)\.avsc")


def payload_record_name(symbol: str) -> str:
    """Full name of a type symbol's payload record.

    ``TOOL_CALL_INTENDED`` → ``runjournal.ToolCallIntendedPayload``.
    """
    return f"{NAMESPACE}." + "".join(word.capitalize() for word in symbol.split("_")) + "Payload"


@dataclass(frozen=True, slots=True, eq=False)
class SchemaVersion:
    """One published envelope schema version."""

    version: int
    """Version number, from the file name ``v<N>.avsc`` (1-based); 0 for a writer schema this reader
    does not ship (found by fingerprint or registry id, see :func:`foreign_version`)."""
    path: Path
    """The ``.avsc`` file it was read from (for a foreign writer: a pseudo path naming its source)."""
    raw: dict[str, Any]
    """The schema JSON as published (docs, aliases and defaults included)."""
    parsed: dict[str, Any]
    """``fastavro.parse_schema(raw)``: what the fastavro readers and writers take."""
    canonical_form: str
    """Avro Parsing Canonical Form (no docs, aliases or defaults)."""
    fingerprint: int
    """CRC-64-AVRO of ``canonical_form`` as an unsigned 64-bit int (little-endian on the wire)."""

    @property
    def label(self) -> str:
        """``v<N>``, or ``writer 0x<fingerprint>`` for a writer schema this reader does not ship."""
        return f"v{self.version}" if self.version else f"writer {self.fingerprint:#018x}"

    @property
    def header(self) -> bytes:
        """The 10-byte single-object header: ``C3 01`` + fingerprint, 8 bytes little-endian."""
        return MAGIC + self.fingerprint.to_bytes(8, "little")

    @property
    def text(self) -> str:
        """The schema as a JSON string (what a schema registry is given)."""
        return json.dumps(self.raw)


def fingerprint_of(parsed: dict[str, Any] | list[Any] | str) -> int:
    """CRC-64-AVRO fingerprint (unsigned 64-bit int) of a parsed schema's canonical form."""
    digest_hex = fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO")
    # fastavro renders the 8 fingerprint bytes in wire (little-endian) order.
    return int.from_bytes(bytes.fromhex(digest_hex), "little")


def load_version(path: Path, version: int | None = None) -> SchemaVersion:
    """Read and parse one ``.avsc`` file.

    Args:
        path: the file.
        version: its version number; default: from the file name ``v<N>.avsc`` (else 0).

    Returns:
        The parsed :class:`SchemaVersion`.

    Raises:
        SchemaError: the file is missing, not JSON or not a valid Avro schema.
    """
    if version is None:
        match = _VERSION_FILE.fullmatch(path.name)
        version = int(match[1]) if match else 0
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        parsed = parse_schema(raw)
    except (OSError, ValueError, SchemaParseException) as exc:
        raise SchemaError(f"cannot load Avro schema {path}: {exc}") from exc
    canonical = to_parsing_canonical_form(parsed)
    if not isinstance(raw, dict) or not isinstance(parsed, dict):
        raise SchemaError(f"cannot load Avro schema {path}: the top level is not a record")
    return SchemaVersion(version, path, raw, parsed, canonical, fingerprint_of(parsed))


def foreign_version(text: str, source: str) -> SchemaVersion:
    """A writer schema this reader does not ship (from the registry or the ``{prefix}.schemas`` topic).

    Args:
        text: the schema's JSON text.
        source: where it came from (``registry id 7``, ``t.schemas``); kept as the pseudo ``path``.

    Returns:
        A :class:`SchemaVersion` with ``version`` 0.

    Raises:
        SchemaError: not JSON, not a valid Avro schema, or not a record at the top level.
    """
    try:
        raw = json.loads(text)
        parsed = parse_schema(raw)
    except (ValueError, TypeError, SchemaParseException) as exc:
        raise SchemaError(f"writer schema from {source} is not a valid Avro schema: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(parsed, dict):
        raise SchemaError(f"writer schema from {source} is not a record at the top level")
    return SchemaVersion(0, Path(source), raw, parsed, to_parsing_canonical_form(parsed), fingerprint_of(parsed))


@cache
def load_versions(directory: Path = ENVELOPE_DIR) -> tuple[SchemaVersion, ...]:
    """Every envelope version in ``directory``, oldest first (cached per directory).

    Raises:
        SchemaError: no ``v<N>.avsc`` file, a gap in the numbering, or two versions with the same fingerprint.
    """
    found = sorted(
        (int(m[1]), p) for p in directory.glob("v*.avsc") if (m := _VERSION_FILE.fullmatch(p.name))
    )
    if not found:
        raise SchemaError(f"no envelope schema v<N>.avsc in {directory}")
    numbers = [n for n, _ in found]
    if numbers != list(range(1, len(found) + 1)):
        raise SchemaError(f"envelope versions in {directory} must be v1..vN without gaps, found {numbers}")
    versions = tuple(load_version(path, n) for n, path in found)
    fingerprints = {v.fingerprint for v in versions}
    if len(fingerprints) != len(versions):
        raise SchemaError(f"two envelope versions in {directory} have the same canonical form")
    return versions


def current_version() -> SchemaVersion:
    """The newest published envelope version: the one every writer uses and every reader resolves to."""
    return load_versions()[-1]

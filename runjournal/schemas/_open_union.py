"""The open payload union: how an older reader reads an event type it does not know.

Private helper of :mod:`runjournal.schemas.codec` and :mod:`runjournal.schemas.compat` (one rule, used by
both, so the gate checks exactly what the codec does).

Avro's resolution rules close a union: a writer branch the reader's union lacks fails the read.
An envelope version that adds an event type appends a symbol to ``EventType`` *and* a payload
record to the ``payload`` union, so a strict older reader could read none of that type's records.
runjournal's readers hold the writer's schema (shipped, or found by fingerprint / registry id), so
they resolve with the reader schema **plus the writer's payload records of the symbols the reader
does not know**: the enum maps the symbol to the reader's default ``UNKNOWN``, the payload is read
with the writer's own record, and the codec hands out an ``UNKNOWN`` event carrying both. Nothing
else is relaxed: a changed record of a known type, a new required field, a removed field without a
default still fail (the gate refuses them first).
"""

from __future__ import annotations

import copy
from typing import Any

from fastavro.schema import parse_schema

from runjournal.schemas.versions import payload_record_name

__all__ = ["open_reader_raw", "type_symbols", "writer_symbol_by_branch"]

_UNKNOWN = "UNKNOWN"


def _field(schema: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((f for f in schema.get("fields", ()) if f.get("name") == name), None)


def type_symbols(raw: dict[str, Any]) -> list[str]:
    """The ``type`` enum's symbols of an envelope schema (raw JSON form); empty when there is none."""
    field = _field(raw, "type")
    enum = field["type"] if field else None
    return list(enum.get("symbols", ())) if isinstance(enum, dict) else []


def writer_symbol_by_branch(raw: dict[str, Any]) -> dict[str, str]:
    """``payload record full name → type symbol`` for every symbol of a writer's envelope schema."""
    return {payload_record_name(symbol): symbol for symbol in type_symbols(raw) if symbol != _UNKNOWN}


def _branches(raw: dict[str, Any]) -> list[Any]:
    field = _field(raw, "payload")
    if field is None:
        return []
    kind = field["type"]
    return kind if isinstance(kind, list) else [kind]


def open_reader_raw(reader_raw: dict[str, Any], writer_raw: dict[str, Any]) -> dict[str, Any]:
    """The reader schema (raw JSON form) to resolve ``writer_raw`` with under the open payload union.

    Args:
        reader_raw: the reader's envelope schema as published.
        writer_raw: the writer's envelope schema.

    Returns:
        ``reader_raw`` itself when the writer has no type symbol the reader lacks; otherwise a copy
        whose ``payload`` union also holds the writer's payload record of each such symbol (named
        types inlined, so the copy stands alone).
    """
    known = set(type_symbols(reader_raw))
    new_records = {payload_record_name(s) for s in type_symbols(writer_raw) if s not in known and s != _UNKNOWN}
    if not new_records:
        return reader_raw
    expanded = parse_schema(writer_raw, expand=True, _write_hint=False)
    if not isinstance(expanded, dict):
        return reader_raw
    have = {_full_name(b, reader_raw.get("namespace")) for b in _branches(reader_raw)}
    extra = [b for b in _branches(expanded)
             if isinstance(b, dict) and b.get("name") in new_records and b["name"] not in have]
    if not extra:
        return reader_raw
    out = copy.deepcopy(reader_raw)
    payload = _field(out, "payload")
    assert payload is not None  # _branches found the field above (extra is not empty)
    payload["type"] = [*_branches(out), *extra]
    return out


def _full_name(branch: Any, enclosing: str | None) -> str:
    if not isinstance(branch, dict):
        return str(branch)
    name = str(branch.get("name", ""))
    namespace = branch.get("namespace") or enclosing
    return name if "." in name or not namespace else f"{namespace}.{name}"

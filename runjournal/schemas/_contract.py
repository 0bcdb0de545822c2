"""Does the newest published envelope schema match the Python contract in :mod:`runjournal.schemas.events`?

Private helper of :mod:`runjournal.schemas.compat`. ``runjournal.schemas.events`` (Event, EventType, PAYLOAD_FIELDS)
and the newest ``.avsc`` describe the same thing; this lists every place they disagree.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from runjournal.schemas._resolution import kind, short_name
from runjournal.schemas.events import KNOWN_TYPES, PAYLOAD_FIELDS, Event
from runjournal.schemas.versions import payload_record_name

__all__ = ["contract_findings"]

_AVRO_KINDS: dict[type, set[str]] = {
    str: {"string"},
    bool: {"boolean"},
    int: {"int", "long"},
    list: {"array"},
}


def contract_findings(expanded: dict[str, Any]) -> list[tuple[str, str]]:
    """``(path, message)`` for each disagreement between an expanded envelope schema and runjournal.schemas.events."""
    fields = {f["name"]: f for f in expanded["fields"]}
    event_fields = {f.name for f in dataclasses.fields(Event)}
    out = [
        ("Event." + n, "in the schema but not in runjournal.schemas.events.Event")
        for n in sorted(fields.keys() - event_fields)
    ]
    out += [
        ("Event." + n, "in runjournal.schemas.events.Event but not in the schema")
        for n in sorted(event_fields - fields.keys())
    ]
    if "type" in fields and kind(fields["type"]["type"]) == "enum":
        symbols = [s for s in fields["type"]["type"]["symbols"] if s != "UNKNOWN"]
        if symbols != [t.value for t in KNOWN_TYPES]:
            out.append(
                ("Event.type", f"enum symbols {symbols} differ from EventType (same names, same order)")
            )
    branches = fields["payload"]["type"] if "payload" in fields else []
    by_name = {b["name"]: b for b in branches if kind(b) == "record"}
    for etype, spec in PAYLOAD_FIELDS.items():
        record = by_name.get(payload_record_name(etype.value))
        path = f"Event.payload<{payload_record_name(etype.value).rpartition('.')[2]}>"
        if record is None:
            out.append((path, f"no payload record for {etype.value}"))
            continue
        out += _payload_findings(record, spec, path)
    return out


def _payload_findings(
    record: dict[str, Any], spec: dict[str, tuple[type, bool]], path: str
) -> list[tuple[str, str]]:
    fields = {f["name"]: f for f in record["fields"]}
    out = [(f"{path}.{n}", "not in PAYLOAD_FIELDS") for n in sorted(fields.keys() - spec.keys())]
    out += [
        (f"{path}.{n}", "in PAYLOAD_FIELDS but not in the schema")
        for n in sorted(spec.keys() - fields.keys())
    ]
    for name in sorted(spec.keys() & fields.keys()):
        py, required = spec[name]
        avro = fields[name]["type"]
        if not required:
            if (
                kind(avro) != "union"
                or len(avro) != 2
                or avro[0] != "null"
                or fields[name].get("default", 0) is not None
            ):
                out.append((f"{path}.{name}", 'optional field must be ["null", T] with default null'))
                continue
            avro = avro[1]
        if kind(avro) not in _AVRO_KINDS[py]:
            out.append((f"{path}.{name}", f"Avro {short_name(avro)} does not carry Python {py.__name__}"))
        elif py is list and kind(avro["items"]) != "string":
            out.append((f"{path}.{name}", "must be array<string>"))
    return out

"""A writer one envelope version ahead of this package: what a newly deployed agent writes in a rolling upgrade.

The candidate ``v3`` is today's newest ``.avsc`` plus what a real next version would add: an event
type appended after ``UNKNOWN`` (``NODE_HEARTBEAT``, with its payload record) and an optional envelope
field (``labels``). The writer frames its records exactly as :class:`~runjournal.schemas.EventCodec`
does and announces its schema through the product's own :class:`~runjournal.schemas.catalog.SchemaCatalog`
(or looks its id up in the registry), so today's readers meet what a v3 agent would publish — without
the v3 schema in their package.
"""

from __future__ import annotations

import copy
import json
import uuid
from datetime import UTC, datetime, timedelta
from io import BytesIO
from pathlib import Path
from typing import Any

from fastavro import schemaless_writer

from runjournal.core.settings import Settings
from runjournal.schemas.catalog import SchemaCatalog
from runjournal.schemas.versions import SchemaVersion, current_version, load_version, payload_record_name

NEW_TYPE = "NODE_HEARTBEAT"
NEXT_VERSION = current_version().version + 1
"""The version number a candidate gets: the one after the newest published envelope."""
_AT = datetime(2026, 2, 1, tzinfo=UTC)


def write_candidate(directory: Path, *, new_type: bool = True, optional_field: bool = True,
                    breaking: str | None = None) -> Path:
    """Write ``v<N+1>.avsc`` (a candidate next version: :data:`NEXT_VERSION`) into ``directory``; return its path.

    Args:
        new_type: append ``NODE_HEARTBEAT`` (symbol after UNKNOWN + payload record).
        optional_field: add ``labels: ["null", "string"] = null`` to the envelope.
        breaking: ``"required-field"`` (a new field without default) or ``"int-to-string"`` (``epoch``).
    """
    raw = copy.deepcopy(current_version().raw)
    raw["doc"] = "candidate next envelope version (test)"
    fields = raw["fields"]
    by_name = {f["name"]: f for f in fields}
    if new_type:
        by_name["type"]["type"]["symbols"].append(NEW_TYPE)
        by_name["payload"]["type"].append({
            "type": "record", "name": payload_record_name(NEW_TYPE).rpartition(".")[2],
            "fields": [{"name": "node_path", "type": "string"},
                       {"name": "progress", "type": ["null", "string"], "default": None}]})
    if optional_field:
        fields.insert(len(fields) - 1, {"name": "labels", "type": ["null", "string"], "default": None})
    if breaking == "required-field":
        fields.insert(len(fields) - 1, {"name": "region", "type": "string"})
    elif breaking == "int-to-string":
        by_name["epoch"]["type"] = "string"
    path = directory / f"v{NEXT_VERSION}.avsc"
    path.write_text(json.dumps(raw, indent=2))
    return path


class NewerWriter:
    """Writes records with a candidate schema, announcing it (or using its registry id) first.

    Args:
        settings: where the topics are; ``schema_registry_url`` set → Confluent framing under
            ``{events_topic}-value`` (the candidate must be registered there already).
        candidate: the ``.avsc`` written by :func:`write_candidate`.
    """

    def __init__(self, settings: Settings, candidate: Path) -> None:
        self.version: SchemaVersion = load_version(candidate, NEXT_VERSION)
        self.catalog = SchemaCatalog(settings)
        self.settings = settings
        self._header: bytes | None = None

    def header(self) -> bytes:
        """The framing header; the first call announces the schema (and its id) before any event."""
        if self._header is None:
            schema_id = None
            if self.settings.schema_registry_url:
                from runjournal.schemas._confluent import ConfluentWire, registry_client

                wire = ConfluentWire(registry_client(self.settings.schema_registry_url))
                schema_id = wire.schema_id(self.version, f"{self.settings.events_topic}-value")
                self._header = b"\x00" + schema_id.to_bytes(4, "big")
            else:
                self._header = self.version.header
            self.catalog.announce(self.version, registry_id=schema_id)
        return self._header

    def record(self, run_id: str, seq: int, symbol: str, payload: dict[str, Any], *, node_id: str | None = None,
               labels: str | None = None) -> tuple[str, bytes]:
        """``(key, value)`` of one event written with the candidate schema."""
        envelope: dict[str, Any] = {
            "event_id": str(uuid.uuid4()), "run_id": run_id, "tenant_id": "acme", "seq": seq, "epoch": 1,
            "producer_id": "agent-v3", "type": symbol, "occurred_at": _AT + timedelta(seconds=seq),
            "node_id": node_id, "traceparent": None, "payload": (payload_record_name(symbol), payload),
        }
        if any(f["name"] == "labels" for f in self.version.raw["fields"]):
            envelope["labels"] = labels
        body = BytesIO()
        schemaless_writer(body, self.version.parsed, envelope)
        return f"{run_id}:1:{seq}", self.header() + body.getvalue()


def v3_run(writer: NewerWriter, run_id: str) -> list[tuple[str, bytes]]:
    """A complete run as a v3 agent publishes it: its new event type in the middle, the new field set."""
    return [
        writer.record(run_id, 1, "RUN_STARTED", {"agent": "airline", "input_json": "{}", "user_id": None},
                      labels="canary"),
        writer.record(run_id, 2, "NODE_STARTED", {"node_path": "main", "attempt": 1}, node_id="main"),
        writer.record(run_id, 3, NEW_TYPE, {"node_path": "main", "progress": "50%"}, node_id="main"),
        writer.record(run_id, 4, "NODE_SUCCEEDED", {"node_path": "main", "output_digest": None}, node_id="main"),
        writer.record(run_id, 5, "RUN_SUCCEEDED", {"output_json": '"done"'}, labels="canary"),
    ]

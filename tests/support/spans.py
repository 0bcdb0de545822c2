"""OpenTelemetry test helpers: a span exporter that appends finished spans to a JSON-lines file (a SIGKILLed
child's spans survive: each is written when it ends), and readers that turn spans into comparable dicts."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


def span_dict(span: ReadableSpan) -> dict[str, Any]:
    """A finished span as plain data: name, hex ids, parent span id, links, attributes, event names, status."""
    ctx = span.get_span_context()
    return {
        "name": span.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "links": [f"{link.context.trace_id:032x}-{link.context.span_id:016x}" for link in span.links],
        "attributes": dict(span.attributes or {}),
        "events": [e.name for e in span.events],
        "status": span.status.status_code.name,
    }


class JsonLinesExporter(SpanExporter):
    """Appends each exported span (:func:`span_dict`) as one JSON line to ``path`` and flushes at once."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock, self._path.open("a", encoding="utf-8") as f:
            for span in spans:
                f.write(json.dumps(span_dict(span)) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def read_spans(path: Path) -> list[dict[str, Any]]:
    """The spans a :class:`JsonLinesExporter` wrote to ``path`` (none when the file is absent)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

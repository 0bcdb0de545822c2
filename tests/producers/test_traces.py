"""OpenTelemetry traces of a run (issue 34): spans per run, node and call, one trace per run across owners."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runjournal.core import otel
from runjournal.core.settings import Settings
from runjournal.producers import Journal, Outcome
from runjournal.schemas import EventType
from tests.support.readback import events_of, read_committed, take_over
from tests.support.spans import read_spans, span_dict

pytestmark = pytest.mark.integration

CHILD = Path(__file__).resolve().parents[1] / "support" / "traced_child.py"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process, into an in-memory exporter; off again after the test."""
    memory = InMemorySpanExporter()
    otel.configure_tracing(SimpleSpanProcessor(memory))
    yield memory
    otel.shutdown_tracing()


class Echo:
    name = "lookup"
    side_effect = False
    timeout_ms = 1000

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        return {"echo": args["q"]}


class Mailer:
    """A side-effecting tool that knows what it sent (``reconcile`` by key)."""

    name = "send_email"
    side_effect = True
    timeout_ms = 500

    def __init__(self, sent: set[str] | None = None) -> None:
        self.sent = sent if sent is not None else set()

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        self.sent.add(idempotency_key)
        return {"sent": True}

    def reconcile(self, idempotency_key: str) -> Outcome | None:
        return Outcome(executed=idempotency_key in self.sent, result={"sent": True})


def _by_name(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"] == name]


def test_a_run_has_a_span_tree_with_the_journal_attributes(topics: Settings, exporter: InMemorySpanExporter) -> None:
    with Journal(topics, producer_id=f"p-{uuid.uuid4().hex[:8]}") as journal:
        run = journal.start_run("tenant-a", "agent", {"q": 1})
        with run.node("plan"):
            run.call(Echo(), {"q": "x"})
        with pytest.raises(RuntimeError), run.node("act"):
            run.call(Mailer(), {"to": "bob"})
            raise RuntimeError("boom")
        run.succeed({"ok": True})
    spans = [span_dict(s) for s in exporter.get_finished_spans()]
    trace_id, root_id = (f"{v:032x}" for v in otel.run_trace(run.run_id))
    assert {s["trace_id"] for s in spans} == {f"{otel.run_trace(run.run_id)[0]:032x}"}
    (root,) = _by_name(spans, "runjournal.run")
    assert root["span_id"] == f"{otel.run_trace(run.run_id)[1]:016x}" and root["parent_id"] is None
    (segment,) = _by_name(spans, "runjournal.run.segment")
    assert segment["parent_id"] == root["span_id"]
    assert segment["span_id"] == f"{otel.segment_span_id(run.run_id, 1):016x}"
    assert segment["attributes"]["runjournal.outcome"] == "succeeded"
    nodes = {s["attributes"]["runjournal.node_path"]: s for s in _by_name(spans, "runjournal.node")}
    assert set(nodes) == {"plan", "act"} and all(n["parent_id"] == segment["span_id"] for n in nodes.values())
    assert nodes["act"]["status"] == "ERROR" and nodes["plan"]["status"] == "UNSET"
    calls = {s["attributes"]["runjournal.tool"]: s for s in _by_name(spans, "runjournal.tool_call")}
    assert calls["lookup"]["parent_id"] == nodes["plan"]["span_id"]
    mail = calls["send_email"]
    assert mail["parent_id"] == nodes["act"]["span_id"]
    assert mail["attributes"]["runjournal.run_id"] == run.run_id and mail["attributes"]["runjournal.epoch"] == 1
    assert mail["attributes"]["runjournal.outcome"] == "committed"
    assert mail["events"][0] == "TOOL_CALL_INTENDED" and "TOOL_CALL_COMMITTED" in mail["events"]
    # every event carries the traceparent of the span it happened in
    events = events_of(read_committed(topics), run.run_id)
    intent = next(e for e in events if e.type is EventType.TOOL_CALL_INTENDED and e.payload["tool"] == "send_email")
    assert mail["attributes"]["runjournal.seq"] == intent.seq
    assert mail["attributes"]["runjournal.idempotency_key"] == intent.payload["idempotency_key"]
    assert intent.traceparent == f"00-{mail['trace_id']}-{mail['span_id']}-01"
    started = next(e for e in events if e.type is EventType.RUN_STARTED)
    assert started.traceparent == f"00-{segment['trace_id']}-{segment['span_id']}-01"


def test_tracing_off_imports_no_opentelemetry(service_env: dict[str, str]) -> None:
    """Off (the default), runjournal imports nothing of OpenTelemetry and builds no provider. (redis-py 7 imports
    ``opentelemetry`` for its own observability when the package is installed: that baseline is subtracted.)"""
    env = {k: v for k, v in service_env.items() if not k.startswith("OTEL_")}
    code = ("import sys, redis; before = {m for m in sys.modules if m.startswith('opentelemetry')}; "
            "from runjournal.producers import Journal; from runjournal.core import otel; "
            "import runjournal.producers.handle, runjournal.consumers.recovery.job, "
            "runjournal.consumers.projector.service; assert otel.tracer() is None; "
            "after = {m for m in sys.modules if m.startswith('opentelemetry')}; "
            "print(sorted(after - before), 'opentelemetry.sdk.trace' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] False"

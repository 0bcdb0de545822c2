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


def _kill_when_sending(env: dict[str, str], tmp_path: Path, spans_file: Path) -> str:
    """Start the traced child, SIGKILL it inside ``send_email``; returns the run id."""
    run_id, producer_id = f"trace-{uuid.uuid4().hex[:8]}", f"child-{uuid.uuid4().hex[:8]}"
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.traced_child", run_id, producer_id, str(ready),
                             str(spans_file)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if proc.poll() is not None:
                pytest.fail(f"child exited {proc.returncode}: {proc.stderr.read().decode()}")
            assert time.monotonic() < deadline, "child never reached send_email"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()
    return run_id


@pytest.mark.crash
def test_a_crashed_and_resumed_run_is_one_trace(topics: Settings, service_env: dict[str, str], tmp_path: Path,
                                                exporter: InMemorySpanExporter) -> None:
    """A real crash: the child is SIGKILLed inside its side effect; recovery hands the run over; this process
    resumes it. One trace id across the dead owner, the recovery pass and the new owner, with the links."""
    import redis

    spans_file = tmp_path / "child-spans.jsonl"
    run_id = _kill_when_sending(service_env, tmp_path, spans_file)
    r = redis.Redis.from_url(topics.redis_url)
    sent = {k.decode() for k in r.smembers(f"{topics.topic_prefix}:sent:{run_id}")}
    time.sleep(3.0)  # the child's 2.5 s lease lapses: recover --stale takes its runs
    with Journal(topics, producer_id=f"p-{uuid.uuid4().hex[:8]}") as journal:
        run = take_over(journal, topics, run_id)
        with run.node("plan"):
            run.call(Echo(), {"q": "bob"})
        with run.node("send"):
            run.call(Mailer(sent), {"to": "bob"})
        run.succeed()
    trace_id = f"{otel.run_trace(run_id)[0]:032x}"
    root_id = f"{otel.run_trace(run_id)[1]:016x}"
    seg = {e: f"{otel.segment_span_id(run_id, e):016x}" for e in (1, 2)}
    child = read_spans(spans_file)
    here = [span_dict(s) for s in exporter.get_finished_spans()]
    run_spans = [s for s in child + here if s["trace_id"] == trace_id]
    names = sorted(s["name"] for s in run_spans)
    # the dead owner: its root, the ended lookup call and plan node; its segment, send node and call never ended
    assert {s["name"] for s in child} == {"runjournal.run", "runjournal.node", "runjournal.tool_call"}
    assert all(s["trace_id"] == trace_id for s in child)
    (root,) = [s for s in run_spans if s["name"] == "runjournal.run"]
    assert root["span_id"] == root_id and root["parent_id"] is None
    segments = {s["attributes"]["runjournal.epoch"]: s for s in run_spans if s["name"] == "runjournal.run.segment"}
    assert set(segments) == {1, 2}
    assert all(s["parent_id"] == root_id for s in segments.values())
    assert segments[1]["span_id"] == seg[1] and segments[1]["attributes"]["runjournal.outcome"] == "lost"
    assert segments[2]["span_id"] == seg[2] and segments[2]["attributes"]["runjournal.outcome"] == "succeeded"
    (handover,) = [s for s in run_spans if s["name"] == "runjournal.recovery.run"]
    assert handover["parent_id"] == root_id and f"{trace_id}-{seg[1]}" in handover["links"]
    assert f"{trace_id}-{handover['span_id']}" in segments[2]["links"]  # the new owner links the hand-over …
    assert f"{trace_id}-{seg[1]}" in segments[2]["links"]  # … and the dead owner's segment
    # the recovery pass: its own trace, steps fence, read, classify, hand-over; the hand-over links it
    passes = [s for s in here if s["name"] == "runjournal.recovery.pass"]
    assert len(passes) == 1
    steps = {s["name"] for s in here if s["parent_id"] == passes[0]["span_id"]}
    assert {"runjournal.recovery.read", "runjournal.recovery.classify", "runjournal.recovery.hand_over"} <= steps
    fence = [s for s in here if s["name"] == "runjournal.recovery.fence"]
    assert fence and fence[0]["trace_id"] == passes[0]["trace_id"]
    assert any(link.startswith(passes[0]["trace_id"]) for link in handover["links"])
    # the resumed call: reconciled by key, in the new segment, same idempotency key as the dead owner's intent
    (resumed_call,) = [s for s in here if s["name"] == "runjournal.tool_call"
                       and s["attributes"]["runjournal.tool"] == "send_email"]
    assert resumed_call["attributes"]["runjournal.outcome"] == "reconciled"
    assert resumed_call["attributes"]["runjournal.idempotency_key"] in sent
    assert "TOOL_CALL_RECONCILED" in resumed_call["events"]
    assert resumed_call["attributes"]["runjournal.epoch"] == 2
    (replayed,) = [s for s in here if s["name"] == "runjournal.tool_call"
                   and s["attributes"]["runjournal.tool"] == "lookup"]
    assert replayed["attributes"]["runjournal.outcome"] == "recorded" and replayed["events"] == []
    assert names.count("runjournal.run") == 1
    events = events_of(read_committed(topics), run_id)
    resumed = next(e for e in events if e.type is EventType.RUN_RESUMED)
    assert resumed.traceparent == f"00-{trace_id}-{handover['span_id']}-01"
    assert {e.traceparent.split("-")[1] for e in events if e.traceparent} == {trace_id}


def test_the_otlp_exporter_named_by_the_otel_variables_is_used(service_env: dict[str, str], topics: Settings) -> None:
    """``OTEL_EXPORTER_OTLP_ENDPOINT`` alone switches traces on: a child process's run is POSTed as OTLP/protobuf to
    ``<endpoint>/v1/traces`` of a real local HTTP server (the SDK's exporter, flushed at the child's exit)."""
    import http.server
    import threading

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    received: list[tuple[str, str, bytes]] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's hook name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, self.headers.get("Content-Type", ""), body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {k: v for k, v in service_env.items() if not k.startswith("OTEL_")}
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{server.server_address[1]}",
                   OTEL_SERVICE_NAME="traced-agent")
        code = ("from runjournal.core.settings import Settings; from runjournal.producers import Journal; "
                "j = Journal(Settings.load(), producer_id='otlp-child'); "
                "r = j.start_run('tenant-a', 'agent', {'q': 1}, run_id='otlp-run'); "
                "r.node('n').__enter__(); r.emit('MESSAGE', {'role': 'assistant', 'content': 'hi'}); "
                "r.succeed(); j.close()")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    finally:
        server.shutdown()
        server.server_close()
    assert received and {path for path, _t, _b in received} == {"/v1/traces"}
    assert all(ctype == "application/x-protobuf" for _p, ctype, _b in received)
    names, services = set(), set()
    for _p, _t, body in received:
        request = ExportTraceServiceRequest.FromString(body)
        for rs in request.resource_spans:
            services |= {a.value.string_value for a in rs.resource.attributes if a.key == "service.name"}
            names |= {span.name for ss in rs.scope_spans for span in ss.spans}
    assert services == {"traced-agent"}
    assert {"runjournal.run", "runjournal.run.segment", "runjournal.node"} <= names


def test_an_async_run_has_the_same_spans(topics: Settings, exporter: InMemorySpanExporter) -> None:
    """``AsyncRunHandle`` drives the sync handle's node and call steps: the same spans, calls under their node."""
    import asyncio

    from runjournal.producers.aio import AsyncJournal

    async def main() -> str:
        async with await AsyncJournal.open(topics, producer_id=f"a-{uuid.uuid4().hex[:8]}") as journal:
            run = await journal.start_run("tenant-a", "agent", {"q": 1})
            async with run.node("fetch"):
                await asyncio.gather(run.call(Echo(), {"q": "a"}), run.call(Echo(), {"q": "b"}))
            await run.succeed()
            return run.run_id

    run_id = asyncio.run(main())
    spans = [span_dict(s) for s in exporter.get_finished_spans()]
    assert {s["trace_id"] for s in spans} == {f"{otel.run_trace(run_id)[0]:032x}"}
    (node,) = _by_name(spans, "runjournal.node")
    calls = _by_name(spans, "runjournal.tool_call")
    assert len(calls) == 2 and all(c["parent_id"] == node["span_id"] for c in calls)
    assert {c["attributes"]["runjournal.outcome"] for c in calls} == {"committed"}
    assert len({c["attributes"]["runjournal.idempotency_key"] for c in calls}) == 2


def test_settings_tracing_given_in_code_switches_traces_on_and_off(topics: Settings,
                                                                   service_env: dict[str, str]) -> None:
    """``Settings(tracing="otel")`` handed to a Journal (not the environment) turns traces on in that process;
    ``off`` keeps them off although an OTEL_* variable asks for them — each in a fresh process (the switch is
    per process)."""
    code = ("import json, sys, uuid\n"
            "from runjournal.core import otel\n"
            "from runjournal.core.settings import Settings\n"
            "from runjournal.producers import Journal\n"
            "settings = Settings.load().model_copy(update={'tracing': sys.argv[1]})\n"
            "with Journal(settings, producer_id=f'tr-{uuid.uuid4().hex[:6]}'):\n"
            "    print(json.dumps(otel.tracer() is not None))\n"
            "otel.shutdown_tracing()\n")
    base = {k: v for k, v in service_env.items() if not k.startswith(("OTEL_", "RUNJOURNAL_TRACING"))}
    base["RUNJOURNAL_TOPIC_PREFIX"] = topics.topic_prefix
    env = {**base, "OTEL_TRACES_EXPORTER": "none"}
    on = subprocess.run([sys.executable, "-c", code, "otel"], env=env, capture_output=True, text=True, timeout=120)
    assert on.returncode == 0 and on.stdout.strip() == "true", on.stderr[-2000:]
    env = {**base, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    off = subprocess.run([sys.executable, "-c", code, "off"], env=env, capture_output=True, text=True, timeout=120)
    assert off.returncode == 0 and off.stdout.strip() == "false", off.stderr[-2000:]


class Refuses:
    """A tool whose error text is content (a card number, a user's words)."""

    name = "charge"
    side_effect = False
    timeout_ms = 1000

    def __init__(self, mark: str) -> None:
        self.mark = mark

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        raise ValueError(f"card {self.mark} declined")


@pytest.mark.parametrize("encryption", ["on", "off"])
def test_an_encrypted_runs_spans_name_errors_by_class_never_by_their_text(topics: Settings, tmp_path: Path,
                                                                          exporter: InMemorySpanExporter,
                                                                          encryption: str) -> None:
    """Issue 33: with encryption on, the error texts the journal seals (a tool's, a node's, the run's) reach no span:
    a trace backend is a copy no key erasure reaches. Off, the spans keep the text (the test can fail)."""
    mark = f"MARKER-{uuid.uuid4().hex}"
    s = topics.model_copy(update={"encryption": encryption, "keys_dir": tmp_path / "keys"})
    with Journal(s, producer_id=f"p-{uuid.uuid4().hex[:8]}") as journal:
        run = journal.start_run("tenant-a", "agent", {"q": 1}, user_id="ann")
        with pytest.raises(ValueError), run.node("pay"):
            run.call(Refuses(mark), {"q": "x"})
        run.fail(f"could not pay: {mark}")
    spans = exporter.get_finished_spans()
    text = "\n".join(span.to_json() for span in spans)
    assert ("ValueError" in text) and (mark in text) is (encryption == "off"), text[-2000:]
    failed = [span_dict(s) for s in spans if span_dict(s)["status"] == "ERROR"]
    assert {s["name"] for s in failed} >= {"runjournal.node", "runjournal.tool_call", "runjournal.run.segment"}

"""Every service's ``/metrics``: base units, the process collector, and ``promtool check metrics`` clean.

The services run as a user runs them (``runjournal projector|memory-extractor|recover --watch|console`` with
``--metrics-port`` / ``--port``, subprocesses on the real stack); the journal inside an agent exports on a port
of its own (``JournalMetrics.serve``) or into a host application's registry. ``promtool`` is Debian's
(``prometheus`` package, installed by ``make deps-test``).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from runjournal.core import metrics as m
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.deploy.procs import free_port
from runjournal.producers import Journal
from runjournal.producers.metrics import JournalMetrics
from runjournal.schemas import Event, EventType
from tests.support.workload import publish, run_events

PROCESS = ("process_cpu_seconds_total", "process_resident_memory_bytes", "runjournal_build_info")


def promtool_problems(text: str) -> str:
    """What ``promtool check metrics`` says about ``text`` ("" when clean)."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: `make deps-test` installs Debian's prometheus package"
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60,
                          check=False)
    return "" if proc.returncode == 0 and not (proc.stdout + proc.stderr).strip() else proc.stdout + proc.stderr


def samples(text: str) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def total(text: str, name: str, **labels: str) -> float:
    return sum(s.value for s in samples(text).get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))


# -- the metrics module ----------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["runjournal_projector_lag_ms", "runjournal_x_size_kb", "runjournal_x_events_total",
                                 "projector_lag_seconds", "runjournal_Lag_seconds"])
def test_names_outside_base_units_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        m.counter(CollectorRegistry(), bad, "doc")


def test_families_are_shared_by_name_and_a_second_meaning_is_refused() -> None:
    registry = CollectorRegistry()
    first = m.counter(registry, "runjournal_test_retries", "doc", ["cause"])
    assert m.counter(registry, "runjournal_test_retries", "doc", ["cause"]) is first
    with pytest.raises(ValueError, match="already a counter"):
        m.gauge(registry, "runjournal_test_retries", "doc", ["cause"])
    with pytest.raises(ValueError, match="already a counter"):
        m.counter(registry, "runjournal_test_retries", "doc", ["dependency"])
    with pytest.raises(ValueError, match="base unit"):
        m.histogram(registry, "runjournal_test_latency", "doc")


def test_a_service_registry_carries_the_process_collector_and_is_promtool_clean() -> None:
    text = generate_latest(m.new_registry("test")).decode()
    assert all(name in text for name in PROCESS)
    assert promtool_problems(text) == ""
    assert "abbreviated units" in promtool_problems("# HELP runjournal_x_lag_ms x\n# TYPE runjournal_x_lag_ms gauge\n"
                                               "runjournal_x_lag_ms 1\n")  # the check can fail


@pytest.mark.integration
def test_an_endpoint_is_announced_for_the_console_while_it_serves(settings: Settings) -> None:
    r = redis.Redis.from_url(settings.redis_url)
    server = m.serve(m.new_registry("test"), free_port(), service="projector", addr="127.0.0.1", redis_client=r,
                     prefix=settings.topic_prefix)
    (entry,) = m.announced_endpoints(r, settings.topic_prefix)
    assert entry["service"] == "projector" and entry["url"] == server.url
    assert "process_cpu_seconds_total" in httpx.get(server.url, timeout=10).text
    assert m.announced_endpoints(r, settings.topic_prefix, max_age_s=-1) == []  # an entry not refreshed ages out
    (missing,) = m.announced_endpoints(r, settings.topic_prefix, max_age_s=-1, missing_for_s=3600)
    assert missing["missing"] and missing["age_s"] >= 0  # ... and is shown as missing, not dropped, when asked
    server.close()
    assert m.announced_endpoints(r, settings.topic_prefix) == []
    with pytest.raises(httpx.HTTPError):
        httpx.get(server.url, timeout=2)


def test_a_stop_reason_is_the_error_read_through_a_cli_exit() -> None:
    import typer

    def reported(exc: BaseException) -> BaseException:
        try:
            raise typer.Exit(1) from exc
        except typer.Exit as exit_:
            return exit_

    assert m.stop_reason(None) is None and m.stop_reason(KeyboardInterrupt()) is None
    assert m.stop_reason(SystemExit(0)) is None and m.stop_reason(typer.Exit(0)) is None
    assert m.stop_reason(reported(RuntimeError("fenced:\n  another member"))) == "RuntimeError: fenced: another member"
    assert m.stop_reason(SystemExit(3)) == "exited with status 3"
    assert len(m.stop_reason(ValueError("x" * 2000)) or "") == 500


@pytest.mark.integration
def test_an_endpoint_stopped_on_an_error_leaves_a_marker_and_a_clean_stop_withdraws(settings: Settings) -> None:
    """Issue 35: every exit deleted the announcement, so a fenced service vanished from the console."""
    r = redis.Redis.from_url(settings.redis_url)
    failed = m.serve(m.new_registry("test"), free_port(), service="projector", addr="127.0.0.1", redis_client=r,
                     prefix=settings.topic_prefix)
    clean = m.serve(m.new_registry("test"), free_port(), service="memory", addr="127.0.0.1", redis_client=r,
                    prefix=settings.topic_prefix)
    failed.close(RuntimeError("fenced by another member"))
    clean.close()
    assert m.announced_endpoints(r, settings.topic_prefix) == []  # not served: not a scrape target
    (stopped,) = m.announced_endpoints(r, settings.topic_prefix, missing_for_s=3600)
    assert stopped["service"] == "projector" and stopped["stopped"] == "RuntimeError: fenced by another member"
    assert not stopped["missing"] and 0 <= stopped["stopped_s"] < 60
    failed.close()  # idempotent: the marker stays
    assert len(m.announced_endpoints(r, settings.topic_prefix, missing_for_s=3600)) == 1


# -- every service, as a user runs it ------------------------------------------------------------------------
def _scrape(url: str, *, until: Any = None, timeout_s: float = 120) -> str:
    """GET ``url`` until it answers and ``until(text)`` holds."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            res = httpx.get(url, timeout=5)
            if res.status_code == 200:
                last = res.text
                if until is None or until(last):
                    return last
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} never showed what was expected; last scrape:\n{last[-3000:]}")


@pytest.fixture
def services(topics: Settings, service_env: dict[str, str]) -> Iterator[dict[str, Any]]:
    """projector, memory extractor, recovery sweep and console, each with its /metrics on a free port, and
    the journal's own metrics endpoint (``JournalMetrics.serve``), which the console scrapes by ``--scrape``."""
    journal = JournalMetrics.serve(free_port(), addr="127.0.0.1")
    assert journal.server is not None
    ports = {name: free_port() for name in ("projector", "memory", "recovery", "console")}
    argv = {"projector": ["projector", "--metrics-port", str(ports["projector"]), "--metrics-addr", "127.0.0.1"],
            "memory": ["memory-extractor", "--metrics-port", str(ports["memory"])],
            "recovery": ["recover", "--stale", "--watch", "0.5", "--json", "--metrics-port", str(ports["recovery"])],
            "console": ["console", "--port", str(ports["console"]), "--host", "127.0.0.1", "--per-page", "50",
                        "--scrape", journal.server.url]}
    procs = [subprocess.Popen([sys.executable, "-m", "runjournal", *args], env=service_env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for args in argv.values()]
    try:
        yield {**{name: f"http://127.0.0.1:{port}/metrics" for name, port in ports.items()},
               "journal": journal.server.url, "journal_metrics": journal}
    finally:
        journal.server.close()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)


def _zombie_run() -> list[Event]:
    """RUN_STARTED, RUN_RESUMED to epoch 2, then a NODE_STARTED of epoch 1 (a zombie): fenced by epoch."""
    def ev(seq: int, epoch: int, etype: EventType, payload: dict) -> Event:
        return Event(event_id=str(uuid.uuid4()), run_id="m-zombie", tenant_id="acme", seq=seq, epoch=epoch,
                     producer_id=f"agent-{epoch}", type=etype, occurred_at=datetime.now(UTC), payload=payload)
    return [ev(1, 1, EventType.RUN_STARTED, {"agent": "a", "input_json": "{}"}),
            ev(2, 2, EventType.RUN_RESUMED, {"previous_epoch": 1, "recovered_by": "test", "plan_json": "{}"}),
            ev(3, 1, EventType.NODE_STARTED, {"node_path": "late", "attempt": 1})]


class Echo:
    name, side_effect, timeout_ms = "echo", True, 1000

    def __call__(self, args: dict, idempotency_key: str) -> dict:
        return {"echo": args}


@pytest.mark.integration
def test_every_service_exports_base_units_with_the_process_collector_promtool_clean(
        topics: Settings, services: dict[str, Any]) -> None:
    # work for every service: runs, an undecodable record (a dead letter by cause), a dead instance's owned run
    publish(topics, [e for i in range(3) for e in run_events(f"m-{i}")])
    publish(topics, [("m-bad:1:1", b"not avro at all"), *_zombie_run()])
    r = redis.Redis.from_url(topics.redis_url)
    r.sadd(RedisKeys(topics.topic_prefix).owned(f"ghost-{uuid.uuid4().hex[:6]}"), "m-never-started")
    journal_metrics = services["journal_metrics"]
    host = CollectorRegistry()  # a host application's registry
    with Journal(topics, producer_id=f"agent-{uuid.uuid4().hex[:6]}",
                 metrics=journal_metrics) as one, Journal(topics, metrics=JournalMetrics(host)) as two:
        for journal in (one, two):
            run = journal.start_run("acme", "metrics-agent", {"q": 1})
            with run.node("call"):
                run.call(Echo(), {"x": 1})
            run.succeed({"ok": True})
        texts = {
            "projector": _scrape(services["projector"], until=lambda t: total(  # counted once a write is applied
                t, "runjournal_projector_events_total") >= 3 * len(run_events("m-0")) + 1
                and total(t, "runjournal_projector_call_outcomes_total", outcome="committed") >= 6
                and total(t, "runjournal_projector_stale_epoch_rejected_total") >= 1),
            "memory": _scrape(services["memory"], until=lambda t: total(t, "runjournal_memory_events_total") > 0
                              and total(t, "runjournal_memory_dead_letters_total") >= 1),  # what is asserted below
            "recovery": _scrape(services["recovery"], until=lambda t: total(
                t, "runjournal_recovery_passes_total", result="ok") >= 1),
            "console": _scrape(services["console"]),
            "journal": _scrape(services["journal"],
                               until=lambda t: total(t, "runjournal_journal_transactions_committed_total") > 0),
            "host": generate_latest(host).decode(),
        }
    for name, text in texts.items():
        assert promtool_problems(text) == "", (name, promtool_problems(text))
        assert not re.search(r"^runjournal_\w*_ms(_|\b)", text, re.M), name
    for name in ("projector", "memory", "recovery", "console", "journal"):
        assert all(p in texts[name] for p in PROCESS), name
    assert "process_cpu_seconds_total" not in texts["host"]  # the host's registry gets runjournal's families only
    p, mem, rec, j = texts["projector"], texts["memory"], texts["recovery"], texts["journal"]
    # the projector: events, lag in seconds and records, batch and commit latency, dead letters by cause
    assert "runjournal_projector_lag_ms" not in p
    for name in ("runjournal_projector_lag_seconds", "runjournal_projector_lag_records",
                 "runjournal_projector_event_age_seconds_bucket", "runjournal_projector_batch_apply_seconds_bucket",
                 "runjournal_projector_commit_seconds_bucket"):
        assert name in p, name
    (dead,) = samples(p)["runjournal_projector_dead_letters_total"]
    assert dead.value == 1 and dead.labels["cause"].endswith("Error")  # by cause: the decoder's error class
    assert total(p, "runjournal_projector_call_outcomes_total", outcome="committed") >= 6
    assert total(p, "runjournal_projector_stale_epoch_rejected_total") == 1  # the zombie's event, fenced
    # the memory extractor: events, lag, dead letters by cause
    assert total(mem, "runjournal_memory_dead_letters_total") >= 1 and "runjournal_memory_lag_seconds" in mem
    # the recovery sweep: passes and their duration, fences, runs by action, the backlog
    assert total(rec, "runjournal_recovery_fences_total") >= 1
    assert total(rec, "runjournal_recovery_runs_total", action="no_facts") >= 1
    assert "runjournal_recovery_pass_duration_seconds_bucket" in rec and "runjournal_recovery_lag_seconds" in rec
    # the journal: events by type, durable publish latency, outcome classes, transactions
    assert total(j, "runjournal_journal_tool_call_outcomes_total", outcome="committed") == 1
    assert total(j, "runjournal_journal_events_total", type="TOOL_CALL_INTENDED") == 1
    assert total(texts["host"], "runjournal_journal_tool_call_outcomes_total", outcome="committed") == 1
    assert "runjournal_journal_durable_publish_seconds_bucket" in j
    # each service announced its endpoint for the console, which shows the lag from them
    announced = {e["service"] for e in m.announced_endpoints(redis.Redis.from_url(topics.redis_url),
                                                             topics.topic_prefix)}
    assert announced == {"projector", "memory", "recovery"}
    lag = httpx.get(services["console"].replace("/metrics", "/lag"), timeout=30).text
    for service in ("projector", "memory", "recovery", "journal"):  # the journal's by --scrape
        assert f'data-service="{service}"' in lag
    assert lag.count("<td>up</td>") == 4


def _announced(settings: Settings) -> set[str]:
    return {e["service"] for e in m.announced_endpoints(redis.Redis.from_url(settings.redis_url),
                                                        settings.topic_prefix)}


@pytest.mark.integration
@pytest.mark.parametrize(("service", "args"), [
    ("projector", ["projector"]),
    ("recovery", ["recover", "--stale", "--watch", "1", "--json"]),
    ("memory", ["memory-extractor"]),
])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_service_stopped_by_sigterm_or_sigint_withdraws_its_announcement(
        topics: Settings, service_env: dict[str, str], service: str, args: list[str], sig: int) -> None:
    """A supervisor's SIGTERM stops a service as Ctrl-C does: it exits 0 and its /metrics endpoint is no longer
    announced for the console (runjournal/cli/_signals.py)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "runjournal", *args, "--metrics-port", str(port),
                             "--metrics-addr", "127.0.0.1"], env=service_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while service not in _announced(topics):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, f"{service} never announced its endpoint"
            time.sleep(0.2)
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == 0, err[-3000:]
    assert service not in _announced(topics)


@pytest.mark.integration
@pytest.mark.parametrize("args", [
    ["projector", "--json", "--metrics-port"],
    ["memory-extractor", "--json", "--metrics-port"],
    ["recover", "--stale", "--watch", "1", "--json", "--metrics-port"],
    ["console", "--host", "127.0.0.1", "--port"],
], ids=["projector", "memory", "recovery", "console"])
def test_a_port_in_use_is_a_named_error_naming_the_port_and_the_fix(
        topics: Settings, service_env: dict[str, str], args: list[str]) -> None:
    """--metrics-port (or the console's --port) already taken: one line on stderr — JSON under --json — naming
    the port and the option to change, exit 1; no traceback."""
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen(1)
        port = held.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "runjournal", *args, str(port)], env=service_env,
                              capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    option = args[-1]
    if "--json" in args:
        assert proc.stdout == ""
        (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("{")]
        err = json.loads(line)
        assert err["error"] == "PortInUseError", err
        message = err["message"]
    else:
        (message,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert f":{port}" in message and option in message, message

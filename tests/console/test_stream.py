"""``GET /streams/{run_id}``: a run's durable stream as Server-Sent Events from a real ``runjournal console`` process
(decision 0055) — ids are offsets, ``Last-Event-ID`` resumes after one with no duplicate, a run id with a slash is
one path segment, a bad ``Last-Event-ID`` is a 400."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runjournal.console.app import path_segment
from runjournal.core.settings import Settings
from runjournal.deploy.procs import free_port
from runjournal.producers import Journal

pytestmark = pytest.mark.integration


def _console(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "runjournal", "console", "--port", str(port)], env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)


@pytest.fixture
def console(topics: Settings, service_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    proc, url = _console(service_env, tmp_path / "console.log")
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def sse_events(url: str, headers: dict[str, str] | None = None, until: str = "end",
               timeout_s: float = 30) -> list[dict[str, Any]]:
    """The events of an SSE response (``id``, ``event``, ``data`` parsed) until one of kind ``until``."""
    out: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    with httpx.stream("GET", url, headers=headers or {}, timeout=timeout_s) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line == "" and "event" in current:
                out.append(current)
                if current["event"] == until:
                    return out
                current = {}
            elif line.startswith(("id: ", "event: ")):
                name, _, value = line.partition(": ")
                current[name] = value
            elif line.startswith("data: "):
                current["data"] = json.loads(line[6:])
    return out


def test_the_stream_as_server_sent_events_resumes_after_last_event_id(topics: Settings, console: str) -> None:
    run_id = f"chat/{uuid.uuid4().hex[:6]} x"  # a slash and a space: one percent-encoded path segment
    with Journal(topics, producer_id=f"sse-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("t", "a", {}, run_id=run_id)
        with run.stream("answer") as s:
            for i in range(10):
                s.write(f"tok{i} ")
        journal.streams.flush(10)
    url = f"{console}/streams/{path_segment(run_id)}"
    whole = sse_events(url)
    assert [e["event"] for e in whole] == ["chunk"] * 10 + ["end"]
    assert [e["data"]["data"] for e in whole[:10]] == [f"tok{i} " for i in range(10)]
    assert [int(e["id"]) for e in whole] == [e["data"]["offset"] for e in whole]
    rest = sse_events(url, headers={"Last-Event-ID": whole[3]["id"]})  # a client that saw four events reconnects
    assert rest == whole[4:]
    assert sse_events(f"{url}?from={whole[8]['id']}") == whole[8:]  # ?from= is inclusive (a link, no header)
    bad = httpx.get(url, headers={"Last-Event-ID": "nope"}, timeout=10)
    assert bad.status_code == 400

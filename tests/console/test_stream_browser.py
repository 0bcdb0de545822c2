"""Acceptance (issue 34, durable streams): a run's stream in the console, in headless Chromium, continues across an
agent SIGKILL, the run's recovery by another instance and a page reload — the dead owner's tokens once each, the gap
shown where it stopped, the new owner's tokens after it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runjournal.console.app import path_segment
from runjournal.consumers.streams import read_stream
from runjournal.core.settings import Settings
from runjournal.producers import Journal
from tests.console.test_browser import _spawn, _wait_http, browser, page  # noqa: F401 - the browser fixtures
from tests.support.provider import wait_lease_gone
from tests.support.readback import take_over

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def services(topics: Settings, service_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """A projector (the run page needs the run's projection) and a console; yields the console's URL."""
    from runjournal.deploy.procs import free_port

    port = free_port()
    procs = [_spawn(service_env, "projector", log=tmp_path / "projector.log"),
             _spawn(service_env, "console", "--port", str(port), log=tmp_path / "console.log")]
    try:
        _wait_http(f"http://127.0.0.1:{port}/healthz", procs[1], tmp_path / "console.log")
        yield f"http://127.0.0.1:{port}"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)


def _panel(page: Any) -> str:  # noqa: F811 - the fixture's name
    return str(page.inner_text("#stream .stream-text"))


def test_a_runs_stream_in_the_browser_continues_across_a_sigkill_and_a_reload(
        topics: Settings, service_env: dict[str, str], services: str, page: Any) -> None:  # noqa: F811
    run_id = f"chat/{uuid.uuid4().hex[:6]}"
    producer_id = f"sc-{uuid.uuid4().hex[:6]}"
    child = subprocess.Popen([sys.executable, "-m", "tests.support.stream_child", run_id, producer_id, "3", "0.1"],
                             env=service_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline() if child.stdout else ""
        assert json.loads(line or "{}").get("ready") == run_id, child.stderr.read()[-3000:] if child.stderr else ""
        url = f"{services}/runs/{path_segment(run_id)}"
        deadline = time.monotonic() + 60
        while page.goto(url).status != 200:  # the projector has not folded the run yet
            assert time.monotonic() < deadline, "the run never reached the projection"
            time.sleep(0.5)
        page.locator("#stream .chunk").nth(7).wait_for()  # live, while it writes
        assert page.inner_text("#stream .stream-status") == "live"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(60)
    wait_lease_gone(topics, producer_id, timeout_s=15)
    with Journal(topics, producer_id=f"live-{uuid.uuid4().hex[:6]}") as live:
        resumed = take_over(live, topics, run_id)
        with resumed.stream("answer") as s:
            for i in range(1, 4):
                s.write(f" continued-{i}")
        resumed.succeed()
        live.streams.flush(10)
    page.locator("#stream .end").wait_for()  # the same page, without a reload
    dead_tokens = [e.data for _o, e in read_stream(topics, run_id) if e.kind == "chunk" and e.epoch == 1]
    expected = "".join(dead_tokens) + " ⋯ gap: epoch 1 stopped here"
    assert _panel(page).startswith(expected), _panel(page)
    page.reload()
    page.locator("#stream .end").wait_for()
    text = _panel(page)
    assert text.startswith(expected) and text.count("gap: epoch 1") == 1, text
    assert text.count("continued-1") == 1 and all(text.count(t) == 1 for t in dead_tokens), text
    assert text.rstrip().endswith("continued-3 ⏹")

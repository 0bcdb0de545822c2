"""Acceptance (issue 30): an operator, signed in to ``runjournal console`` in headless Chromium, types an archived
run's id into the search box and lands on its page read from the archive — the banner names the object, the
status and timeline are the archived run's, and no cancel / pause / resume button is offered."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runjournal.core.settings import Settings
from runjournal.deploy.procs import free_port
from tests.console.test_archived import archived  # noqa: F401 - the fixture: con-arc archived, con-live projected
from tests.console.test_browser import _spawn, _wait_http, browser, page  # noqa: F401 - the browser fixtures
from tests.support.workload import run_events

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.slow]
TOKEN = "op-" + uuid.uuid4().hex


@pytest.fixture
def console(archived: tuple[Settings, str], service_env: dict[str, str],  # noqa: F811
            tmp_path: Path) -> Iterator[str]:
    """``runjournal console`` with an operator token on the archived run's prefix and archive; its URL."""
    settings, _url = archived
    port, log = free_port(), tmp_path / "console.log"
    env = {**service_env, "RUNJOURNAL_ARCHIVE_URL": str(settings.archive_url),
           "RUNJOURNAL_CONSOLE_OPERATOR_TOKEN": TOKEN}
    proc = _spawn(env, "console", "--port", str(port), log=log)
    try:
        _wait_http(f"http://127.0.0.1:{port}/healthz", proc, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_search_box_finds_an_archived_run_shown_from_the_archive_without_controls(
        archived: tuple[Settings, str], console: str, page: Any) -> None:  # noqa: F811
    _settings, url = archived
    page.goto(f"{console}/login")
    page.fill("input[name=name]", "alice")
    page.fill("input[name=token]", TOKEN)
    page.click("form.login button")
    page.wait_for_selector("form[action='/logout']")  # signed in: controls would be offered if any applied
    page.fill("form.search input[name=run_id]", "con-arc")
    page.press("form.search input[name=run_id]", "Enter")
    page.wait_for_selector("#archived")
    assert page.url.endswith("/runs/con-arc")
    assert page.inner_text("#archived").startswith(f"archived — {url}")
    assert page.inner_text("#run-status") == "SUCCEEDED"
    assert page.locator("#controls form").count() == 0 and page.locator("#controls button").count() == 0
    assert page.inner_text("#no-controls") == "none apply: the run is archived (SUCCEEDED)"
    assert page.locator("#timeline tbody tr[data-offset]").count() == len(run_events("con-arc", calls=2))

"""An archived run in the console (issue 30, decision 0056): a run Redis no longer holds but the archive does is
shown read from its archive object — the run page and ``/api/runs/{id}`` name the object, ``/search`` finds it, no
operator control is offered and a control asked anyway is refused (nothing written); an archive that cannot be read
is a named error, never a 500.

The console app (``build_app``, Starlette's test client) on the real broker and Redis, runs archived by the real
``archive_run`` to a local folder."""

from __future__ import annotations

import html
import re
import uuid
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from runjournal.console import ConsoleConfig, build_app
from runjournal.console.auth import OperatorAuth
from runjournal.consumers.archive import archive_run
from runjournal.consumers.runtime.partitions import run_partition, watermarks
from runjournal.core.settings import Settings
from runjournal.producers.control import ControlStore
from tests.support.provider import project
from tests.support.workload import publish, run_events

pytestmark = pytest.mark.integration

TOKEN = "op-" + uuid.uuid4().hex
HTML = {"accept": "text/html"}
BEARER = {"authorization": f"Bearer {TOKEN}"}


def _text(page: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}"[^>]*>(.*?)</p>', page, re.S)
    assert found, f"no #{element_id} on the page"
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", found.group(1))).split())


@pytest.fixture
def archived(topics: Settings, tmp_path: Path) -> tuple[Settings, str]:
    """Runs ``con-arc`` (archived: gone from Redis and the topic, in the archive) and ``con-live`` (projected);
    the archive object's URL."""
    settings = topics.model_copy(update={"archive_url": (tmp_path / "archive").as_uri()})
    publish(settings, run_events("con-arc", calls=2) + run_events("con-live", calls=1))
    store = project(settings)
    report = archive_run(settings, "con-arc")
    assert store.get(run_partition(settings, "con-arc"), "con-arc") is None  # Redis no longer has it
    return settings, report.object_url


def test_the_run_page_and_its_json_show_an_archived_run_read_from_the_archive(archived: tuple[Settings, str]) -> None:
    settings, url = archived
    assert url.startswith("file://") and url.endswith(".parquet")
    with TestClient(build_app(ConsoleConfig(settings, operator_token=TOKEN))) as client:
        client.post("/login", data={"token": TOKEN, "name": "alice"})  # an operator: controls would be offered
        page = client.get("/runs/con-arc")
        assert page.status_code == 200, page.text[-1500:]
        assert _text(page.text, "archived").startswith(f"archived — {url}:")
        assert _text(page.text, "no-controls") == "none apply: the run is archived (SUCCEEDED)"
        assert 'class="control' not in page.text and 'action="/runs/con-arc/' not in page.text
        doc = client.get("/api/runs/con-arc").json()
        assert doc["archived"] == url and doc["status"] == "SUCCEEDED" and doc["actions"] == []
        assert doc["tenant_id"] == "acme" and doc["agent"] == "airline"
        assert [row["seq"] for row in doc["timeline"]] == [e.seq for e in run_events("con-arc", calls=2)]
        assert {r["status"] for r in doc["records"]} == {"COMMITTED"} and len(doc["records"]) == 2
        found = client.get("/search", params={"run_id": "con-arc"})  # follows the 303 to the run page
        assert found.status_code == 200 and _text(found.text, "archived").startswith(f"archived — {url}")
        live = client.get("/api/runs/con-live").json()  # a run of the projection: not archived, controls as ever
        assert live["archived"] is None and live["status"] == "SUCCEEDED"
        assert "con-arc" not in {r["run_id"] for r in client.get("/api/runs").json()["runs"]}  # the index: Redis's
        missing = client.get("/api/runs/never-was")
        assert missing.status_code == 404 and missing.json()["error"] == "RunNotFound"
        assert "nor in the archive" in missing.json()["message"]


def test_a_control_on_an_archived_run_is_refused_and_nothing_is_written(archived: tuple[Settings, str]) -> None:
    settings, url = archived
    partition = run_partition(settings, "con-arc")
    before = watermarks(settings, [partition])
    with TestClient(build_app(ConsoleConfig(settings, operator_token=TOKEN))) as client:
        script = client.post("/runs/con-arc/cancel", data={"reason": "stop"}, headers=BEARER)
        assert script.status_code == 409, script.text
        assert script.text == (f"refused: run con-arc is archived ({url}): it is finished and out of the hot "
                               "stores; cancel does not apply")
        client.post("/login", data={"token": TOKEN, "name": "alice"})
        browser = client.post("/runs/con-arc/pause", data={"reason": "hold", "csrf": OperatorAuth(TOKEN).csrf()},
                              headers=HTML)
        assert browser.status_code == 409
        assert _text(browser.text, "control-refused").startswith("pause refused: run con-arc is archived")
        assert _text(browser.text, "archived").startswith(f"archived — {url}")  # the run's (archived) page
    assert ControlStore(_redis(settings), settings.topic_prefix).get("con-arc") is None
    assert watermarks(settings, [partition]) == before, "nothing was written to the run's partition"


def test_an_archive_that_cannot_be_read_is_a_named_error_not_a_500(archived: tuple[Settings, str],
                                                                    topics: Settings) -> None:
    settings, url = archived
    unusable = topics.model_copy(update={"archive_url": "ftp://nowhere/archive"})
    with TestClient(build_app(ConsoleConfig(unusable)), raise_server_exceptions=False) as client:
        page = client.get("/runs/con-arc")
        assert page.status_code == 503 and "Traceback" not in page.text
        assert _text(page.text, "error").startswith("ObjectStoreError: RUNJOURNAL_ARCHIVE_URL=ftp://nowhere/archive")
        doc = client.get("/api/runs/con-arc")
        assert doc.status_code == 503 and doc.json()["error"] == "ObjectStoreError"
    Path(url.removeprefix("file://")).write_bytes(b"not a parquet file")  # the object is there, unreadable
    with TestClient(build_app(ConsoleConfig(settings)), raise_server_exceptions=False) as client:
        page = client.get("/runs/con-arc")
        assert page.status_code == 503 and "Traceback" not in page.text
        assert _text(page.text, "error").startswith("ObjectStoreError: the archive at ")
        assert "could not be read for run con-arc" in _text(page.text, "error")


def _redis(settings: Settings):  # noqa: ANN202 - a redis client
    from runjournal.core import redis_client

    return redis_client.client(settings)

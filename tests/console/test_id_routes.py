"""Run ids in the console's routes and links (issue 28, case 2): any id a run was started with has a working page —
percent-encoded as one path segment in links and redirects, the rest of the path taken as the id — and a path that
is not an id is a 400, not a lookup. Starlette's test client, a stub for the reads (no services)."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from runjournal.console import ConsoleConfig, build_app
from runjournal.console.app import path_segment
from runjournal.core.settings import Settings


class Reads:
    """Stands in for ``ConsoleData``: remembers the run ids asked for; no run has a state."""

    redis = None
    partitions = 1

    def __init__(self) -> None:
        self.asked: list[str] = []

    def run(self, run_id: str, **_: Any) -> None:
        self.asked.append(run_id)

    def close(self) -> None:
        pass


@pytest.fixture
def client() -> tuple[TestClient, Reads]:
    reads = Reads()
    app = build_app(ConsoleConfig(Settings.load(topic_prefix="ids")), data=reads)  # type: ignore[arg-type]
    return TestClient(app), reads


@pytest.mark.parametrize("run_id", ["team/run 1", "a?b#c", "100%", "x/approvals/y", "k:1:2", "名前 🚀"])
def test_a_run_page_reaches_the_id_its_link_encodes(client: tuple[TestClient, Reads], run_id: str) -> None:
    http, reads = client
    for prefix in ("/runs/", "/api/runs/"):
        res = http.get(prefix + path_segment(run_id))
        assert res.status_code == 404 and reads.asked[-1] == run_id  # looked up under exactly that id
    assert "/" not in path_segment(run_id) and "?" not in path_segment(run_id) and "#" not in path_segment(run_id)


def test_a_path_that_is_no_id_is_a_bad_request(client: tuple[TestClient, Reads]) -> None:
    http, reads = client
    res = http.get("/api/runs/")
    assert res.status_code == 400 and res.json()["error"] == "InvalidIdError" and "empty" in res.json()["message"]
    assert reads.asked == []


def test_the_decide_route_takes_the_run_id_before_the_last_two_segments(client: tuple[TestClient, Reads]) -> None:
    """A POST to ``/runs/<encoded id>/approvals/<call>`` reaches the decide handler (403 here: a console without an
    operator token), a GET of the same path is the run page of the id ``…/approvals/…``."""
    http, reads = client
    path = f"/runs/{path_segment('team/run')}/approvals/call-1"
    assert http.post(path, data={"decision": "grant"}).status_code == 403
    assert http.get(path).status_code == 404 and reads.asked[-1] == "team/run/approvals/call-1"


@pytest.mark.parametrize("run_id", ["team/run 1", "a?b#c", "100%", " padded ", "名前 🚀"])
def test_search_goes_to_the_page_of_exactly_the_id_typed(client: tuple[TestClient, Reads], run_id: str) -> None:
    """The header's search box (issue 35): ``/search?run_id=`` redirects to the run's page, the id escaped as one
    segment, and that page looks up exactly the id typed (spaces and ``/`` kept)."""
    http, reads = client
    res = http.get("/search", params={"run_id": run_id}, follow_redirects=False)
    assert res.status_code == 303 and res.headers["location"] == f"/runs/{path_segment(run_id)}"
    assert http.get(res.headers["location"]).status_code == 404 and reads.asked[-1] == run_id


def test_search_without_an_id_is_a_bad_request_naming_the_form(client: tuple[TestClient, Reads]) -> None:
    http, reads = client
    res = http.get("/search", params={"run_id": ""})
    assert res.status_code == 400 and "/search?run_id=ID" in res.text and reads.asked == []
    assert 'action="/search"' in res.text  # every page carries the search box, an error page too

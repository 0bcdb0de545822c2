"""Cancel, pause and resume from the console (issue 31: "the same in the console, operator token"), over HTTP.

The console app (``build_app``, Starlette's test client) on the real broker and Redis; runs written by real
``Journal`` instances, projected by the real projector, carried out by ``runjournal.consumers.ops.control.Operator``
— what the console calls. The journal is read back to its end (a fold), not only the page. The browser test is
``tests/console/test_browser.py`` (pause and resume through the buttons in Chromium).
"""

from __future__ import annotations

import html
import re
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from runjournal.console import ConsoleConfig, build_app
from runjournal.consumers.ops.control import Operator
from runjournal.core.settings import Settings
from runjournal.model.reducer import RunStatus
from runjournal.producers import Journal, RunCancelledError, RunPausedError
from runjournal.schemas import EventType
from tests.support.provider import project
from tests.support.readback import events_of, read_committed

pytestmark = pytest.mark.integration

TOKEN = "op-" + uuid.uuid4().hex
LEASE_MS = 1200  # heartbeats every 0.4 s: a request is seen within half a second
HTML = {"accept": "text/html"}
BEARER = {"authorization": f"Bearer {TOKEN}"}


class Step:
    """A read-only tool: one step of the agent's loop."""

    name = "lookup"
    side_effect = False
    timeout_ms = 1000

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        return {"found": args.get("n")}


def _client(settings: Settings, *, token: str | None = TOKEN, wait_s: float = 5.0) -> TestClient:
    return TestClient(build_app(ConsoleConfig(settings, operator_token=token, control_wait_s=wait_s)))


@pytest.fixture
def console(topics: Settings) -> Iterator[TestClient]:
    """The console with an operator token, signed in as alice."""
    with _client(topics) as client:
        assert client.post("/login", data={"token": TOKEN, "name": "alice"}, follow_redirects=False).status_code == 303
        yield client


@pytest.fixture
def live(topics: Settings) -> Iterator[Journal]:
    """A live agent instance (holds a lease): the one a resume hands a run to."""
    with Journal(topics, producer_id=f"live-{uuid.uuid4().hex[:6]}", lease_ttl_ms=LEASE_MS) as journal:
        yield journal


def _dead_owners_run(topics: Settings) -> str:
    """A run whose owner is dead: a Journal closed without finishing it (its lease goes)."""
    journal = Journal(topics, producer_id=f"dead-{uuid.uuid4().hex[:6]}", lease_ttl_ms=LEASE_MS)
    run = journal.start_run("acme", "looper", {"n": 1})
    run.call(Step(), {"n": 1})
    journal.close()
    project(topics)
    return run.run_id


def _csrf(page: str) -> str:
    return page.split('name="csrf" value="', 1)[1].split('"', 1)[0]


def _fold(topics: Settings, run_id: str) -> Any:
    with Operator(topics, wait_s=0) as operator:
        return operator._fold(run_id)  # noqa: SLF001 - the journal read to its end, not the projection


def _text(page: str, element_id: str) -> str:
    """The text of the element with ``element_id`` (tags dropped, entities decoded, spaces collapsed)."""
    match = re.search(rf'id="{element_id}"[^>]*>(.*?)</(?:p|span|dd)>', page, re.S)
    assert match, f"no #{element_id} on the page"
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", match.group(1))).split())


def _act(client: TestClient, run_id: str, action: str, reason: str) -> Any:
    page = client.get(f"/runs/{run_id}").text
    assert f'action="/runs/{run_id}/{action}"' in page, f"no {action} button on the page"
    return client.post(f"/runs/{run_id}/{action}", data={"reason": reason, "csrf": _csrf(page)}, headers=HTML,
                       follow_redirects=False)


def test_cancel_of_a_dead_owners_run_is_carried_out_and_the_page_says_who_and_why(
        topics: Settings, console: TestClient) -> None:
    run_id = _dead_owners_run(topics)
    page = console.get(f"/runs/{run_id}").text
    csrf = _csrf(page)
    assert "Cancel: no new tool call is sent once every live instance has seen it" in html.unescape(
        re.sub(r"<[^>]+>", "", page)) and 'class="cancel">Cancel</button>' in page
    assert 'class="resume"' not in page  # resume applies to a paused run only
    done = _act(console, run_id, "cancel", "no longer wanted")
    assert done.status_code == 303, done.text
    assert done.headers["location"] == f"/runs/{run_id}?control=cancel&outcome=cancelled"
    state = _fold(topics, run_id)  # carried out by the recovery pass the console ran: the owner is dead
    assert (state.status, state.requested_by, state.error) == (RunStatus.CANCELLED, "alice (console)",
                                                               "no longer wanted")
    with Operator(topics, wait_s=0) as operator:
        assert operator.controls.get(run_id) is None  # carried out: the request is gone
    project(topics)
    page = console.get(done.headers["location"]).text
    assert _text(page, "run-status") == "CANCELLED"
    assert _text(page, "cancelled-by") == "cancelled by alice (console): no longer wanted"
    assert _text(page, "control-notice") == "Cancel: carried out — the run ended CANCELLED."
    assert 'class="control' not in page and "none apply: the run is CANCELLED" in page  # nothing applies now
    api = console.get(f"/api/runs/{run_id}").json()
    assert (api["status"], api["requested_by"], api["error"], api["pending_request"], api["actions"]) == (
        "CANCELLED", "alice (console)", "no longer wanted", None, [])
    again = console.post(f"/runs/{run_id}/cancel", data={"reason": "twice", "csrf": csrf}, headers=HTML)
    assert again.status_code == 409 and "already ended (CANCELLED)" in _text(again.text, "control-refused")
    types = [e.type for e in events_of(read_committed(topics), run_id)]
    assert types.count(EventType.RUN_CANCELLED) == 1 and types[-1] is EventType.RUN_CANCELLED


def test_pause_then_resume_from_the_console(topics: Settings, console: TestClient, live: Journal) -> None:
    """A dead owner's run paused (the recovery pass holds it for nobody), then resumed: handed to the live
    instance under a new epoch, which continues it."""
    run_id = _dead_owners_run(topics)
    paused = _act(console, run_id, "pause", "budget review")
    assert paused.headers["location"] == f"/runs/{run_id}?control=pause&outcome=paused", paused.text
    project(topics)
    page = console.get(paused.headers["location"]).text
    assert _text(page, "run-status") == "PAUSED"
    assert re.fullmatch(r"paused by alice \(console\) at \d{4}-\d\d-\d\d [\d:.]+ UTC: budget review — held for "
                        r"nobody until an operator resumes it", _text(page, "paused-by")), _text(page, "paused-by")
    assert "carried out — the run is PAUSED" in _text(page, "control-notice")
    assert 'class="resume">Resume</button>' in page and 'class="pause"' not in page
    # the runs list: PAUSED is a filter; a paused run is held on purpose, not marked for attention or owner dead
    listed = console.get("/runs?status=PAUSED").text
    assert '<option value="PAUSED" selected>' in listed and f'data-run="{run_id}"' in listed
    row = listed[listed.index(f'data-run="{run_id}"') - 40:].split("</tr>", 1)[0]
    assert 'class="a3"' in row and "held until an operator resumes it" in row and "owner dead" not in row
    assert run_id not in {r["run_id"] for r in console.get("/api/runs?status=owner_dead").json()["runs"]}
    resumed = _act(console, run_id, "resume", "approved")
    assert resumed.headers["location"] == f"/runs/{run_id}?control=resume&outcome=resumed", resumed.text
    state = _fold(topics, run_id)
    assert (state.status, state.epoch, state.owner, state.requested_by, state.request_reason) == (
        RunStatus.RUNNING, 3, live.producer_id, "alice (console)", "approved")
    project(topics)
    page = console.get(resumed.headers["location"]).text
    assert _text(page, "run-status") == "RUNNING" and "carried out — the run was handed" in page
    assert _text(page, "resumed-by") == "resumed at epoch 3 by alice (console): approved"
    assert live.claim_assignment(10) == run_id  # the live instance takes it and finishes it
    run = live.resume(run_id)
    assert run.call(Step(), {"n": 1}) == {"found": 1}  # recorded: returned, not run again
    run.succeed("done")


def test_a_pending_request_is_shown_and_answered_by_the_api(topics: Settings, console: TestClient,
                                                           live: Journal) -> None:
    """A live owner that does not reach a step within the wait: the cancel is ``requested``, the page and
    ``/api/runs/{id}`` show it pending; the owner's next step carries it out."""
    run = live.start_run("acme", "looper", {"n": 1})
    run.call(Step(), {"n": 1})
    live.flush()
    project(topics)
    with _client(topics, wait_s=1.0) as quick:
        quick.post("/login", data={"token": TOKEN, "name": "bob"})
        asked = _act(quick, run.run_id, "cancel", "runaway")
        assert asked.headers["location"] == f"/runs/{run.run_id}?control=cancel&outcome=requested", asked.text
        page = quick.get(asked.headers["location"]).text
    assert re.fullmatch(r"cancel requested by bob \(console\) at \d{4}-\d\d-\d\d [\d:.]+ UTC: runaway — the owner "
                        r"carries it out at its next step .*", _text(page, "control-pending"))
    assert _text(page, "run-status") == "RUNNING" and "Cancel: requested, not carried out yet" in page
    pending = console.get(f"/api/runs/{run.run_id}").json()["pending_request"]
    assert (pending["action"], pending["requested_by"], pending["reason"]) == ("cancel", "bob (console)", "runaway")
    with pytest.raises(RunCancelledError):
        for n in range(100):  # the agent's loop: its next step carries the cancel out
            run.call(Step(), {"n": n + 2})
            time.sleep(0.05)
    project(topics)
    api = console.get(f"/api/runs/{run.run_id}").json()
    assert (api["status"], api["pending_request"], api["requested_by"]) == ("CANCELLED", None, "bob (console)")


def test_a_live_owner_pauses_at_its_next_step(topics: Settings, console: TestClient, live: Journal) -> None:
    run = live.start_run("acme", "looper", {"n": 1})
    live.flush()
    project(topics)
    stopped: list[BaseException] = []

    def loop() -> None:
        try:
            for n in range(400):
                run.call(Step(), {"n": n})
                time.sleep(0.02)
        except RunPausedError as exc:
            stopped.append(exc)

    agent = threading.Thread(target=loop)
    agent.start()
    paused = _act(console, run.run_id, "pause", "hold on")
    agent.join(30)
    assert stopped and paused.headers["location"].endswith("outcome=paused"), paused.text
    state = _fold(topics, run.run_id)
    assert (state.status, state.owner, state.requested_by, state.request_reason) == (
        RunStatus.PAUSED, None, "alice (console)", "hold on")


def test_refusals_write_nothing(topics: Settings, console: TestClient) -> None:
    """A resume of a run that is not paused, a pause of an unknown run: 409 with the reason (on the run's page for a
    browser, plain text for a script), nothing stored (no request, no event)."""
    run_id = _dead_owners_run(topics)
    before = len(events_of(read_committed(topics), run_id))
    page = console.get(f"/runs/{run_id}").text
    refused = console.post(f"/runs/{run_id}/resume", data={"reason": "go", "csrf": _csrf(page)}, headers=HTML)
    assert refused.status_code == 409
    assert _text(refused.text, "control-refused") == (f"resume refused: run {run_id} is RUNNING, not paused: nothing "
                                                      "to resume — nothing was written.")
    assert _text(refused.text, "run-status") == "RUNNING"  # the run's page, with the refusal
    script = console.post(f"/runs/{run_id}/resume", data={"reason": "go"}, headers=BEARER)
    assert script.status_code == 409 and script.text.startswith("refused: ") and "not paused" in script.text
    unknown = console.post("/runs/no-such-run/pause", data={"reason": "x", "csrf": _csrf(page)}, headers=HTML)
    assert unknown.status_code == 409 and "no run no-such-run here" in unknown.text
    with Operator(topics, wait_s=0) as operator:
        assert operator.controls.get(run_id) is None and operator.controls.get("no-such-run") is None
    assert len(events_of(read_committed(topics), run_id)) == before
    metrics = console.get("/metrics").text
    assert 'runjournal_console_controls_total{action="resume",result="refused"} 2.0' in metrics


def test_controls_need_the_operator_token_and_csrf(topics: Settings) -> None:
    """403 on a console started without a token (no buttons, whatever is sent); with one: 401 without
    credentials, with a wrong bearer token, or a session without the CSRF field — nothing stored."""
    run_id = _dead_owners_run(topics)
    with _client(topics, token=None) as plain:
        page = plain.get(f"/runs/{run_id}").text
        assert 'class="control' not in page and "read-only console" in page
        for action in ("cancel", "pause", "resume"):
            refused = plain.post(f"/runs/{run_id}/{action}", data={"reason": "x"}, headers=BEARER)
            assert refused.status_code == 403 and "without an operator token" in refused.text
    with _client(topics) as anonymous:
        page = anonymous.get(f"/runs/{run_id}").text
        assert 'class="control' not in page and "sign in</a> to cancel, pause" in page
        for headers in ({}, {"authorization": "Bearer wrong"}):
            assert anonymous.post(f"/runs/{run_id}/cancel", data={"reason": "x"},
                                  headers=headers).status_code == 401
        anonymous.post("/login", data={"token": TOKEN, "name": "mallory"})
        no_csrf = anonymous.post(f"/runs/{run_id}/cancel", data={"reason": "x"}, headers=HTML)
        assert no_csrf.status_code == 401 and "operator credentials required" in no_csrf.text
        forged = anonymous.post(f"/runs/{run_id}/cancel", data={"reason": "x", "csrf": "0" * 64}, headers=HTML)
        assert forged.status_code == 401
    with Operator(topics, wait_s=0) as operator:
        assert operator.controls.get(run_id) is None
    assert _fold(topics, run_id).status is RunStatus.RUNNING

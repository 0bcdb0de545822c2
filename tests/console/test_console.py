"""The console's reads and its decision endpoint, over HTTP against ``runjournal console`` subprocesses.

Runs of every shape (parked on a seq gap, an OUTCOME_UNKNOWN call, waiting for approval, running, done) are
published to the real broker and projected into the real Redis; the runs index the projector writes with each
state is compared with the states themselves. The browser-driven acceptance tests are in
``tests/console/test_browser.py``.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import redis

from runjournal.console import ConsoleData
from runjournal.consumers.ops.erase import erase_run
from runjournal.consumers.projector.index import read_index
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.deploy.procs import free_port
from runjournal.producers.approvals import ApprovalInbox
from runjournal.schemas import Event, EventType
from runjournal.schemas.keys import partition_for
from tests.support.provider import project
from tests.support.workload import publish, run_events

pytestmark = [pytest.mark.integration]
T = EventType
TOKEN = "op-" + uuid.uuid4().hex


def _ev(run_id: str, seq: int, etype: EventType, payload: dict, *, epoch: int = 1, tenant: str = "acme",
        at_ms: int = 0) -> Event:
    when = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(milliseconds=at_ms or seq)
    return Event(event_id=str(uuid.uuid4()), run_id=run_id, tenant_id=tenant, seq=seq, epoch=epoch,
                 producer_id=f"agent-{epoch}", type=etype, occurred_at=when, payload=payload)


def shapes() -> dict[str, list[Event]]:
    """One run per attention class, with distinct tenants and agents for the filters."""
    started = {"agent": "booker", "input_json": "{}", "user_id": "u1"}
    intent = {"call_id": "c0", "tool": "send_email", "idempotency_key": "k-unknown", "args_digest": "a",
              "side_effect": True, "attempt": 1, "timeout_ms": 1000, "args_json": "{}"}
    return {
        "r-parked": [_ev("r-parked", 1, T.RUN_STARTED, started), _ev("r-parked", 3, T.MESSAGE,
                                                                     {"role": "user", "content": "x"})],
        "r-unknown": [_ev("r-unknown", 1, T.RUN_STARTED, started, tenant="globex"),
                      _ev("r-unknown", 2, T.TOOL_CALL_INTENDED, intent, tenant="globex"),
                      _ev("r-unknown", 3, T.RUN_RESUMED, {"previous_epoch": 1, "recovered_by": "recovery@test",
                                                          "plan_json": '{"calls": {"OUTCOME_UNKNOWN": 1}}',
                                                          "assigned_to": "agent-2"}, epoch=2, tenant="globex")],
        "r-approval": [_ev("r-approval", 1, T.RUN_STARTED, {**started, "agent": "mailer"}),
                       _ev("r-approval", 2, T.APPROVAL_REQUESTED, {"call_id": "send", "reason": "needs a human",
                                                                  "tool": "send_email"})],
        "r-running": run_events("r-running", finish=False),
        "r-done": run_events("r-done"),
    }


@pytest.fixture
def projected(topics: Settings) -> Settings:
    publish(topics, [e for events in shapes().values() for e in events])
    project(topics)
    return topics


def _console(env: dict[str, str], *, token: str | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**env, **({"RUNJOURNAL_CONSOLE_OPERATOR_TOKEN": token} if token else {})}
    proc = subprocess.Popen([sys.executable, "-m", "runjournal", "console", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "the console did not answer within 60 s"
        time.sleep(0.2)


@pytest.fixture
def consoles(projected: Settings, service_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """Two ``runjournal console`` processes on the same prefix: one with an operator token, one without."""
    with_token, url_token = _console(service_env, token=TOKEN)
    read_only, url_plain = _console(service_env, token=None)
    try:
        yield {"token": url_token, "plain": url_plain}
    finally:
        for proc in (with_token, read_only):
            proc.terminate()
            proc.wait(20)


def test_index_summarises_every_projected_state(projected: Settings) -> None:
    data = ConsoleData(projected)
    store = data.store
    summaries = {s.run_id: s for s in read_index(data.redis, store, range(projected.partitions))}
    assert set(summaries) == set(shapes())
    for run_id, summary in summaries.items():
        state = store.get(partition_for(run_id, projected.partitions), run_id)
        assert (summary.status, summary.tenant_id, summary.agent, summary.epoch, summary.last_seq) == (
            state.status.value, state.tenant_id, state.agent, state.epoch, state.last_seq)
        assert summary.calls == len(state.records)
    assert summaries["r-unknown"].unknown_calls == 1 and summaries["r-unknown"].epoch == 2
    assert summaries["r-approval"].pending_approvals == 1
    data.close()


def test_runs_list_puts_parked_and_outcome_unknown_first_and_filters(projected: Settings) -> None:
    data = ConsoleData(projected)
    order = [r.run_id for r in data.runs().rows]
    assert order[:3] == ["r-parked", "r-unknown", "r-approval"]
    assert order[3:] == ["r-running", "r-done"]
    assert [r.run_id for r in data.runs(status="parked").rows] == ["r-parked"]
    assert [r.run_id for r in data.runs(status="SUCCEEDED").rows] == ["r-done"]
    assert [r.run_id for r in data.runs(tenant="globex").rows] == ["r-unknown"]
    assert [r.run_id for r in data.runs(agent="mailer").rows] == ["r-approval"]
    two = data.runs(per_page=2, page=2)
    assert (two.pages, [r.run_id for r in two.rows]) == (3, ["r-approval", "r-running"])
    data.close()


def test_runs_whose_owner_holds_no_lease_are_marked_and_counted(projected: Settings) -> None:
    """Issue 35 case 3: a RUNNING run whose owner is dead carried no attention marker."""
    data = ConsoleData(projected)
    unfinished = {r.run_id: r.owner for r in data.runs().rows if r.status in ("RUNNING", "WAITING_APPROVAL")}
    page = data.runs()
    assert page.owner_dead == len(unfinished) and page.dead_owners >= set(unfinished.values())  # nobody holds one
    assert {r.run_id for r in data.runs(status="owner_dead").rows} == set(unfinished)
    alive = unfinished["r-running"]
    data.redis.set(RedisKeys(projected.topic_prefix).lease(alive), "{}", px=60_000)  # its owner is back
    try:
        assert "r-running" not in {r.run_id for r in data.runs(status="owner_dead").rows}
    finally:
        data.redis.delete(RedisKeys(projected.topic_prefix).lease(alive))
    data.close()


def test_erase_removes_the_index_entry_and_an_older_projection_is_still_listed(projected: Settings) -> None:
    erase_run(projected, "r-done", erase_memory=False)
    project(projected)
    data = ConsoleData(projected)
    before = {r.run_id: r for r in data.runs().rows}
    assert set(before) == set(shapes()) - {"r-done"}
    # a projection written before the index existed: the list reads the states the index lacks
    r = redis.Redis.from_url(projected.redis_url)
    for p in range(projected.partitions):
        r.delete(data.store.index_key(p))
    assert {r.run_id: r for r in data.runs().rows} == before
    data.close()


def test_console_pages_answer_over_http(consoles: dict[str, str]) -> None:
    runs = httpx.get(f"{consoles['plain']}/api/runs", timeout=30).json()
    assert [r["run_id"] for r in runs["runs"]][:2] == ["r-parked", "r-unknown"]
    page = httpx.get(f"{consoles['plain']}/runs?status=parked", timeout=30)
    assert page.status_code == 200 and "r-parked" in page.text and "r-done" not in page.text
    assert page.headers["content-security-policy"].startswith("default-src 'self'")
    links = re.findall(r'(?:src|href|action)="([^"]*)"', page.text)
    assert "<script" not in page.text and links and all(u.startswith(("/", "?")) for u in links), links  # no CDN
    run = httpx.get(f"{consoles['plain']}/api/runs/r-unknown", timeout=60).json()
    assert [e["epoch"] for e in run["epochs"]] == [1, 2] and run["epochs"][1]["calls"] == {"OUTCOME_UNKNOWN": 1}
    assert [(r["call_id"], r["class"]) for r in run["records"]] == [("c0", "outcome unknown")]
    assert [(t["seq"], t["epoch"]) for t in run["timeline"]] == [(1, 1), (2, 1), (3, 2)]
    assert sorted(t["offset"] for t in run["timeline"]) == [t["offset"] for t in run["timeline"]]
    missing = httpx.get(f"{consoles['plain']}/runs/no-such-run", timeout=30)
    assert missing.status_code == 404 and "no state for run no-such-run" in missing.text


def test_bad_queries_are_400_and_api_errors_are_json(consoles: dict[str, str]) -> None:
    """A page number that is not one is the client's error (400, not a 503 naming a ValueError); every /api/
    answer — a run not found, an unknown endpoint, a bad query — is JSON."""
    base = consoles["plain"]
    for path in ("/runs?page=abc", "/api/runs?page=abc", "/runs?page=-1", "/api/runs?page=1.5"):
        res = httpx.get(f"{base}{path}", timeout=30)
        assert res.status_code == 400 and "page must be a positive whole number" in res.text, (path, res.text)
        if path.startswith("/api/"):
            assert res.json()["error"] == "BadRequest"
    assert httpx.get(f"{base}/api/runs?page=99", timeout=30).json()["page"] == 1  # past the end: the last page
    missing = httpx.get(f"{base}/api/runs/doesnotexist", timeout=30)
    assert missing.status_code == 404 and missing.headers["content-type"].startswith("application/json")
    assert missing.json()["error"] == "RunNotFound" and "doesnotexist" in missing.json()["message"]
    unknown = httpx.get(f"{base}/api/nothing-here", timeout=30)
    assert unknown.status_code == 404 and unknown.json()["error"] == "NotFound"
    assert httpx.get(f"{base}/runs/doesnotexist", timeout=30).headers["content-type"].startswith("text/html")


def test_status_counts_follow_the_tenant_and_agent_filters(consoles: dict[str, str]) -> None:
    """by_status counts the runs the tenant/agent filters select (each status tab's count), not every run."""
    base = consoles["plain"]
    assert httpx.get(f"{base}/api/runs?tenant=nonexistent", timeout=30).json() | {"runs": []} == {
        "runs": [], "total": 0, "page": 1, "pages": 1, "by_status": {}, "owner_dead": 0, "dead_owners": []}
    globex = httpx.get(f"{base}/api/runs?tenant=globex", timeout=30).json()
    assert globex["total"] == sum(globex["by_status"].values()) == 1
    mailer = httpx.get(f"{base}/api/runs?agent=mailer&status=SUCCEEDED", timeout=30).json()
    assert mailer["total"] == 0 and mailer["by_status"] == {"WAITING_APPROVAL": 1}
    every = httpx.get(f"{base}/api/runs", timeout=30).json()
    assert sum(every["by_status"].values()) == every["total"] == len(shapes())


def test_decisions_only_with_the_operator_token(consoles: dict[str, str], projected: Settings) -> None:
    inbox = ApprovalInbox(redis.Redis.from_url(projected.redis_url), projected.topic_prefix)
    route = "/runs/r-approval/approvals/send"
    html = {"accept": "text/html"}
    # a console started without a token: no buttons, and the endpoint refuses whatever is sent
    page = httpx.get(f"{consoles['plain']}/runs/r-approval", timeout=60).text
    assert "needs a human" in page and "Approve</button>" not in page and "read-only console" in page
    refused = httpx.post(consoles["plain"] + route, data={"decision": "grant"},
                         headers={"authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert refused.status_code == 403 and "without an operator token" in refused.text
    # a console with a token: anonymous → no buttons, 401; a wrong token or a missing CSRF field → 401
    page = httpx.get(f"{consoles['token']}/runs/r-approval", timeout=60).text
    assert "Approve</button>" not in page and "sign in</a> to decide" in page
    for headers in ({}, {"authorization": "Bearer wrong"}):
        assert httpx.post(consoles["token"] + route, data={"decision": "grant"}, headers=headers,
                          timeout=30).status_code == 401
    with httpx.Client(base_url=consoles["token"], timeout=60) as browser:
        assert browser.post("/login", data={"token": "wrong", "name": "eve"}).status_code == 401
        assert browser.post("/login", data={"token": TOKEN, "name": "alice"}).status_code == 303
        page = browser.get("/runs/r-approval").text
        assert "Approve</button>" in page and "Deny</button>" in page
        assert browser.post(route, data={"decision": "grant"}, headers=html).status_code == 401  # no CSRF
        assert inbox.decision("r-approval", "send") is None
        csrf = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        done = browser.post(route, data={"decision": "grant", "csrf": csrf, "comment": "ok"}, headers=html)
        assert done.status_code == 303 and done.headers["location"] == "/runs/r-approval?decided=send"
    decided = inbox.decision("r-approval", "send")
    assert decided["decision"] == "GRANTED" and decided["approver"] == "alice (console)" and decided["comment"] == "ok"
    # the first decision wins; a call that is not pending is refused, nothing written
    again = httpx.post(consoles["token"] + route, data={"decision": "deny"},
                       headers={"authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert again.status_code == 409 and "already waiting" in again.text
    nothing = httpx.post(consoles["token"] + "/runs/r-done/approvals/send", data={"decision": "grant"},
                         headers={"authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert nothing.status_code == 409 and inbox.decision("r-done", "send") is None
    metrics = httpx.get(f"{consoles['token']}/metrics", timeout=30).text
    assert 'runjournal_console_decisions_total{decision="grant",result="written"} 1.0' in metrics


def test_a_denial_from_the_console_is_recorded_with_its_reason(consoles: dict[str, str], projected: Settings) -> None:
    """The deny form's text is the denial's ``reason`` (issue 35: it was stored as ``comment``), as
    ``deny --reason``."""
    inbox = ApprovalInbox(redis.Redis.from_url(projected.redis_url), projected.topic_prefix)
    done = httpx.post(consoles["token"] + "/runs/r-approval/approvals/send",
                      data={"decision": "deny", "comment": "not to that address"},
                      headers={"authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert done.status_code == 200 and done.json()["written"] is True, done.text
    decided = inbox.decision("r-approval", "send")
    assert decided["decision"] == "DENIED" and decided["reason"] == "not to that address" and "comment" not in decided


def test_the_operator_token_is_a_masked_setting(service_env: dict[str, str]) -> None:
    shown = subprocess.run([sys.executable, "-m", "runjournal", "settings"], capture_output=True, text=True,
                           env={**service_env, "RUNJOURNAL_CONSOLE_OPERATOR_TOKEN": TOKEN}, timeout=60, check=True)
    assert '"console_operator_token": "***"' in shown.stdout and TOKEN not in shown.stdout


def test_a_console_without_a_stack_or_topic_names_the_fix(settings: Settings, service_env: dict[str, str]) -> None:
    """``settings`` (not ``topics``): the prefix's topics were never created."""
    port = str(free_port())
    started = time.monotonic()
    no_topic = subprocess.run([sys.executable, "-m", "runjournal", "console", "--port", port], env=service_env,
                              capture_output=True, text=True, timeout=60, check=False)
    assert no_topic.returncode == 1 and "runjournal topics create" in no_topic.stderr
    no_stack = subprocess.run([sys.executable, "-m", "runjournal", "console", "--port", port],
                              env={**service_env, "RUNJOURNAL_BOOTSTRAP": f"127.0.0.1:{free_port()}",
                                   "RUNJOURNAL_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"},
                              capture_output=True, text=True, timeout=60, check=False)
    assert no_stack.returncode == 1 and "runjournal stack up" in no_stack.stderr
    assert time.monotonic() - started < 2 * (5 + 6)  # each within its 5 s budget plus interpreter start


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_console_stops_cleanly_on_ctrl_c_and_sigterm(projected: Settings, service_env: dict[str, str],
                                                        sig: signal.Signals) -> None:
    """Issue 35 case 8: the console exited 130 on Ctrl-C where the docs say a stop asked for is exit 0 (uvicorn
    raises the signal again after its graceful shutdown)."""
    proc, _url = _console(service_env, token=None)
    proc.send_signal(sig)
    assert proc.wait(30) == 0, proc.stderr.read()[-2000:] if proc.stderr else ""
    assert "Traceback" not in (proc.stderr.read() if proc.stderr else "")


def test_a_fenced_service_stays_on_the_lag_view_as_stopped_with_why(topics: Settings,
                                                                    service_env: dict[str, str]) -> None:
    """Issue 35: a service that stopped on an error (here a projector fenced by a second one with its
    ``--instance-id``) deleted its announcement on the way out and vanished from the Lag page; it now leaves a
    "stopped since …, why" marker, shown for an hour like a killed one's "missing". A clean stop still withdraws."""
    from runjournal.console.lag import LagBoard

    port = free_port()
    argv = [sys.executable, "-m", "runjournal", "projector", "--instance-id", f"same-{uuid.uuid4().hex[:6]}"]
    first = subprocess.Popen([*argv, "--metrics-port", str(port), "--metrics-addr", "127.0.0.1"], env=service_env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    board = LagBoard(redis.Redis.from_url(topics.redis_url), topics.topic_prefix, lambda: topics.partitions, ttl_s=0)
    try:
        deadline = time.monotonic() + 120
        while not any(ep.service == "projector" and ep.up for ep in board.view().endpoints):
            assert first.poll() is None, first.stderr.read()[-2000:] if first.stderr else ""
            assert time.monotonic() < deadline, "the projector never announced its /metrics"
            time.sleep(0.5)
        time.sleep(5)  # joined the group
        second = subprocess.Popen(argv, env=service_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            assert first.wait(90) == 1, first.stderr.read()[-2000:] if first.stderr else ""
        finally:
            second.terminate()
            second.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
    (row,) = [ep for ep in board.view().endpoints if ep.service == "projector"]
    assert not row.up and row.stopped is not None and "--instance-id" in row.stopped, row
    assert row.error is not None and row.error.startswith("stopped since ") and "--instance-id" in row.error, row
    assert row.url == f"http://127.0.0.1:{port}/metrics"
    board.close()

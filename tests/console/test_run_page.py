"""The run page as the run's event history (issue 35, case 1), rendered by the console app from a folded run:
input and output, each event's payload (JSON fields decoded), the graph's nodes, one time format, a pending
approval with its arguments and what each decision does, a note when the projection is behind the history, and the
operator controls that apply (issue 31).
Starlette's test client, a stub for the reads built with ``runjournal.console.queries.run_page`` (no services)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.testclient import TestClient

from runjournal.console import ConsoleConfig, build_app
from runjournal.console.app import path_segment
from runjournal.console.queries import LARGE_PAYLOAD_CHARS, MAX_PAYLOAD_CHARS, RunPage, run_page
from runjournal.core.settings import Settings
from runjournal.model.reducer import fold
from runjournal.schemas import Event, EventType

RUN = "team/history 1"
AT = datetime(2026, 12, 2, 16, 5, 1, 123000, tzinfo=UTC)


def _events() -> list[Event]:
    def ev(seq: int, etype: EventType, node: str | None = None, **payload: Any) -> Event:
        return Event(event_id=f"00000000-0000-4000-8000-{seq:012d}", run_id=RUN, tenant_id="t", seq=seq, epoch=1,
                     producer_id="agent-a", type=etype, occurred_at=AT + timedelta(seconds=seq), node_id=node,
                     payload=payload)

    big = "x" * (MAX_PAYLOAD_CHARS + LARGE_PAYLOAD_CHARS)
    return [
        ev(1, EventType.RUN_STARTED, agent="mailer", input_json='{"to":"bob"}', user_id="u1"),
        ev(2, EventType.NODE_STARTED, "plan", node_path="plan", attempt=1),
        ev(3, EventType.MESSAGE, "plan", role="assistant", content="drafting the confirmation email", user_id=None),
        ev(4, EventType.TOOL_CALL_INTENDED, "plan", call_id="c1", tool="lookup", idempotency_key="k1",
           args_digest="d1", side_effect=False, attempt=1, timeout_ms=1000, args_json='{"q":"' + big + '"}'),
        ev(5, EventType.TOOL_CALL_COMMITTED, "plan", call_id="c1", tool="lookup", idempotency_key="k1",
           args_digest="d1", result_json='{"found":3}', result_ref=None, result_digest="r1"),
        ev(6, EventType.NODE_SUCCEEDED, "plan", node_path="plan", output_digest=None),
        ev(7, EventType.APPROVAL_REQUESTED, "send", call_id="send", reason="send_email needs a human",
           tool="send_email", scope_call_id=None, scope_attempt=None,
           args_json='{"subject":"booking 0","to":"bob@example.com"}'),
    ]


def _rows(events: list[Event]) -> list[dict[str, Any]]:
    return [{"offset": 100 + i, "key": f"{e.run_id}:{e.epoch}:{e.seq}", "seq": e.seq, "epoch": e.epoch,
             "type": str(e.type), "node_id": e.node_id, "event": e} for i, e in enumerate(events)]


class Reads:
    """Stands in for ``ConsoleData``: one run, its page built by ``run_page`` from the events folded up to
    ``projected`` of them (the rest is the history the projection has not reached)."""

    redis = None
    partitions = 1

    def __init__(self, events: list[Event], projected: int) -> None:
        rows = _rows(events)
        state = fold([(r["event"], 0, r["offset"]) for r in rows[:projected]])
        assert state is not None
        self.page = run_page(RUN, 0, state, rows, inbox_decision=lambda _run, _call: None)

    def run(self, run_id: str, **_: Any) -> RunPage | None:
        return self.page if run_id == RUN else None

    def close(self) -> None:
        pass


def _get(reads: Reads) -> str:
    app = build_app(ConsoleConfig(Settings.load(topic_prefix="page"), operator_token="t0ken"), data=reads)  # type: ignore[arg-type]
    res = TestClient(app).get(f"/runs/{path_segment(RUN)}")
    assert res.status_code == 200, res.text[-2000:]
    return res.text


def _section(html: str, name: str) -> str:
    start = html.index(f'<section id="{name}">')
    return html[start:html.index("</section>", start)]


def test_the_history_shows_input_output_payloads_nodes_and_one_time_format() -> None:
    html = _get(Reads(_events(), projected=7))
    io = _section(html, "io")
    assert "&#34;to&#34;: &#34;bob&#34;" in io and "not yet: the run has not ended" in io
    history = _section(html, "timeline")
    assert "drafting the confirmation email" in history  # a message's text, not only its type
    assert "&#34;found&#34;: 3" in history  # the result decoded, pretty-printed
    assert re.search(r"summary>c1 lookup .*<span class=\"muted\">\(\d+ characters\)</span>", history)  # collapsed
    assert "more characters: `runjournal inspect team/history 1 --json` shows the whole event" in history  # capped
    assert len(history) < MAX_PAYLOAD_CHARS + 20_000
    times = re.findall(r"<td>(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})</td>", history)
    assert len(times) == 7 and times[0] == "2026-12-02 16:05:02.123" and "T16:" not in html  # one format
    assert "plan" in _section(html, "nodes") and "SUCCEEDED" in _section(html, "nodes")
    assert 'id="behind"' not in html


def test_a_pending_approval_shows_its_arguments_and_what_each_decision_does() -> None:
    approvals = _section(_get(Reads(_events(), projected=7)), "approvals")
    assert "bob@example.com" in approvals and "booking 0" in approvals
    assert "Approve</b>: the run's owner runs send_email." in approvals
    assert "Deny</b>: the owner never runs it" in approvals
    assert "It happened" not in approvals  # a step's own approval: not bound to an unknown outcome


def test_a_projection_behind_the_history_is_said_not_contradicted() -> None:
    html = _get(Reads(_events(), projected=5))
    note = html[html.index('id="behind"'):].split("</p>")[0]
    assert "2 event(s) behind the topic" in note and "offset 104" in note and "offset 106" in note


def test_the_api_answers_what_the_page_shows() -> None:
    """``/api/runs/{id}`` is the page as JSON (one ``RunPage`` builds both): input, output, the graph's nodes, the
    header's facts and — when the projection is behind the history — the same note, word for word."""
    import html as html_text

    for projected, nodes, behind in ((7, [("plan", "SUCCEEDED", 1)], 0), (5, [("plan", "RUNNING", 1)], 2)):
        reads = Reads(_events(), projected=projected)
        app = build_app(ConsoleConfig(Settings.load(topic_prefix="page")), data=reads)  # type: ignore[arg-type]
        client = TestClient(app)
        api = client.get(f"/api/runs/{path_segment(RUN)}").json()
        page = html_text.unescape(client.get(f"/runs/{path_segment(RUN)}").text)
        assert api["input"] == {"to": "bob"} and api["output"] is None
        assert [(n["node_path"], n["status"], n["attempt"]) for n in api["nodes"]] == nodes
        assert (api["tenant_id"], api["agent"], api["user_id"], api["epoch"]) == ("t", "mailer", "u1", 1)
        assert api["applied_offset"] == 99 + projected and api["last_seq"] == projected
        assert api["behind"] == behind and len(api["timeline"]) == 7
        if behind:
            assert "2 event(s) behind the topic" in api["behind_note"] and api["behind_note"] in page
        else:
            assert api["behind_note"] is None and 'id="behind"' not in page
        assert api == reads.page.as_dict()  # the API's JSON is the page's own fields, nothing rebuilt


def test_the_controls_that_apply_and_the_notice_after_one() -> None:
    """Issue 31: a running run offers Cancel and Pause (to an operator; sign-in first otherwise), a paused one
    Resume and Cancel, with who paused it and why in the header; the notice after an action is a fixed sentence
    chosen by the outcome's word — text from the URL never reaches the page."""
    app = build_app(ConsoleConfig(Settings.load(topic_prefix="page"), operator_token="t0ken"),
                    data=Reads(_events(), projected=7))  # type: ignore[arg-type]
    client = TestClient(app)
    url = f"/runs/{path_segment(RUN)}"
    assert "sign in</a> to cancel, pause" in _section(client.get(url).text, "controls")
    client.post("/login", data={"token": "t0ken", "name": "alice"}, follow_redirects=False)
    controls = _section(client.get(url).text, "controls")
    assert re.findall(r'<button type="submit" class="(\w+)"', controls) == ["cancel", "pause"]
    assert "the run ends CANCELLED and is never resumed" in controls and 'name="reason"' in controls
    for query, said in (("control=pause&outcome=paused", "Pause: carried out — the run is PAUSED"),
                        ("control=cancel&outcome=requested", "Cancel: requested, not carried out yet"),
                        ("control=pause&outcome=cancelled", "Pause: not carried out as asked — the run ended "
                                                             "CANCELLED."),
                        ("control=resume&outcome=superseded", "Resume: the recovery pass reported superseded")):
        assert said in client.get(f"{url}?{query}").text, query
    for query in ("control=cancel&outcome=%3Cb%3Epwned%3C/b%3E", "control=erase&outcome=cancelled",
                  "control=cancel&outcome=" + "x" * 41):
        assert 'id="control-notice"' not in client.get(f"{url}?{query}").text, query
    paused = _events()[:6] + [Event(
        event_id="00000000-0000-4000-8000-000000000099", run_id=RUN, tenant_id="t", seq=7, epoch=2,
        producer_id="recovery", type=EventType.RUN_RESUMED, occurred_at=AT + timedelta(seconds=7),
        payload={"previous_epoch": 1, "recovered_by": "recovery@test", "plan_json": "{}", "assigned_to": None,
                 "paused": True, "requested_by": "bob (console)", "request_reason": "budget review"})]
    app = build_app(ConsoleConfig(Settings.load(topic_prefix="page"), operator_token="t0ken"),
                    data=Reads(paused, projected=7))  # type: ignore[arg-type]
    client = TestClient(app)
    client.post("/login", data={"token": "t0ken", "name": "alice"}, follow_redirects=False)
    page = client.get(url).text
    assert "paused by bob (console) at 2026-12-02 16:05:08.123 UTC: budget review" in page
    assert re.findall(r'<button type="submit" class="(\w+)"', _section(page, "controls")) == ["cancel", "resume"]
    api = client.get(f"/api/runs/{path_segment(RUN)}").json()
    assert (api["status"], api["requested_by"], api["request_reason"], api["actions"], api["pending_request"]) == (
        "PAUSED", "bob (console)", "budget review", ["cancel", "resume"], None)


def test_a_run_over_its_event_budget_is_marked() -> None:
    """README § Limits: a run that reached ``run_events_warn`` says so on its page; one below it does not."""
    reads = Reads(_events(), projected=7)
    for budget, marked in ((7, True), (8, False), (0, False)):
        settings = Settings.load(topic_prefix="page", run_events_warn=budget)
        app = build_app(ConsoleConfig(settings), data=reads)  # type: ignore[arg-type]
        html = TestClient(app).get(f"/runs/{path_segment(RUN)}").text
        assert ("over the event budget of 7" in html) is marked, budget


def test_a_long_runs_page_shows_its_newest_events_and_open_records() -> None:
    """A break-it finding: a 10,000-event run's page was 9.5 MB of HTML. The page shows the newest TIMELINE_ROWS
    events and every open record with the newest RECORD_ROWS others, and says how many there are in all."""
    from runjournal.console.queries import RECORD_ROWS, TIMELINE_ROWS

    base = _events()[:3]  # RUN_STARTED, PLAN_COMPILED, NODE_STARTED
    at = base[-1].occurred_at
    calls: list[Event] = []
    seq = len(base)

    def ev(etype: EventType, payload: dict[str, Any]) -> Event:
        nonlocal seq
        seq += 1
        return Event(event_id=f"e{seq}", run_id=RUN, tenant_id="t", seq=seq, epoch=1, producer_id="p", type=etype,
                     occurred_at=at, payload=payload, node_id="plan")

    for i in range(1_200):  # 2,399 events, 1,200 records; the first one left open (no outcome)
        common = {"call_id": f"c{i}", "tool": "lookup", "idempotency_key": f"k{i:04d}" + "0" * 59}
        calls.append(ev(EventType.TOOL_CALL_INTENDED, {**common, "side_effect": False, "attempt": 1,
                                                        "timeout_ms": 100, "args_digest": "a" * 64}))
        if i:
            calls.append(ev(EventType.TOOL_CALL_COMMITTED, {**common, "result_json": "1", "result_digest": "r" * 64}))
    events = [*base, *calls]
    page = Reads(events, projected=len(events)).page
    assert page.timeline_total == len(events) and len(page.timeline) == TIMELINE_ROWS
    assert page.timeline[-1]["offset"] == 100 + len(events) - 1  # the newest
    assert page.records_total == 1_200 and len(page.records) == RECORD_ROWS + 1
    assert page.records[0]["call_id"] == "c0" and page.records[0]["status"] == "INTENDED"  # the open one kept
    html = _get(Reads(events, projected=len(events)))
    assert f"the newest {TIMELINE_ROWS} of {len(events)} events" in html and len(html) < 2_000_000


def test_a_run_with_spend_shows_it_settled_open_and_by_model() -> None:
    """Issue 32 (docs/guide/spend.md § See it): the run page folds the reserve and settle steps (``fold_spend``):
    settled, open (unknown spend: reserved and never settled) and by model, money in currency units with the code;
    a run without spend records has no spend section, and ``/api`` carries the same fold in base units."""
    import json

    from runjournal.producers.spend import RESERVE_TOOL, SETTLE_TOOL

    est = {"input_tokens": 1000, "output_tokens": 500, "cost_micros": 7500, "model_calls": 1}
    usage = {"input_tokens": 900, "output_tokens": 120, "cost_micros": 3450, "model_calls": 1}
    small = {"input_tokens": 10, "output_tokens": 10, "cost_micros": 8, "model_calls": 1}
    steps = [("r1", RESERVE_TOOL, {"reservation": "k1", "model": "big", "estimate": est, "user_id": None}),
             ("s1", SETTLE_TOOL, {"reservation": "k1", "model": "big", "estimate": est, "usage": usage}),
             ("r2", RESERVE_TOOL, {"reservation": "k2", "model": "small", "estimate": small, "user_id": None})]
    events = _events()[:1]
    for call_id, tool, result in steps:
        seq = len(events) + 1
        common = {"call_id": call_id, "tool": tool, "idempotency_key": f"key-{call_id}", "args_digest": "d"}
        events.append(Event(event_id=f"00000000-0000-4000-8000-{seq:012d}", run_id=RUN, tenant_id="t", seq=seq,
                            epoch=1, producer_id="agent-a", type=EventType.TOOL_CALL_INTENDED,
                            occurred_at=AT + timedelta(seconds=seq),
                            payload={**common, "side_effect": True, "attempt": 1, "timeout_ms": 5000}))
        events.append(Event(event_id=f"00000000-0000-4000-8000-{seq + 1:012d}", run_id=RUN, tenant_id="t",
                            seq=seq + 1, epoch=1, producer_id="agent-a", type=EventType.TOOL_CALL_COMMITTED,
                            occurred_at=AT + timedelta(seconds=seq + 1),
                            payload={**common, "result_json": json.dumps(result), "result_ref": None,
                                     "result_digest": "r"}))
    reads = Reads(events, projected=len(events))
    app = build_app(ConsoleConfig(Settings.load(topic_prefix="page", spend_currency="EUR")), data=reads)  # type: ignore[arg-type]
    client = TestClient(app)
    spend = _section(client.get(f"/runs/{path_segment(RUN)}").text, "spend")
    assert "0.003450 EUR" in spend and "0.000008 EUR" in spend  # settled; open (unknown spend)
    assert re.search(r'dim-model_calls"><td>model_calls</td><td>1</td><td class="warn">1</td><td>2</td>', spend)
    assert "spend-by-model" in spend and ">big<" in spend
    api = client.get(f"/api/runs/{path_segment(RUN)}").json()["spend"]
    assert api["settled"] == usage and api["open"] == small and api["reservations"] == 2
    assert api["by_model"] == {"big": usage}
    assert 'id="spend"' not in _get(Reads(_events(), projected=7))  # no spend records: no section

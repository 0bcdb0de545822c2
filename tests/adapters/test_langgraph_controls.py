"""Durable waits and operator controls from a LangGraph graph (issue 31), against the real broker and Redis.

A node waits for a signal with ``runs.wait_signal(config, name)`` — the payload is the human's answer — and the
journal records the wait once: a node re-run (time travel, a resumed run) gets the recorded payload without waiting.
A tool run by ``journaled_tool_node`` sees an operator's cancel through ``stop_requested()``; the run ends
RUN_CANCELLED and ``graph.invoke`` raises ``RunCancelledError``.
docs/design/decisions/0047-operator-controls.md, 0050-durable-waits.md.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from langchain_core.runnables import RunnableConfig  # noqa: E402

from runjournal.adapters.langgraph import JournalRuns  # noqa: E402
from runjournal.consumers.ops.control import Operator  # noqa: E402
from runjournal.consumers.recovery.job import RecoveryJob  # noqa: E402
from runjournal.core.settings import Settings  # noqa: E402
from runjournal.model.reducer import RunStatus, fold  # noqa: E402
from runjournal.producers import Journal, RunCancelledError, stop_requested  # noqa: E402
from runjournal.producers.errors import RunWaitingError  # noqa: E402
from runjournal.producers.waits import SIGNAL_TOOL, TIMER_TOOL, SignalInbox  # noqa: E402
from runjournal.schemas import Event, EventType  # noqa: E402
from tests.support.readback import events_of, read_committed  # noqa: E402

pytestmark = [pytest.mark.integration]

LEASE_MS = 1200  # heartbeats every 0.4 s: an operator's request is seen within half a second


class Review(TypedDict, total=False):
    """A graph state (module level: LangGraph resolves the annotations in this module's globals)."""

    draft: str
    answer: str
    published: str


@pytest.fixture
def operator(topics: Settings) -> Iterator[Operator]:
    with Operator(topics, wait_s=15, poll_s=0.1) as op:
        yield op


def _journal(topics: Settings, name: str, hold_after_s: float = 30.0) -> Journal:
    return Journal(topics, producer_id=f"{name}-{uuid.uuid4().hex[:6]}", lease_ttl_ms=LEASE_MS,
                   hold_after_s=hold_after_s)


def _events(topics: Settings, run_id: str) -> list[Event]:
    events = events_of(read_committed(topics), run_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    return events


def _steps(events: list[Event], tool: str) -> list[str]:
    """The types of the call events of ``tool`` (a built-in wait tool), in order."""
    return [e.type.value for e in events if e.type.value.startswith("TOOL_CALL_") and e.payload.get("tool") == tool]


def _review_graph(runs: JournalRuns, waiting: threading.Event | None = None, *, timeout_s: float | None = 20) -> Any:
    """draft → ask (waits for the reviewer's ``review`` signal) → publish."""
    from langgraph.graph import START, StateGraph

    def ask(state: Review, config: RunnableConfig) -> Review:
        if waiting is not None:
            waiting.set()
        decision = runs.wait_signal(config, "review", timeout_s=timeout_s, poll_s=0.05)
        return {"answer": decision["decision"]}

    graph = StateGraph(Review)
    graph.add_node("draft", lambda state: {"draft": "v1"})
    graph.add_node("ask", ask)
    graph.add_node("publish", lambda state: {"published": f"{state['draft']}:{state['answer']}"})
    graph.add_edge(START, "draft")
    graph.add_edge("draft", "ask")
    graph.add_edge("ask", "publish")
    return runs.compile(graph)


@pytest.mark.parametrize("when", ["while_waiting", "before_waiting"])
def test_a_node_waits_for_a_signal_and_a_rerun_gets_the_recorded_payload(topics: Settings, operator: Operator,
                                                                        when: str) -> None:
    run_id = f"lg-sig-{when}-{uuid.uuid4().hex[:6]}"
    config: RunnableConfig = {"configurable": {"thread_id": run_id}}
    waiting = threading.Event()
    sent: list[Any] = []
    with _journal(topics, "lg-sig") as journal:
        runs = JournalRuns(journal)
        app = _review_graph(runs, waiting)
        runs.handle(run_id)  # the run exists (RUN_STARTED) before anyone signals it
        if when == "before_waiting":
            sent.append(operator.signal(run_id, "review", {"decision": "ship"}, requested_by="alice"))
            deliverer = None
        else:
            def deliver() -> None:
                assert waiting.wait(15)
                time.sleep(0.3)  # the node is polling its inbox
                sent.append(operator.signal(run_id, "review", {"decision": "ship"}, requested_by="alice"))
            deliverer = threading.Thread(target=deliver)
            deliverer.start()
        started = time.monotonic()
        out = app.invoke({"draft": ""}, config)
        if deliverer is not None:
            deliverer.join(15)
            assert time.monotonic() - started >= 0.3  # it did wait for the signal
        assert sent[0].outcome == "delivered", sent
        assert out["published"] == "v1:ship"

        # The inbox is lost (erase, a Redis wipe): a re-run of the node still answers from the journal, at once.
        SignalInbox(operator.redis, topics.topic_prefix).forget(run_id)
        before_ask = next(s for s in app.get_state_history(config) if s.next == ("ask",))
        started = time.monotonic()
        again = app.invoke(None, before_ask.config)  # time travel: ask and publish run again
        assert again["published"] == "v1:ship" and time.monotonic() - started < 2.0
        runs.handle(run_id).succeed()
    events = _events(topics, run_id)
    assert _steps(events, SIGNAL_TOOL) == ["TOOL_CALL_INTENDED", "TOOL_CALL_COMMITTED"]  # recorded once
    assert _steps(events, TIMER_TOOL) == ["TOOL_CALL_INTENDED", "TOOL_CALL_COMMITTED"]  # the timeout: set once
    committed = next(e for e in events if e.type is EventType.TOOL_CALL_COMMITTED and e.payload["tool"] == SIGNAL_TOOL)
    assert committed.payload["result_json"] == '{"decision":"ship"}'
    state = fold((e, 0, i) for i, e in enumerate(events))
    assert state is not None and state.status is RunStatus.SUCCEEDED
    assert {p: (n.status.value, n.attempt) for p, n in state.nodes.items()} == {
        "draft": ("SUCCEEDED", 1), "ask": ("SUCCEEDED", 2), "publish": ("SUCCEEDED", 2)}


def test_a_long_wait_releases_the_run_and_the_signal_resumes_the_graph_elsewhere(topics: Settings,
                                                                                 operator: Operator) -> None:
    """Past ``hold_after_s`` the node's wait releases the run (``RunWaitingError`` out of ``invoke``; the node keeps
    no outcome); the recovery job holds it for nobody; the signal wakes it on another live instance, which attaches
    it and continues the graph from its checkpoint — the node passes its wait with the payload."""
    run_id = f"lg-held-{uuid.uuid4().hex[:6]}"
    config: RunnableConfig = {"configurable": {"thread_id": run_id}}
    first = _journal(topics, "lg-held-a", hold_after_s=0.3)
    try:
        with pytest.raises(RunWaitingError) as info:
            _review_graph(JournalRuns(first), timeout_s=None).invoke({"draft": ""}, config)
        assert info.value.signal == "review"
    finally:
        first.close()  # the process goes away: the run is held, not owned
    job = RecoveryJob(topics)
    try:
        deadline = time.monotonic() + 15
        while operator._fold(run_id).status is not RunStatus.PAUSED:  # noqa: SLF001 - the journal to its end
            assert time.monotonic() < deadline
            job.recover(stale=True)
            time.sleep(0.2)
    finally:
        job.close()
    assert operator._fold(run_id).waiting_for == "review"  # noqa: SLF001
    with _journal(topics, "lg-held-b") as journal:
        sent = operator.signal(run_id, "review", {"decision": "ship"}, requested_by="alice")
        assert sent.outcome == "delivered" and "woken" in (sent.detail or ""), sent
        runs = JournalRuns(journal)
        handle = journal.resume(journal.claim_assignment(5) or "")
        assert handle.run_id == run_id
        runs.attach(handle)
        out = _review_graph(runs, timeout_s=None).invoke(None, config)
        assert out["published"] == "v1:ship"
        handle.succeed()
    events = _events(topics, run_id)
    assert _steps(events, SIGNAL_TOOL) == ["TOOL_CALL_INTENDED", "TOOL_CALL_COMMITTED"]
    state = fold((e, 0, i) for i, e in enumerate(events))
    assert state is not None and state.status is RunStatus.SUCCEEDED
    assert state.nodes["draft"].attempt == 1 and state.nodes["ask"].attempt == 2  # resumed from the checkpoint


def test_a_node_sleep_is_not_slept_again_when_the_node_reruns(topics: Settings) -> None:
    """A node sleeps, then asks a human with ``interrupt()``; ``Command(resume=…)`` re-runs the node from its start:
    the sleep is over (its end time was recorded), one timer step."""
    from langgraph.graph import START, StateGraph
    from langgraph.types import Command, interrupt

    run_id = f"lg-sleep-{uuid.uuid4().hex[:6]}"
    config: RunnableConfig = {"configurable": {"thread_id": run_id}}
    with _journal(topics, "lg-sleep") as journal:
        runs = JournalRuns(journal)

        def cool_down(state: Review, config: RunnableConfig) -> Review:
            runs.sleep(config, 0.8)
            return {"answer": str(interrupt("publish now?"))}

        graph = StateGraph(Review)
        graph.add_node("cool_down", cool_down)
        graph.add_edge(START, "cool_down")
        app = runs.compile(graph)
        started = time.monotonic()
        assert "__interrupt__" in app.invoke({"draft": "v1"}, config)
        assert time.monotonic() - started >= 0.8
        started = time.monotonic()
        assert app.invoke(Command(resume="yes"), config)["answer"] == "yes"
        assert time.monotonic() - started < 0.6  # not slept again
        runs.handle(run_id).succeed()
    assert _steps(_events(topics, run_id), TIMER_TOOL) == ["TOOL_CALL_INTENDED", "TOOL_CALL_COMMITTED"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_cancel_stops_a_tool_in_the_tool_node_and_the_graph(topics: Settings, operator: Operator,
                                                             mode: str) -> None:
    """A long tool run by ``journaled_tool_node`` watches ``stop_requested()``; an operator cancels the run from
    another thread: the tool returns early (its result is recorded), the run ends RUN_CANCELLED with who and why,
    ``graph.invoke`` raises ``RunCancelledError`` from the tool node (the graph had nothing left to call that would
    stop it), and nothing follows the RUN_CANCELLED."""
    import asyncio

    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import tools_condition

    from runjournal.adapters.langgraph import journaled_tool_node
    from runjournal.producers.aio import AsyncJournal

    started, saw = threading.Event(), []

    @tool
    def crawl(site: str) -> str:
        """Crawl a site (long: stops early when the run is asked to stop)."""
        started.set()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and stop_requested() is None:
            time.sleep(0.05)
        saw.append(stop_requested())
        return f"partial crawl of {site}"

    call = AIMessage(content="", tool_calls=[{"name": "crawl", "id": "call-1", "args": {"site": "s1"}}])

    def build(runs: JournalRuns) -> Any:
        # the model would finish after the tool: no later call of the graph's stops it — the tool node does
        model = GenericFakeChatModel(messages=iter([call, AIMessage(content="done")]))
        graph = StateGraph(MessagesState)
        graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
        graph.add_node("tools", journaled_tool_node([crawl], runs, side_effects={"crawl": False}))
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", tools_condition)
        graph.add_edge("tools", "agent")
        return runs.compile(graph)

    run_id = f"lg-cancel-{mode}-{uuid.uuid4().hex[:6]}"
    config: RunnableConfig = {"configurable": {"thread_id": run_id}}
    results: list[Any] = []

    def cancel() -> None:
        assert started.wait(15)
        results.append(operator.cancel(run_id, reason="enough crawling", requested_by="ops@test"))

    asking = threading.Thread(target=cancel)
    asking.start()
    start = {"messages": [HumanMessage(content="crawl")]}

    async def main() -> None:
        async with await AsyncJournal.open(topics, producer_id=f"lg-cancel-aio-{uuid.uuid4().hex[:6]}",
                                           lease_ttl_ms=LEASE_MS) as journal:
            await build(JournalRuns(journal)).ainvoke(start, config)

    try:
        with pytest.raises(RunCancelledError) as info:
            if mode == "sync":
                with _journal(topics, "lg-cancel") as journal:
                    build(JournalRuns(journal)).invoke(start, config)
            else:
                asyncio.run(main())
    finally:
        asking.join(30)
    err = info.value
    assert err.requested_by == "ops@test" and err.reason == "enough crawling"
    assert results and results[0].outcome == "cancelled", results
    assert len(saw) == 1 and saw[0] is not None and saw[0].action == "cancel"
    events = _events(topics, run_id)
    assert events[-1].type is EventType.RUN_CANCELLED
    assert events[-1].payload["requested_by"] == "ops@test"
    intents = [e for e in events if e.type is EventType.TOOL_CALL_INTENDED]
    assert [e.payload["tool"] for e in intents] == ["crawl"]
    committed = [e for e in events if e.type is EventType.TOOL_CALL_COMMITTED]
    assert [e.payload["result_json"] for e in committed] == ['"partial crawl of s1"']
    state = fold((e, 0, i) for i, e in enumerate(events))
    assert state is not None and state.status is RunStatus.CANCELLED
    assert state.nodes["tools"].status.value == "RUNNING"  # stopped, no outcome

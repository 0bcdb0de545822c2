"""``JournalRuns.stream``: a LangGraph graph's stream modes appended to the thread's durable stream (decision 0055)
— the caller gets the graph's chunks unchanged, a reader of the run's stream gets them as JSON, with an end."""

from __future__ import annotations

import uuid
from typing import TypedDict

import pytest

from runjournal.adapters import JournalRuns
from runjournal.consumers.streams import read_stream
from runjournal.core.settings import Settings
from runjournal.producers import Journal

pytestmark = pytest.mark.integration


class Steps(TypedDict, total=False):
    text: str


def _graph() -> object:
    from langgraph.config import get_stream_writer
    from langgraph.graph import START, StateGraph

    def draft(state: Steps) -> Steps:
        writer = get_stream_writer()
        for token in ("Hel", "lo"):
            writer({"token": token})
        return {"text": "Hello"}

    def polish(state: Steps) -> Steps:
        return {"text": state["text"] + "!"}

    graph = StateGraph(Steps)
    graph.add_node("draft", draft)
    graph.add_node("polish", polish)
    graph.add_edge(START, "draft")
    graph.add_edge("draft", "polish")
    return graph.compile()


@pytest.mark.parametrize("mode", ["updates", "custom"])
def test_graph_stream_modes_reach_the_runs_stream(topics: Settings, mode: str) -> None:
    thread = f"lg-{uuid.uuid4().hex[:8]}"
    with Journal(topics, producer_id=f"lg-{uuid.uuid4().hex[:6]}") as journal:
        runs = JournalRuns(journal)
        got = list(runs.stream(_graph(), {"text": ""}, {"configurable": {"thread_id": thread}}, stream_mode=mode))
        runs.handle(thread).succeed()
        journal.streams.flush(10)
    expected = ([{"draft": {"text": "Hello"}}, {"polish": {"text": "Hello!"}}] if mode == "updates"
                else [{"token": "Hel"}, {"token": "lo"}])
    assert got == expected
    events = [e for _o, e in read_stream(topics, thread)]
    assert [e.data for e in events if e.kind == "chunk"] == expected
    assert events[-1].kind == "end" and events[-1].segment == f"langgraph.{mode}#1.1"

"""What makes the LangGraph checkpointer the journal's (beyond the conformance suite): the journal's records are
the authority (Redis is rebuilt from them), a fenced instance writes no checkpoint, a thread belongs to the
instance that owns its run."""

from __future__ import annotations

import pytest
import redis

pytest.importorskip("langgraph")

from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402

from runjournal.adapters._checkpoints import KINDS  # noqa: E402
from runjournal.adapters.langgraph import JournalCheckpointSaver, JournalRuns, ThreadNotOwnedError  # noqa: E402
from runjournal.core.settings import Settings  # noqa: E402
from runjournal.producers import Journal, ProducerFencedError, fence_producer  # noqa: E402

pytestmark = [pytest.mark.integration]


def _put(saver: JournalCheckpointSaver, thread: str, parent: dict | None, step: int, text: str) -> dict:
    cp = empty_checkpoint()
    cp["channel_values"] = {"messages": [text], "step": step}
    cp["channel_versions"] = {"messages": step + 1, "step": step + 1}
    config = parent or {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    return saver.put(config, cp, {"source": "loop", "step": step, "parents": {}}, {"messages": step + 1,
                                                                                    "step": step + 1})


def test_the_projection_is_rebuilt_from_the_journal(topics: Settings) -> None:
    with Journal(topics, producer_id="lg-a") as journal:
        runs = JournalRuns(journal)
        saver = JournalCheckpointSaver(runs)
        first = _put(saver, "thread-1", None, 0, "hello")
        second = _put(saver, "thread-1", first, 1, "world")
        saver.put_writes(second, [("messages", "pending"), ("__error__", "boom")], "task-1", "path")
        before = saver.get_tuple({"configurable": {"thread_id": "thread-1", "checkpoint_ns": ""}})
        r = redis.Redis.from_url(topics.redis_url)
        r.delete(*(runs.store.key("thread-1", k) for k in KINDS))  # Redis lost the thread
        assert saver.get_tuple({"configurable": {"thread_id": "thread-1"}}) is None
        assert runs.store.rebuild("thread-1") == 8  # 2 checkpoints, 2 blobs each, 2 pending writes
        after = saver.get_tuple({"configurable": {"thread_id": "thread-1", "checkpoint_ns": ""}})
    assert after == before and after.checkpoint["channel_values"] == {"messages": ["world"], "step": 1}
    assert [(w[1], w[2]) for w in after.pending_writes] == [("__error__", "boom"), ("messages", "pending")]


def test_a_fenced_instance_writes_no_checkpoint(topics: Settings) -> None:
    with Journal(topics, producer_id="lg-zombie") as journal:
        saver = JournalCheckpointSaver(JournalRuns(journal))
        first = _put(saver, "thread-z", None, 0, "before")
        fence_producer(topics, journal.producer_id)  # the recovery job's fence
        with pytest.raises(ProducerFencedError):
            _put(saver, "thread-z", first, 1, "after the fence")
        latest = saver.get_tuple({"configurable": {"thread_id": "thread-z", "checkpoint_ns": ""}})
        assert latest.checkpoint["channel_values"]["messages"] == ["before"]
    with Journal(topics, producer_id="lg-fresh") as fresh:
        runs = JournalRuns(fresh)
        assert runs.store.rebuild("thread-z") == 3  # the fenced write never reached the topic
        with pytest.raises(ThreadNotOwnedError):  # the thread's run is the zombie's until recovery hands it over
            JournalCheckpointSaver(runs).put({"configurable": {"thread_id": "thread-z", "checkpoint_ns": ""}},
                                             empty_checkpoint(), {}, {})


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_model_turn_with_parallel_tool_calls_journals_each_once(topics: Settings, mode: str) -> None:
    """Issue 27 case 2: one model turn asks for three ``send_email`` calls; ToolNode runs them at once (a thread
    pool, or tasks). Every event of the run gets its own seq, three intents and three commits, the run never
    parks, and each email is sent once under its own key."""
    import asyncio

    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import tools_condition

    from runjournal.adapters import current_idempotency_key, journaled_tool_node
    from runjournal.model.reducer import RunStatus, fold
    from runjournal.producers.aio import AsyncJournal
    from runjournal.schemas import EventType
    from tests.support.readback import events_of, read_committed

    sent: list[str] = []

    @tool
    def send_email(to: str, subject: str) -> str:
        """Send an email."""
        sent.append(current_idempotency_key() or "")
        return f"sent {subject} to {to}"

    calls = [{"name": "send_email", "id": f"call-{i}", "args": {"to": f"u{i}@example.com", "subject": "s"}}
             for i in range(3)]

    def build(runs: JournalRuns) -> object:
        model = GenericFakeChatModel(messages=iter([AIMessage(content="", tool_calls=calls),
                                                    AIMessage(content="done")]))
        graph = StateGraph(MessagesState)
        graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
        graph.add_node("tools", journaled_tool_node([send_email], runs))
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", tools_condition)
        graph.add_edge("tools", "agent")
        return graph.compile(checkpointer=JournalCheckpointSaver(runs))

    run_id = f"lg-par-{mode}"
    config = {"configurable": {"thread_id": run_id}}
    if mode == "sync":
        with Journal(topics, producer_id="lg-par") as journal:
            runs = JournalRuns(journal)
            build(runs).invoke({"messages": [HumanMessage(content="email three")]}, config)  # type: ignore[attr-defined]
            runs.handle(run_id).succeed()
    else:
        async def main() -> None:
            async with await AsyncJournal.open(topics, producer_id="lg-par-aio") as journal:
                runs = JournalRuns(journal)
                await build(runs).ainvoke({"messages": [HumanMessage(content="email three")]}, config)  # type: ignore[attr-defined]
                await runs.async_handle(run_id).succeed()
        asyncio.run(main())
    events = events_of(read_committed(topics), run_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    types = [e.type for e in events]
    assert types.count(EventType.TOOL_CALL_INTENDED) == 3 and types.count(EventType.TOOL_CALL_COMMITTED) == 3
    state = fold((e, 0, i) for i, e in enumerate(events))
    assert state is not None and state.status is RunStatus.SUCCEEDED
    assert len(sent) == 3 and len(set(sent)) == 3

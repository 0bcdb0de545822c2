"""What makes the LangGraph checkpointer the journal's (beyond the conformance suite): the journal's records are
the authority (Redis is rebuilt from them), a fenced instance writes no checkpoint, a thread belongs to the
instance that owns its run."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest
import redis

pytest.importorskip("langgraph")

from langchain_core.runnables import RunnableConfig  # noqa: E402
from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402
from langgraph.graph.message import add_messages  # noqa: E402

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


# -- the graph's nodes in the run's state (issue 35) --------------------------------------------------------------
class Notes(TypedDict, total=False):
    """A graph state (module level: LangGraph resolves the annotations in this module's globals)."""

    messages: Annotated[list[Any], add_messages]
    notes: Annotated[list[str], operator.add]


class Answer(TypedDict):
    answer: str


class Count(TypedDict):
    n: int


def _nodes(topics: Settings, run_id: str) -> dict[str, tuple[str, int]]:
    """The run's projected nodes (a fold of its events on the topic): path -> (status, attempt)."""
    from runjournal.model.reducer import fold
    from tests.support.readback import events_of, read_committed

    events = events_of(read_committed(topics), run_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))  # node events took seqs like any other
    state = fold((e, 0, i) for i, e in enumerate(events))
    assert state is not None
    return {path: (node.status.value, node.attempt) for path, node in state.nodes.items()}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_runs_state_lists_every_graph_node_with_its_status(topics: Settings, mode: str) -> None:
    """A graph compiled with ``runs.compile``: the model node twice (a loop), the journaled tool node, parallel
    branches, a subgraph's node (``right/inner``) and the tasks ``Send`` fans out (``worker#1`` …) each appear in the
    run's state with status and attempt. The keys of calls are those the code derived without the node journal: the
    tool node's by ``tool_call_id``, a node's own ``runs.call`` by its graph task (``report:<task id>``, call 1)."""
    import asyncio

    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool
    from langgraph.graph import END, START, StateGraph
    from langgraph.prebuilt import tools_condition
    from langgraph.types import Send

    from runjournal.adapters import JournaledTool, journaled_tool_node
    from runjournal.producers import idempotency_key
    from runjournal.producers.aio import AsyncJournal
    from runjournal.schemas import EventType
    from tests.support.readback import events_of, read_committed

    @tool
    def send_email(to: str) -> str:
        """Send an email."""
        return f"sent to {to}"

    run_id = f"lg-nodes-{mode}"
    lookup = JournaledTool(lambda q: {"rows": 3}, name="lookup", side_effect=False)

    tasks: list[str] = []

    def report(runs: JournalRuns) -> Any:
        if mode == "sync":
            def node(state: Notes, config: RunnableConfig) -> Notes:
                tasks.append(config["configurable"]["checkpoint_ns"])
                return {"notes": [str(runs.call(config, lookup, {"q": "x"}))]}
            return node

        async def anode(state: Notes, config: RunnableConfig) -> Notes:
            tasks.append(config["configurable"]["checkpoint_ns"])
            return {"notes": [str(await runs.acall(config, lookup, {"q": "x"}))]}
        return anode

    def build(runs: JournalRuns) -> Any:
        model = GenericFakeChatModel(messages=iter([
            AIMessage(content="", tool_calls=[{"name": "send_email", "id": "call-1", "args": {"to": "bob"}}]),
            AIMessage(content="done")]))
        inner = StateGraph(Notes)
        inner.add_node("inner", lambda state: {"notes": ["inner"]})
        inner.add_edge(START, "inner")
        graph = StateGraph(Notes)
        graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
        graph.add_node("tools", journaled_tool_node([send_email], runs))
        # a node calling the journal itself (outside any RunHandle.node): keyed by its graph task
        graph.add_node("report", report(runs))
        graph.add_node("left", lambda state: {"notes": ["left"]})
        graph.add_node("right", inner.compile())
        graph.add_node("worker", lambda item: {"notes": [f"w{item['i']}"]})
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: "report"})
        graph.add_edge("tools", "agent")
        graph.add_edge("report", "left")
        graph.add_edge("report", "right")
        graph.add_conditional_edges("left", lambda state: [Send("worker", {"i": i}) for i in range(3)], ["worker"])
        graph.add_edge("worker", END)
        graph.add_edge("right", END)
        return runs.compile(graph)

    config = {"configurable": {"thread_id": run_id}}
    start = {"messages": [HumanMessage(content="email bob")], "notes": []}
    if mode == "sync":
        with Journal(topics, producer_id="lg-nodes") as journal:
            runs = JournalRuns(journal)
            build(runs).invoke(start, config)
            runs.handle(run_id).succeed()
    else:
        async def main() -> None:
            async with await AsyncJournal.open(topics, producer_id="lg-nodes-aio") as journal:
                runs = JournalRuns(journal)
                await build(runs).ainvoke(start, config)
                await runs.async_handle(run_id).succeed()
        asyncio.run(main())
    done = ("SUCCEEDED", 1)
    assert _nodes(topics, run_id) == {"agent": ("SUCCEEDED", 2), "tools": done, "report": done, "left": done,
                                      "right": done, "right/inner": done, "worker#1": done, "worker#2": done,
                                      "worker#3": done}
    events = events_of(read_committed(topics), run_id)
    keys = {e.payload["tool"]: e.payload["idempotency_key"] for e in events if e.type is EventType.TOOL_CALL_INTENDED}
    (task,) = tasks
    assert keys == {"send_email": idempotency_key(run_id, "#call-1", 1),
                    "lookup": idempotency_key(run_id, f"#runjournal.call:{task}#1", 1)}
    started = [e for e in events if e.type is EventType.NODE_STARTED]
    assert all(e.node_id == e.payload["node_path"] for e in started)
    assert [e.payload["node_path"] for e in started][:3] == ["agent", "tools", "agent"]


def test_a_failing_node_is_failed_and_an_interrupted_one_runs_until_resumed(topics: Settings) -> None:
    """A node that raises is NODE_FAILED with its error (the graph's error is the node's own); a node paused by
    ``interrupt()`` stays RUNNING, and the graph resumed with ``Command(resume=…)`` runs it again as attempt 2."""
    from langgraph.graph import START, StateGraph
    from langgraph.types import Command, interrupt

    def boom(state: Answer) -> Answer:
        raise ValueError("the model answered nonsense")

    def ask(state: Answer) -> Answer:
        return {"answer": str(interrupt("approve?"))}

    failing = StateGraph(Answer)
    failing.add_node("ok", lambda state: {"answer": "fine"})
    failing.add_node("boom", boom)
    failing.add_edge(START, "ok")
    failing.add_edge("ok", "boom")
    asking = StateGraph(Answer)
    asking.add_node("ask", ask)
    asking.add_edge(START, "ask")
    with Journal(topics, producer_id="lg-fail") as journal:
        runs = JournalRuns(journal)
        with pytest.raises(ValueError, match="nonsense"):
            runs.compile(failing).invoke({"answer": ""}, {"configurable": {"thread_id": "lg-fail"}})
        runs.handle("lg-fail").fail("the graph raised")
        app, config = runs.compile(asking), {"configurable": {"thread_id": "lg-ask"}}
        paused = app.invoke({"answer": ""}, config)
        assert "__interrupt__" in paused
        journal.flush()
        assert _nodes(topics, "lg-ask") == {"ask": ("RUNNING", 1)}
        assert app.invoke(Command(resume="yes"), config)["answer"] == "yes"
        runs.handle("lg-ask").succeed()
    assert _nodes(topics, "lg-fail") == {"ok": ("SUCCEEDED", 1), "boom": ("FAILED", 1)}
    assert _nodes(topics, "lg-ask") == {"ask": ("SUCCEEDED", 2)}


def test_a_graph_without_the_node_journal_is_named_once(topics: Settings, caplog: pytest.LogCaptureFixture) -> None:
    """Compiled with the checkpointer alone, the graph runs as before, its nodes unjournaled — and the registry warns
    once how to journal them."""
    from langgraph.graph import START, StateGraph

    graph = StateGraph(Count)
    graph.add_node("a", lambda state: {"n": 1})
    graph.add_node("b", lambda state: {"n": 2})
    graph.add_edge(START, "a")
    graph.add_edge("a", "b")
    with caplog.at_level("WARNING", logger="runjournal.adapters.langgraph"), \
            Journal(topics, producer_id="lg-bare") as journal:
        runs = JournalRuns(journal)
        app = graph.compile(checkpointer=JournalCheckpointSaver(runs))
        for thread in ("lg-bare-1", "lg-bare-2"):
            app.invoke({"n": 0}, {"configurable": {"thread_id": thread}})
            runs.handle(thread).succeed()
    warned = [r.getMessage() for r in caplog.records if "node journal" in r.getMessage()]
    assert len(warned) == 1 and "runs.compile(graph)" in warned[0]
    assert _nodes(topics, "lg-bare-1") == {}


def test_a_thread_state_past_one_kafka_record_is_written_in_parts_and_rebuilt(topics: Settings) -> None:
    """Issue 29: a checkpoint blob of 3 MB — three times the broker's default record limit — is written as parts in
    the journal's transaction and rebuilt from them after Redis lost the thread; delete_thread tombstones every
    part too."""
    from runjournal.consumers.runtime.partitions import range_consumer, read_ranges
    from runjournal.core.checkpoint_records import PART, of_thread
    from runjournal.schemas.keys import partition_for

    big = "x" * 3_000_000
    config = {"configurable": {"thread_id": "thread-big", "checkpoint_ns": ""}}
    with Journal(topics, producer_id="lg-big") as journal:
        runs = JournalRuns(journal)
        saver = JournalCheckpointSaver(runs)
        first = _put(saver, "thread-big", None, 0, big)
        _put(saver, "thread-big", first, 1, "small")
        before = saver.get_tuple({"configurable": {"thread_id": "thread-big", "checkpoint_ns": "",
                                                   "checkpoint_id": first["configurable"]["checkpoint_id"]}})
        assert before.checkpoint["channel_values"]["messages"] == [big]
        counts = runs.store.entries("thread-big", PART)
        (n,) = (int(c) for c in counts.values())  # the 3 MB blob (serialised: more) in parts of 512 KiB
        assert n >= 6, counts
        r = redis.Redis.from_url(topics.redis_url)
        r.delete(*(runs.store.key("thread-big", k) for k in KINDS))
        assert runs.store.rebuild("thread-big") == 6  # 2 checkpoints, 2 blobs each; the parts count as one
        after = saver.get_tuple({"configurable": {"thread_id": "thread-big", "checkpoint_ns": "",
                                                  "checkpoint_id": first["configurable"]["checkpoint_id"]}})
        assert after == before and runs.store.entries("thread-big", PART) == counts
        assert saver.get_tuple(config).checkpoint["channel_values"]["messages"] == ["small"]
        saver.delete_thread("thread-big")
        journal.flush()

    latest: dict[bytes, bytes | None] = {}
    partition = partition_for("thread-big", topics.partitions)
    consumer = range_consumer(topics, "test-parts")
    try:
        from confluent_kafka import TopicPartition

        low, high = consumer.get_watermark_offsets(TopicPartition(topics.checkpoints_topic, partition), timeout=10)
        assert not read_ranges(consumer, topics.checkpoints_topic, {partition: (low, high)},
                               lambda m: latest.__setitem__(m.key(), m.value()) if of_thread(m.key(), "thread-big")
                               else None, timeout_s=30)
    finally:
        consumer.close()
    parts = [k for k in latest if k.startswith(f"thread-big\x1f{PART}\x1f".encode())]
    assert len(parts) == n and all(latest[k] is None for k in latest), "every record and part tombstoned"


def test_a_large_record_missing_a_part_is_a_named_error() -> None:
    import hashlib
    import json

    from runjournal.adapters._checkpoints import RecordPartsError, _reassemble
    from runjournal.core.checkpoint_records import PART, part_field, record_key

    value = json.dumps({"kind": "blob", "field": "f", "data": "abcdef"}).encode()
    head = {record_key("t", "blob", "f"): json.dumps({"kind": "blob", "field": "f", "parts": 2, "bytes": len(value),
                                                      "sha256": hashlib.sha256(value).hexdigest()}).encode()}
    one = {record_key("t", PART, part_field(0, "blob", "f")): value[:20]}
    two = {record_key("t", PART, part_field(1, "blob", "f")): value[20:]}
    whole = {k.encode(): v for k, v in {**head, **one, **two}.items()}
    assert [(r.kind, r.data) for r in _reassemble("t", whole)] == [(PART, "2"), ("blob", "abcdef")]
    with pytest.raises(RecordPartsError, match=r"missing \[1\]"):
        _reassemble("t", {k.encode(): v for k, v in {**head, **one}.items()})
    with pytest.raises(RecordPartsError, match="length or sha256"):
        bad = {next(iter(two)): b"X" * len(value[20:])}
        _reassemble("t", {k.encode(): v for k, v in {**head, **one, **bad}.items()})

"""Calls a LangGraph node makes itself (``runs.call(config, tool, args)`` / ``await runs.acall(...)``), against the
real broker and Redis; the Redis ledger of ``tests.support.ledger`` is the provider-side witness, by key.

A node's own call is keyed by its graph task (the task's checkpoint namespace, which LangGraph keeps when it executes
the task again from its checkpoint) and its number among the task's calls. The handle's own key — the order of the
call among the run's top-level calls — is not safe in a checkpointed graph: a graph resumed from its checkpoint does
not execute again the nodes that finished before it, so the resumed handle counts from 0 and a later node's first call
gets the key of an earlier node's recorded call (``test_the_handles_own_key_...`` pins that limitation down).
"""

from __future__ import annotations

import asyncio
import operator
import uuid
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest
import redis

pytest.importorskip("langgraph")

from langchain_core.runnables import RunnableConfig  # noqa: E402

from runjournal.adapters.langgraph import JournalRuns  # noqa: E402
from runjournal.consumers.recovery.job import RecoveryJob  # noqa: E402
from runjournal.core.settings import Settings  # noqa: E402
from runjournal.model.reducer import RunStatus, fold  # noqa: E402
from runjournal.producers import Journal  # noqa: E402
from runjournal.producers.aio import AsyncJournal  # noqa: E402
from runjournal.schemas import Event, EventType  # noqa: E402
from tests.support.ledger import Ledger, LedgerTool  # noqa: E402
from tests.support.readback import events_of, read_committed  # noqa: E402

pytestmark = [pytest.mark.integration]

SEAT = {"logical": "book", "seat": "12A"}  # every call books the same seat: same tool, same args


class Trip(TypedDict, total=False):
    """A graph state (module level: LangGraph resolves the annotations in this module's globals)."""

    booked: Annotated[list[str], operator.add]


class Crash(RuntimeError):
    """The process 'dies' here: the graph stops, the instance closes without ending the run."""


class Booking(LedgerTool):
    """A side-effecting tool on the Redis ledger answering with the key it ran under (so a node's answer shows which
    call answered it)."""

    def answer(self, idempotency_key: str) -> Any:
        return f"booked under {idempotency_key}"  # per call: concurrent calls share this tool


@pytest.fixture
def ledger(topics: Settings) -> Ledger:
    return Ledger(redis.Redis.from_url(topics.redis_url), f"lgnc{uuid.uuid4().hex[:8]}")


def _hand_over(topics: Settings, run_id: str, taker: str) -> None:
    """The first instance went away with the run open: the recovery job hands it to ``taker``."""
    job = RecoveryJob(topics, max_wait_s=30)
    try:
        report = job.recover(runs=[run_id], force=True, assign_to=taker)
    finally:
        job.close()
    assert report.runs[0].action == "resumed", report.runs[0]


def _events(topics: Settings, run_id: str) -> list[Event]:
    events = events_of(read_committed(topics), run_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    return events


def _intents(events: list[Event]) -> list[str]:
    return [e.payload["idempotency_key"] for e in events if e.type is EventType.TOOL_CALL_INTENDED]


def _nodes(events: list[Event]) -> dict[str, tuple[str, int]]:
    state = fold((e, 0, i) for i, e in enumerate(events))
    assert state is not None and state.status is RunStatus.SUCCEEDED
    return {path: (node.status.value, node.attempt) for path, node in state.nodes.items()}


def _two_nodes(runs: JournalRuns, book: Booking, crash: set[str], how: str) -> Any:
    """first → second, each booking the same seat; a node named in ``crash`` raises before its call (once)."""
    from langgraph.graph import START, StateGraph

    def node(name: str) -> Callable[..., Any]:
        def sync_node(state: Trip, config: RunnableConfig) -> Trip:
            if name in crash:
                crash.discard(name)
                raise Crash(f"the process died before {name} booked")
            if how == "handle":  # the unsafe way: the handle's own key (order among the run's top-level calls)
                return {"booked": [runs.handle(config["configurable"]["thread_id"]).call(book, dict(SEAT))]}
            return {"booked": [runs.call(config, book, dict(SEAT))]}

        async def async_node(state: Trip, config: RunnableConfig) -> Trip:
            if name in crash:
                crash.discard(name)
                raise Crash(f"the process died before {name} booked")
            return {"booked": [await runs.acall(config, book, dict(SEAT))]}

        return async_node if how == "async" else sync_node

    graph = StateGraph(Trip)
    graph.add_node("first", node("first"))
    graph.add_node("second", node("second"))
    graph.add_edge(START, "first")
    graph.add_edge("first", "second")
    return runs.compile(graph)


def _crash_after_first_and_resume(topics: Settings, ledger: Ledger, run_id: str, how: str) -> list[str]:
    """Instance A runs the graph until ``second`` 'crashes' (``first`` done and checkpointed) and goes away with the
    run open; instance B resumes the run, attaches it and continues the graph from its checkpoint. The graph's
    answers."""
    config: RunnableConfig = {"configurable": {"thread_id": run_id}}
    book = Booking(ledger)
    if how == "async":
        async def main() -> list[str]:
            first = await AsyncJournal.open(topics, producer_id=f"lgnc-a-{uuid.uuid4().hex[:6]}")
            try:
                with pytest.raises(Crash):
                    await _two_nodes(JournalRuns(first), book, {"second"}, how).ainvoke({"booked": []}, config)
            finally:
                await first.close()
            async with await AsyncJournal.open(topics, producer_id=f"lgnc-b-{uuid.uuid4().hex[:6]}") as taker:
                await asyncio.to_thread(_hand_over, topics, run_id, taker.sync.producer_id)
                assert await taker.claim_assignment(10) == run_id
                runs = JournalRuns(taker)
                handle = await taker.resume(run_id)
                runs.attach(handle)
                out = await _two_nodes(runs, book, set(), how).ainvoke(None, config)
                await handle.succeed()
            return list(out["booked"])
        return asyncio.run(main())
    with Journal(topics, producer_id=f"lgnc-a-{uuid.uuid4().hex[:6]}") as first:
        with pytest.raises(Crash):
            _two_nodes(JournalRuns(first), book, {"second"}, how).invoke({"booked": []}, config)
    with Journal(topics, producer_id=f"lgnc-b-{uuid.uuid4().hex[:6]}") as taker:
        _hand_over(topics, run_id, taker.producer_id)
        assert taker.claim_assignment(timeout_s=10) == run_id
        runs = JournalRuns(taker)
        handle = taker.resume(run_id)
        runs.attach(handle)
        out = _two_nodes(runs, book, set(), how).invoke(None, config)
        handle.succeed()
    return list(out["booked"])


@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_later_nodes_call_on_a_resumed_graph_runs_under_its_own_key(topics: Settings, ledger: Ledger,
                                                                     how: str) -> None:
    """The failing-first case: two nodes book the same seat (same tool, same args) through ``runs.call``; the process
    dies after ``first`` was checkpointed. On the resumed run the graph continues from its checkpoint (``first`` is
    not executed again): ``second``'s booking runs — once, under its own key — and ``first``'s ran once."""
    run_id = f"lgnc-two-{how}-{uuid.uuid4().hex[:6]}"
    booked = _crash_after_first_and_resume(topics, ledger, run_id, how)
    executed = ledger.executed_keys()
    assert len(executed) == 2 and set(executed.values()) == {1}, executed  # each node's booking ran exactly once
    assert booked == [f"booked under {key}" for key in _intents(_events(topics, run_id))]
    assert booked[0] != booked[1]  # the second node was not answered from the first one's record
    events = _events(topics, run_id)
    intents = [e for e in events if e.type is EventType.TOOL_CALL_INTENDED]
    assert [e.epoch for e in intents] == [1, 2]  # first before the crash, second on the resumed run
    assert _nodes(events) == {"first": ("SUCCEEDED", 1), "second": ("SUCCEEDED", 2)}


def test_the_handles_own_key_answers_a_later_node_from_an_earlier_record(topics: Settings, ledger: Ledger) -> None:
    """The documented limitation ``runs.call`` exists for: the same graph with ``runs.handle(thread_id).call(...)``
    (no ``step``). The resumed handle counts the run's top-level calls from 0, so ``second``'s booking gets the key
    of ``first``'s recorded one and is answered with its result: the provider never sees it — a dropped effect."""
    run_id = f"lgnc-handle-{uuid.uuid4().hex[:6]}"
    booked = _crash_after_first_and_resume(topics, ledger, run_id, "handle")
    assert ledger.executions() == 1  # second's booking never ran
    assert booked[0] == booked[1]  # second got first's answer
    assert len(_intents(_events(topics, run_id))) == 1


def test_a_node_reexecuted_after_a_crash_inside_it_gets_its_calls_from_the_record(topics: Settings,
                                                                                  ledger: Ledger) -> None:
    """A node books two seats-worth (the same call twice: two bookings) and the process dies between them. The
    resumed graph executes the node again from its start: its first call is answered from the record (not run
    again), its second one runs — each booking once."""
    from langgraph.graph import START, StateGraph

    run_id = f"lgnc-inside-{uuid.uuid4().hex[:6]}"
    config: RunnableConfig = {"configurable": {"thread_id": run_id}}
    book = Booking(ledger)

    def build(runs: JournalRuns, crash: bool) -> Any:
        def pair(state: Trip, config: RunnableConfig) -> Trip:
            one = runs.call(config, book, dict(SEAT))
            if crash:
                raise Crash("the process died between the two bookings")
            return {"booked": [one, runs.call(config, book, dict(SEAT))]}

        graph = StateGraph(Trip)
        graph.add_node("pair", pair)
        graph.add_edge(START, "pair")
        return runs.compile(graph)

    with Journal(topics, producer_id=f"lgnc-a-{uuid.uuid4().hex[:6]}") as first:
        with pytest.raises(Crash):
            build(JournalRuns(first), True).invoke({"booked": []}, config)
    assert ledger.executions() == 1
    with Journal(topics, producer_id=f"lgnc-b-{uuid.uuid4().hex[:6]}") as taker:
        _hand_over(topics, run_id, taker.producer_id)
        assert taker.claim_assignment(timeout_s=10) == run_id
        runs = JournalRuns(taker)
        handle = taker.resume(run_id)
        runs.attach(handle)
        booked = build(runs, False).invoke(None, config)["booked"]
        handle.succeed()
    executed = ledger.executed_keys()
    assert len(executed) == 2 and set(executed.values()) == {1}, executed
    events = _events(topics, run_id)
    keys = _intents(events)
    assert booked == [f"booked under {key}" for key in keys]
    assert [e.epoch for e in events if e.type is EventType.TOOL_CALL_INTENDED] == [1, 2]
    assert _nodes(events) == {"pair": ("SUCCEEDED", 2)}


def test_a_loop_visiting_a_node_twice_makes_two_calls(topics: Settings, ledger: Ledger) -> None:
    """A loop's two visits of a node are two graph tasks: two bookings, two keys, each run once."""
    from langgraph.graph import END, START, StateGraph

    run_id = f"lgnc-loop-{uuid.uuid4().hex[:6]}"
    config: RunnableConfig = {"configurable": {"thread_id": run_id}}
    book = Booking(ledger)
    with Journal(topics, producer_id=f"lgnc-loop-{uuid.uuid4().hex[:6]}") as journal:
        runs = JournalRuns(journal)
        graph = StateGraph(Trip)
        graph.add_node("book", lambda state, config: {"booked": [runs.call(config, book, dict(SEAT))]})
        graph.add_edge(START, "book")
        graph.add_conditional_edges("book", lambda state: "book" if len(state["booked"]) < 2 else END)
        booked = runs.compile(graph).invoke({"booked": []}, config)["booked"]
        runs.handle(run_id).succeed()
    executed = ledger.executed_keys()
    assert len(executed) == 2 and set(executed.values()) == {1}, executed
    events = _events(topics, run_id)
    assert booked == [f"booked under {key}" for key in _intents(events)]
    assert _nodes(events) == {"book": ("SUCCEEDED", 2)}


def test_a_call_made_again_after_it_raised_is_its_next_attempt(topics: Settings, ledger: Ledger) -> None:
    """The booking went through but its answer was lost (a timeout after the request): the node catches the error and
    calls again — the same call's next attempt under the same key, reconciled by it (not booked twice); a third call
    after it answered is a new booking."""
    from langgraph.graph import START, StateGraph

    from runjournal.producers import OutcomeUnknownError

    run_id = f"lgnc-again-{uuid.uuid4().hex[:6]}"
    config: RunnableConfig = {"configurable": {"thread_id": run_id}}
    lost = Booking(ledger, then="timeout_after")
    seen: list[str] = []

    with Journal(topics, producer_id=f"lgnc-again-{uuid.uuid4().hex[:6]}") as journal:
        runs = JournalRuns(journal)

        def book_twice(state: Trip, config: RunnableConfig) -> Trip:
            with pytest.raises(OutcomeUnknownError):
                runs.call(config, lost, dict(SEAT))
            seen.append("unknown")
            again = runs.call(config, lost, dict(SEAT))  # reconciled: the ledger has the key
            lost.then = "return"
            return {"booked": [again, runs.call(config, lost, dict(SEAT))]}

        graph = StateGraph(Trip)
        graph.add_node("book", book_twice)
        graph.add_edge(START, "book")
        booked = runs.compile(graph).invoke({"booked": []}, config)["booked"]
        runs.handle(run_id).succeed()
    assert seen == ["unknown"]
    executed = ledger.executed_keys()
    assert len(executed) == 2 and set(executed.values()) == {1}, executed
    events = _events(topics, run_id)
    assert booked == [f"booked under {key}" for key in _intents(events)]
    reconciled = [e for e in events if e.type is EventType.TOOL_CALL_RECONCILED]
    assert [e.payload["outcome"] for e in reconciled] == ["COMMITTED"]


def test_calls_made_at_once_in_one_node_count_apart(topics: Settings, ledger: Ledger) -> None:
    """Two of everything: a node's first two calls gathered at once (each coroutine in its own copy of the node's
    context) and two more from threads the node starts with its config — four bookings of the same seat, four keys,
    each run once, none answered with another's record. The count is the node execution's (its callback run id),
    shared under the registry's lock, not a context's."""
    from concurrent.futures import ThreadPoolExecutor

    from langgraph.graph import START, StateGraph

    run_id = f"lgnc-once-{uuid.uuid4().hex[:6]}"
    config: RunnableConfig = {"configurable": {"thread_id": run_id}}
    book = Booking(ledger)

    async def main() -> list[str]:
        async with await AsyncJournal.open(topics, producer_id=f"lgnc-once-{uuid.uuid4().hex[:6]}") as journal:
            runs = JournalRuns(journal)

            async def gathered(state: Trip, config: RunnableConfig) -> Trip:
                both = await asyncio.gather(runs.acall(config, book, dict(SEAT)), runs.acall(config, book, dict(SEAT)))
                return {"booked": list(both)}

            def threaded(state: Trip, config: RunnableConfig) -> Trip:
                with ThreadPoolExecutor(2) as pool:
                    both = list(pool.map(lambda _: runs.call(config, book, dict(SEAT)), range(2)))
                return {"booked": both}

            graph = StateGraph(Trip)
            graph.add_node("gathered", gathered)
            graph.add_node("threaded", threaded)
            graph.add_edge(START, "gathered")
            graph.add_edge("gathered", "threaded")
            out = await runs.compile(graph).ainvoke({"booked": []}, config)
            await runs.async_handle(run_id).succeed()
            return list(out["booked"])

    booked = asyncio.run(main())
    executed = ledger.executed_keys()
    assert len(executed) == 4 and set(executed.values()) == {1}, executed
    assert len(set(booked)) == 4, booked  # four answers, each its own booking
    assert sorted(_intents(_events(topics, run_id))) == sorted(executed)


def test_a_config_naming_a_task_that_is_not_a_nodes_own_is_refused(topics: Settings, ledger: Ledger) -> None:
    """A hand-built config with a checkpoint namespace but no node execution to count in: a named error before
    anything is published, naming step=; with step= it is an ordinary call."""
    from runjournal.adapters.langgraph import TaskStepError

    run_id = f"lgnc-bare-{uuid.uuid4().hex[:6]}"
    bare: RunnableConfig = {"configurable": {"thread_id": run_id, "checkpoint_ns": "book:1234"}}
    with Journal(topics, producer_id=f"lgnc-bare-{uuid.uuid4().hex[:6]}") as journal:
        runs = JournalRuns(journal)
        with pytest.raises(TaskStepError, match="step="):
            runs.call(bare, Booking(ledger), dict(SEAT))
        assert runs.call(bare, Booking(ledger), dict(SEAT), step="seat-12a").startswith("booked under")
        runs.handle(run_id).succeed()
    assert len(ledger.executed_keys()) == 1

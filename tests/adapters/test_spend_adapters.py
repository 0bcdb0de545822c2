"""Spend from the frameworks' reports (issue 32): LangGraph's ``GraphSpendJournal`` and the Agents SDK's
``JournalRunHooks`` reserve before every model call and settle with the usage the framework reports, on the real
broker and Redis. The models are the frameworks' own test models (LangChain's ``GenericFakeChatModel``, the Agents
SDK's ``ScriptedModel``) reporting fixed usage; the ledger and the journal's fold are the witnesses."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis

pytest.importorskip("langgraph")
pytest.importorskip("agents")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402

from runjournal.adapters.langgraph import JournalRuns  # noqa: E402
from runjournal.consumers.recovery.job import RecoveryJob  # noqa: E402
from runjournal.core.settings import Settings  # noqa: E402
from runjournal.model.reducer import fold  # noqa: E402
from runjournal.producers import Journal  # noqa: E402
from runjournal.producers.aio import AsyncJournal  # noqa: E402
from runjournal.producers.spend import DIMS, RESERVE_TOOL, SETTLE_TOOL, BudgetExceededError, fold_spend  # noqa: E402
from runjournal.schemas import EventType  # noqa: E402
from tests.support.readback import events_of, read_committed  # noqa: E402

pytestmark = [pytest.mark.integration]

PRICES = {"*": {"input_per_mtok": "1", "output_per_mtok": "4"}}  # every model: 1 / 4 micro-units per token


class Crash(RuntimeError):
    """The process 'dies' here."""


def _spend(topics: Settings, budgets: dict[str, Any] | None = None) -> Settings:
    return topics.model_copy(update={"spend_prices": PRICES, "spend_budgets": budgets or {"run": {"model_calls": 10}}})


def _records(settings: Settings, run_id: str) -> list[Any]:
    state = fold((r.event, r.partition, r.offset) for r in read_committed(settings) if r.event.run_id == run_id)
    assert state is not None
    return list(state.records.values())


def _spend_intents(settings: Settings, run_id: str) -> dict[str, int]:
    intents = [e.payload["tool"] for e in events_of(read_committed(settings), run_id)
               if e.type is EventType.TOOL_CALL_INTENDED]
    return {tool: intents.count(tool) for tool in (RESERVE_TOOL, SETTLE_TOOL)}


def _run_scope(journal: Journal, run_id: str) -> dict[str, int]:
    scope = journal.spend_ledger.scope("default", "run", run_id)
    assert all(v == 0 for v in scope["open"].values()), scope
    return dict(scope["used"])


def _reply(text: str, inp: int, out: int) -> AIMessage:
    return AIMessage(content=text, usage_metadata={"input_tokens": inp, "output_tokens": out,
                                                   "total_tokens": inp + out})


def _two_model_nodes(runs: JournalRuns, model: GenericFakeChatModel, crash: set[str] | None = None) -> Any:
    """``plan`` and ``answer`` each call the model once; ``answer`` may 'crash' after its model call."""
    def node(name: str) -> Callable[[MessagesState], dict[str, Any]]:
        def run(state: MessagesState) -> dict[str, Any]:
            reply = model.invoke(state["messages"])
            if crash is not None and name in crash:
                crash.discard(name)
                raise Crash(f"the process died after {name}'s model call")
            return {"messages": [reply]}
        return run

    graph = StateGraph(MessagesState)
    graph.add_node("plan", node("plan"))
    graph.add_node("answer", node("answer"))
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "answer")
    graph.add_edge("answer", END)
    return runs.compile(graph)


# -- LangGraph -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_graph_reserves_and_settles_once_per_model_call_from_the_reported_usage(topics: Settings,
                                                                                  mode: str) -> None:
    settings = _spend(topics)
    run_id = f"lg-spend-{mode}-{uuid.uuid4().hex[:6]}"
    config = {"configurable": {"thread_id": run_id}}
    start = {"messages": [HumanMessage(content="x" * 40)]}  # 40 characters: 10 input tokens estimated

    def model() -> GenericFakeChatModel:
        return GenericFakeChatModel(messages=iter([_reply("a plan", 12, 3), _reply("the answer", 20, 5)]))

    if mode == "sync":
        with Journal(settings, producer_id=f"lgs-{uuid.uuid4().hex[:6]}") as journal:
            runs = JournalRuns(journal)
            assert runs.graph_spend.enabled  # automatic: the settings configure spend
            _two_model_nodes(runs, model()).invoke(start, config)
            used = _run_scope(journal, run_id)
            runs.handle(run_id).succeed()
    else:
        async def main() -> dict[str, int]:
            async with await AsyncJournal.open(settings, producer_id=f"lgs-{uuid.uuid4().hex[:6]}",
                                               producer_threads=4) as journal:
                runs = JournalRuns(journal)
                await _two_model_nodes(runs, model()).ainvoke(start, config)
                out = _run_scope(journal.sync, run_id)
                await runs.async_handle(run_id).succeed()
                return out
        used = asyncio.run(main())
    assert used == {"input_tokens": 32, "output_tokens": 8, "cost_micros": 12 + 12 + 20 + 20, "model_calls": 2}
    assert _spend_intents(settings, run_id) == {RESERVE_TOOL: 2, SETTLE_TOOL: 2}
    summary = fold_spend(_records(settings, run_id))
    assert summary.reservations == 2 and summary.open == dict.fromkeys(DIMS, 0) and summary.charged() == used
    reserved = [e.payload for e in events_of(read_committed(settings), run_id)
                if e.type is EventType.TOOL_CALL_INTENDED and e.payload["tool"] == RESERVE_TOOL]
    estimates = [json.loads(p["args_json"])["estimate"] for p in reserved]
    # ceil(characters / 4): 40, then 40 + "a plan"; no max_tokens on the request: 1024 output tokens
    assert [(e["input_tokens"], e["output_tokens"]) for e in estimates] == [(10, 1024), (12, 1024)]


def test_spend_is_off_without_spend_settings_and_a_refusal_stops_the_graph(topics: Settings) -> None:
    with Journal(topics, producer_id=f"lgs-{uuid.uuid4().hex[:6]}") as journal:
        assert not JournalRuns(journal).graph_spend.enabled  # no prices, no budgets: nothing to enforce
    settings = _spend(topics, {"run": {"model_calls": 1}})
    run_id = f"lg-refused-{uuid.uuid4().hex[:6]}"
    replies = iter([_reply("a plan", 12, 3), _reply("never", 1, 1)])
    with Journal(settings, producer_id=f"lgs-{uuid.uuid4().hex[:6]}") as journal:
        runs = JournalRuns(journal)
        with pytest.raises(BudgetExceededError) as refused:
            _two_model_nodes(runs, GenericFakeChatModel(messages=replies)).invoke(
                {"messages": [HumanMessage(content="hi")]}, {"configurable": {"thread_id": run_id}})
        assert (refused.value.scope, refused.value.dim, refused.value.left) == (f"run:{run_id}", "model_calls", 0)
        assert next(replies).content == "never"  # the refused model call was not made
        used = _run_scope(journal, run_id)
        runs.handle(run_id).fail(refused.value)
    assert used["model_calls"] == 1 and used["input_tokens"] == 12
    summary = fold_spend(_records(settings, run_id))
    assert summary.refused == 1 and summary.charged() == used


def test_a_graph_resumed_after_a_crash_meets_its_recorded_spend_and_charges_nothing_twice(topics: Settings) -> None:
    """``answer`` crashes after its model call (reserved and settled); the run is handed to a second instance, which
    continues the graph from its checkpoint: ``answer`` runs again, its model call meets the recorded reservation
    and settle under the same task key, and nothing more is charged."""
    settings = _spend(topics)
    run_id = f"lg-resume-{uuid.uuid4().hex[:6]}"
    config = {"configurable": {"thread_id": run_id}}
    with Journal(settings, producer_id=f"lgs-a-{uuid.uuid4().hex[:6]}") as first:
        model = GenericFakeChatModel(messages=iter([_reply("a plan", 12, 3), _reply("the answer", 20, 5)]))
        with pytest.raises(Crash):
            _two_model_nodes(JournalRuns(first), model, {"answer"}).invoke(
                {"messages": [HumanMessage(content="hi")]}, config)
        before = _run_scope(first, run_id)
    assert before["model_calls"] == 2
    with Journal(settings, producer_id=f"lgs-b-{uuid.uuid4().hex[:6]}") as taker:
        job = RecoveryJob(settings, max_wait_s=30)
        try:
            report = job.recover(runs=[run_id], force=True, assign_to=taker.producer_id)
        finally:
            job.close()
        assert report.runs[0].action == "resumed", report.runs[0]
        assert taker.claim_assignment(timeout_s=10) == run_id
        runs = JournalRuns(taker)
        handle = taker.resume(run_id)
        runs.attach(handle)
        again = GenericFakeChatModel(messages=iter([_reply("the answer", 20, 5)]))  # answer's call is made again
        out = _two_model_nodes(runs, again).invoke(None, config)
        assert out["messages"][-1].content == "the answer"
        after = _run_scope(taker, run_id)
        handle.succeed()
    assert after == before  # charged once
    assert _spend_intents(settings, run_id) == {RESERVE_TOOL: 2, SETTLE_TOOL: 2}  # nothing reserved again
    assert fold_spend(_records(settings, run_id)).charged() == after


# -- the OpenAI Agents SDK -------------------------------------------------------------------------------------------
def _agent(tag: str) -> Any:
    from agents import Agent, function_tool
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
    from agents.usage import Usage as AgentUsage

    from runjournal.adapters.openai_agents import journal_function_tool

    @function_tool(failure_error_function=None)
    def lookup(q: str) -> str:
        """Look something up."""
        return f"found {q}"

    steps = [ModelStep(output=[function_call("lookup", {"q": "x"}, call_id=f"call-{tag}")],
                       usage=AgentUsage(requests=1, input_tokens=20, output_tokens=4)),
             ModelStep(output=[assistant_message("done")], usage=AgentUsage(requests=1, input_tokens=30,
                                                                            output_tokens=2))]
    return Agent(name="looker", model=ScriptedModel(steps), tools=[journal_function_tool(lookup)])


async def _run_agent(journal: AsyncJournal, run: Any, tag: str) -> Any:
    from agents import RunConfig

    from runjournal.adapters._checkpoints import FrameworkRecordStore
    from runjournal.adapters.openai_agents import JournalRunHooks, run_agent
    from runjournal.producers.approvals import ApprovalInbox

    settings = journal.settings
    inbox = ApprovalInbox(redis.Redis.from_url(settings.redis_url), settings.topic_prefix)
    hooks = JournalRunHooks(run, model="scripted")
    assert hooks.spend
    return await run_agent(_agent(tag), "look x up", run=run, inbox=inbox, store=FrameworkRecordStore(journal.sync),
                           hooks=hooks, run_config=RunConfig(tracing_disabled=True))


def test_agents_hooks_reserve_and_settle_each_model_call_and_a_refusal_raises(topics: Settings) -> None:
    settings = _spend(topics)
    refusing = _spend(topics, {"run": {"model_calls": 1}})

    async def main(s: Settings, run_id: str) -> dict[str, int]:
        async with await AsyncJournal.open(s, producer_id=f"ags-{uuid.uuid4().hex[:6]}", producer_threads=4) as j:
            run = await j.start_run("default", "agents", {}, run_id=run_id)
            try:
                result = await _run_agent(j, run, run_id)
                assert result.final_output == "done"
                await run.succeed()
            except BudgetExceededError as exc:
                await run.fail(exc)
                raise
            finally:
                used = _run_scope(j.sync, run_id)
            return used

    ok = f"ag-spend-{uuid.uuid4().hex[:6]}"
    used = asyncio.run(main(settings, ok))
    assert used == {"input_tokens": 50, "output_tokens": 6, "cost_micros": 20 + 16 + 30 + 8, "model_calls": 2}
    assert _spend_intents(settings, ok) == {RESERVE_TOOL: 2, SETTLE_TOOL: 2}
    assert fold_spend(_records(settings, ok)).charged() == used
    refused = f"ag-refused-{uuid.uuid4().hex[:6]}"
    with pytest.raises(BudgetExceededError) as exc:
        asyncio.run(main(refusing, refused))
    assert exc.value.scope == f"run:{refused}" and exc.value.dim == "model_calls"
    summary = fold_spend(_records(refusing, refused))
    assert summary.refused == 1 and summary.charged()["model_calls"] == 1


def test_an_agent_run_again_on_a_resumed_run_charges_nothing_twice(topics: Settings) -> None:
    settings = _spend(topics)
    run_id = f"ag-resume-{uuid.uuid4().hex[:6]}"

    async def first() -> dict[str, int]:
        journal = await AsyncJournal.open(settings, producer_id=f"ags-a-{uuid.uuid4().hex[:6]}", producer_threads=4)
        run = await journal.start_run("default", "agents", {}, run_id=run_id)
        await _run_agent(journal, run, run_id)
        used = _run_scope(journal.sync, run_id)
        await journal.close()  # 'dies' before the run ended
        return used

    async def second() -> dict[str, int]:
        async with await AsyncJournal.open(settings, producer_id=f"ags-b-{uuid.uuid4().hex[:6]}",
                                           producer_threads=4) as taker:
            job = RecoveryJob(settings, max_wait_s=30)
            try:
                report = await asyncio.to_thread(job.recover, runs=[run_id], force=True,
                                                 assign_to=taker.producer_id)
            finally:
                job.close()
            assert report.runs[0].action == "resumed", report.runs[0]
            assert await taker.claim_assignment(10) == run_id
            run = await taker.resume(run_id)
            result = await _run_agent(taker, run, run_id)  # executed again from its start
            assert result.final_output == "done"
            used = _run_scope(taker.sync, run_id)
            await run.succeed()
            return used

    before = asyncio.run(first())
    assert asyncio.run(second()) == before
    assert _spend_intents(settings, run_id) == {RESERVE_TOOL: 2, SETTLE_TOOL: 2}
    assert fold_spend(_records(settings, run_id)).charged() == before


class ModelDown(RuntimeError):
    """The provider failed the request."""


def _failing() -> Any:
    raise ModelDown("the provider failed the request")
    yield  # pragma: no cover - a generator whose first next() raises


def test_a_failed_model_call_is_settled_at_its_estimate(topics: Settings) -> None:
    """LangGraph: ``on_llm_error`` settles at the estimate (``estimated``); the Agents SDK: ``run_agent`` settles
    the reservation its failed model call left open. Nothing stays open."""
    from agents import Agent, RunConfig
    from agents.testing import ModelStep, ScriptedModel

    from runjournal.adapters._checkpoints import FrameworkRecordStore
    from runjournal.adapters.openai_agents import JournalRunHooks, run_agent
    from runjournal.producers.approvals import ApprovalInbox

    settings = _spend(topics)
    graph_run, agent_run = f"lg-err-{uuid.uuid4().hex[:6]}", f"ag-err-{uuid.uuid4().hex[:6]}"
    with Journal(settings, producer_id=f"lgs-{uuid.uuid4().hex[:6]}") as journal:
        runs = JournalRuns(journal)
        with pytest.raises(ModelDown):
            _two_model_nodes(runs, GenericFakeChatModel(messages=_failing())).invoke(
                {"messages": [HumanMessage(content="x" * 8)]}, {"configurable": {"thread_id": graph_run}})
        assert _run_scope(journal, graph_run) == {"input_tokens": 2, "output_tokens": 1024,
                                                  "cost_micros": 2 + 4096, "model_calls": 1}
        runs.handle(graph_run).fail("the model failed")

    async def agents() -> dict[str, int]:
        async with await AsyncJournal.open(settings, producer_id=f"ags-{uuid.uuid4().hex[:6]}",
                                           producer_threads=4) as j:
            run = await j.start_run("default", "agents", {}, run_id=agent_run)
            agent = Agent(name="down", model=ScriptedModel([ModelStep.raise_error(ModelDown("down"))]))
            hooks = JournalRunHooks(run, model="scripted", output_tokens=100)
            with pytest.raises(ModelDown):
                await run_agent(agent, "hi", run=run, store=FrameworkRecordStore(j.sync),
                                inbox=ApprovalInbox(redis.Redis.from_url(settings.redis_url), settings.topic_prefix),
                                hooks=hooks, run_config=RunConfig(tracing_disabled=True))
            used = _run_scope(j.sync, agent_run)
            await run.fail("the model failed")
            return used

    used = asyncio.run(agents())
    assert used["model_calls"] == 1 and used["output_tokens"] == 100
    for run_id in (graph_run, agent_run):
        settles = [json.loads(e.payload["result_json"]) for e in events_of(read_committed(settings), run_id)
                   if e.type is EventType.TOOL_CALL_COMMITTED and e.payload["tool"] == SETTLE_TOOL]
        assert len(settles) == 1 and settles[0]["estimated"] is True, run_id
        assert fold_spend(_records(settings, run_id)).open == dict.fromkeys(DIMS, 0)

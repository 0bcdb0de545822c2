"""A LangGraph agent on the journal: checkpoints in the journal's transaction, the tool node journaled.

    pip install 'runjournal[langgraph]'
    runjournal stack up && runjournal topics create
    python examples/langgraph_agent.py            # sync graph (invoke)
    python examples/langgraph_agent.py --async    # the same graph with ainvoke on an AsyncJournal

Offline: the model is LangChain's ``GenericFakeChatModel`` scripted with a tool call and an answer (no
network, no API key). The graph: agent → tools (``journaled_tool_node``: intent durable before the tool, the
key handed to it through ``current_idempotency_key()``, the output recorded) → agent → END, compiled by
``runs.compile``: checkpointed by ``JournalCheckpointSaver`` and every node journaled (NODE_STARTED /
NODE_SUCCEEDED), so the run's state lists ``agent`` and ``tools``. Prints one JSON line; then
``runjournal projector --until-caught-up && runjournal inspect <run_id>`` (or the console) shows the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from runjournal import AsyncJournal, Journal, Settings, current_idempotency_key
from runjournal.adapters import JournalRuns, journaled_tool_node

SENT: list[str] = []


@tool
def send_email(to: str, subject: str) -> str:
    """Send an email (a side effect: the provider would deduplicate by the idempotency key)."""
    key = current_idempotency_key()
    SENT.append(key or "")
    return f"sent '{subject}' to {to} (key {str(key)[:8]})"


def build(runs: JournalRuns) -> Any:
    model = GenericFakeChatModel(messages=iter([
        AIMessage(content="", tool_calls=[{"name": "send_email", "id": "call-1",
                                           "args": {"to": "bob@example.com", "subject": "Your booking"}}]),
        AIMessage(content="I have emailed Bob the booking."),
    ]))

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", journaled_tool_node([send_email], runs))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return runs.compile(graph)  # the journal's checkpointer, and every node journaled


def summary(run_id: str, out: dict[str, Any], saver_history: int) -> dict[str, Any]:
    return {"run_id": run_id, "answer": out["messages"][-1].content, "messages": len(out["messages"]),
            "emails_sent": len(SENT), "checkpoints": saver_history}


def run_sync(settings: Settings, run_id: str) -> dict[str, Any]:
    with Journal(settings, producer_id=f"example-lg-{run_id[-8:]}") as journal:
        runs = JournalRuns(journal, tenant_id="example", agent="langgraph-mailer")
        graph, config = build(runs), {"configurable": {"thread_id": run_id}}
        out = graph.invoke({"messages": [HumanMessage(content="Email Bob his booking")]}, config)
        history = len(list(graph.get_state_history(config)))
        runs.handle(run_id).succeed({"answer": out["messages"][-1].content})
    return summary(run_id, out, history)


async def run_async(settings: Settings, run_id: str) -> dict[str, Any]:
    async with await AsyncJournal.open(settings, producer_id=f"example-lg-{run_id[-8:]}") as journal:
        runs = JournalRuns(journal, tenant_id="example", agent="langgraph-mailer")
        graph, config = build(runs), {"configurable": {"thread_id": run_id}}
        out = await graph.ainvoke({"messages": [HumanMessage(content="Email Bob his booking")]}, config)
        history = len([s async for s in graph.aget_state_history(config)])
        await runs.async_handle(run_id).succeed({"answer": out["messages"][-1].content})
    return summary(run_id, out, history)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--async", dest="use_async", action="store_true", help="ainvoke on an AsyncJournal")
    args = parser.parse_args()
    run_id = f"example-lg-{uuid.uuid4().hex[:8]}"
    settings = Settings.load()
    result = asyncio.run(run_async(settings, run_id)) if args.use_async else run_sync(settings, run_id)
    print(json.dumps(result))
    raise SystemExit(0 if result["emails_sent"] == 1 and result["messages"] == 4 else 1)

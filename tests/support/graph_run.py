"""A small LangGraph run on the journal, for tests that read one back (the console, ``inspect``).

The graph is the prebuilt agent shape — ``agent`` (a scripted chat model: a tool call, then an answer) → ``tools``
(:func:`runjournal.adapters.journaled_tool_node`) → ``agent`` → END — compiled by ``runs.compile`` (the journal's
checkpointer, every node journaled), then the run succeeds with the model's answer as its output. Offline: no
network, no API key.
"""

from __future__ import annotations

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from runjournal.adapters.langgraph import JournalRuns, journaled_tool_node
from runjournal.core.settings import Settings
from runjournal.producers import Journal

#: The nodes the run's state lists afterwards: path -> (status, attempt).
NODES = {"agent": ("SUCCEEDED", 2), "tools": ("SUCCEEDED", 1)}


@tool
def send_email(to: str) -> str:
    """Send an email (here: say so)."""
    return f"sent to {to}"


def run_graph(settings: Settings, run_id: str) -> str:
    """Run the graph as thread ``run_id`` and succeed the run with ``{"answer": …}``; returns the answer."""
    model = GenericFakeChatModel(messages=iter([
        AIMessage(content="", tool_calls=[{"name": "send_email", "id": "call-1", "args": {"to": "bob"}}]),
        AIMessage(content="Bob has his email.")]))
    with Journal(settings, producer_id=f"graph-{run_id[-12:]}") as journal:
        runs = JournalRuns(journal, tenant_id="acme", agent="mailer")
        graph = StateGraph(MessagesState)
        graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
        graph.add_node("tools", journaled_tool_node([send_email], runs))
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", tools_condition)
        graph.add_edge("tools", "agent")
        out = runs.compile(graph).invoke({"messages": [HumanMessage(content="email bob")]},
                                         {"configurable": {"thread_id": run_id}})
        answer = str(out["messages"][-1].content)
        runs.handle(run_id).succeed({"answer": answer})
    return answer

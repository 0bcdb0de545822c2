"""Child agent for the LangGraph crash test: a graph whose tool node sends an email through the demo provider.

Usage: ``python -m tests.support.langgraph_child RUN_ID PRODUCER_ID PROVIDER_URL start|resume`` with the
service env; ``RJ_FAILPOINTS=tests.langgraph.after_provider=1`` SIGKILLs the process inside the tool, after
the provider executed the email and before the tool returned. The provider's ledger is the witness.

Graph: ``agent`` (a scripted chat model: first a tool call ``call-1`` to ``send_email``, then "sent") →
``tools`` (:func:`journaled_tool_node`) → ``agent`` → END, compiled by ``runs.compile`` (checkpointed by
:class:`JournalCheckpointSaver`, every node journaled).
On ``resume`` the run is claimed and resumed, attached to the registry (its checkpoints rebuilt from the
topic), and the graph continues from its checkpoint with ``invoke(None)``: the model is scripted with the
second answer only, so re-running the first model step would fail the child.
"""

from __future__ import annotations

import sys

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from runjournal.adapters import current_idempotency_key
from runjournal.adapters.langgraph import JournalRuns, journaled_tool_node
from runjournal.core import failpoints
from runjournal.core.settings import Settings
from runjournal.demo.tools import ProviderTool
from runjournal.producers import Journal

RESULT = '{"sent": true}'


def build(runs: JournalRuns, provider: ProviderTool, answers: list[AIMessage]):  # noqa: ANN201
    model = GenericFakeChatModel(messages=iter(answers))

    @tool
    def send_email(to: str) -> str:
        """Send an email (a side effect at the provider, keyed by the journal's idempotency key)."""
        key = current_idempotency_key()
        assert key is not None, "the journal hands the key to the tool"
        out = provider({"to": to}, key)
        failpoints.hit("tests.langgraph.after_provider")  # the effect happened; the tool has not returned
        return str(out)

    def agent(state: MessagesState) -> dict:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", journaled_tool_node([send_email], runs, reconcile={"send_email": provider.reconcile},
                                                timeout_ms=1000))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return runs.compile(graph)


def main() -> None:
    run_id, producer_id, provider_url, mode = sys.argv[1:5]
    settings = Settings.load()
    call = AIMessage(content="", tool_calls=[{"name": "send_email", "args": {"to": "bob"}, "id": "call-1"}])
    with Journal(settings, producer_id=producer_id, lease_ttl_ms=2500) as journal:
        runs = JournalRuns(journal, tenant_id="tenant-a", agent="lg-mailer")
        config = {"configurable": {"thread_id": run_id}}
        if mode == "resume":
            assert journal.claim_assignment(timeout_s=30) == run_id
            handle = journal.resume(run_id)
            runs.attach(handle)
            provider = ProviderTool("send_email", provider_url, run_id, handle.epoch, RESULT, timeout_ms=1000)
            out = build(runs, provider, [AIMessage(content="sent")]).invoke(None, config)
        else:
            handle = runs.handle(run_id)
            provider = ProviderTool("send_email", provider_url, run_id, handle.epoch, RESULT, timeout_ms=1000)
            out = build(runs, provider, [call, AIMessage(content="sent")]).invoke(
                {"messages": [HumanMessage(content="email bob")]}, config)
        handle.succeed({"last": out["messages"][-1].content, "messages": len(out["messages"])})


if __name__ == "__main__":
    main()

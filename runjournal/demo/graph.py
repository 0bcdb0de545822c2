"""A demo script run as a LangGraph agent whose model turns ask for parallel tool calls (the campaign's ``graph``
fault: ``runjournal.demo.agent --graph``).

The graph is the prebuilt shape: an ``agent`` node (the model: here the recorded script, deterministic) and a
``tools`` node (:func:`runjournal.adapters.journaled_tool_node`: LangGraph's ``ToolNode`` running one turn's
tool calls on its thread pool, each through the journal). One model turn asks for every consecutive tool step of
the script at once — the way current models call tools in parallel — except a step that needs a human, which is
asked alone after its approval. Messages are journaled by the ``agent`` node.

Interchangeable with the plain agent (``runjournal.demo.agent.execute``) at any crash: a tool call's id is
``step<i>`` and both call with ``step="step<i>"``, so a run started here and resumed by a plain agent (or the
reverse) meets the same idempotency keys and recorded results; approvals use the same call ids (``step<i>``).
No LangGraph checkpointer: a resumed run re-executes the graph from the start, and the journal answers every
recorded call, as it does for the plain agent. The graph's nodes (``agent``, ``tools``) are journaled beside the
steps' own (``runs.compile``: ``GraphNodeJournal``), without changing a key.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

from runjournal.demo.spend import charge_turn, model_turns
from runjournal.demo.tools import ProviderTool
from runjournal.demo.workload import RunScript, Step, turns
from runjournal.producers import RunHandle
from runjournal.producers.approvals import ApprovalInbox, await_approval

if TYPE_CHECKING:
    from runjournal.adapters.langgraph import JournalRuns

__all__ = ["execute_graph"]


def _args_key(tool: str, args: dict[str, Any]) -> str:
    return f"{tool}\x1f{json.dumps(args, sort_keys=True, separators=(',', ':'), ensure_ascii=False)}"


def execute_graph(runs: JournalRuns, handle: RunHandle, script: RunScript, *, provider_url: str,
                  inbox: ApprovalInbox, approval_timeout_s: float = 120.0, pace_s: float = 0.0) -> None:
    """Run ``script`` on ``handle`` as a LangGraph agent to its recorded outcome (see the module docstring); each
    model turn of the ``agent`` node first takes ``pace_s`` seconds (a model's pace; default 0).

    Raises:
        RunStoppedError: an operator paused or cancelled the run: leave it.
        ProducerFencedError: this instance was fenced (a zombie); the run is someone else's now.
        OutcomeUnknownError: a call's outcome is unknown and its tool cannot reconcile.
    """
    from langchain_core.messages import AIMessage  # runjournal[langgraph]: imported when a graph agent runs
    from langchain_core.tools import StructuredTool
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages
    from langgraph.prebuilt import tools_condition

    from runjournal.adapters import current_idempotency_key, journaled_tool_node

    steps = script.steps
    runs.attach(handle, rebuild=False)  # the thread's handle is this run's (started or resumed by the caller)
    by_args: dict[str, Step] = {_args_key(s.tool, s.args): s for s in steps if s.kind == "tool"}
    providers = {s.tool: ProviderTool(name=s.tool, base_url=provider_url, run_id=handle.run_id, epoch=handle.epoch,
                                      result=s.result) for s in steps if s.kind == "tool" and s.side_effect}

    def tool_fn(name: str) -> Any:
        def run(**args: Any) -> str:
            step = by_args[_args_key(name, args)]
            if not step.side_effect:
                return step.result  # read-only: the recorded answer
            tool = ProviderTool(name=name, base_url=provider_url, run_id=handle.run_id, epoch=handle.epoch,
                                result=step.result)
            return str(tool(args, current_idempotency_key() or ""))
        return run

    names = sorted({s.tool for s in steps if s.kind == "tool"})
    schema = {"type": "object", "properties": {}, "additionalProperties": True}
    tools = [StructuredTool.from_function(func=tool_fn(n), name=n, description=f"the {n} tool", args_schema=schema)
             for n in names]
    effects = {s.tool: s.side_effect for s in steps if s.kind == "tool"}
    reconcile = {n: (lambda key, t=t: t.reconcile(key)) for n, t in providers.items()}
    plan = turns(script)
    spend = model_turns(script)

    def agent(state: dict[str, Any]) -> dict[str, Any]:
        pos = state.get("pos", 0)
        while pos < len(steps):
            if pace_s:
                time.sleep(pace_s)
            step = steps[pos]
            if step.kind == "message":
                with handle.node(f"step{pos}"):
                    charge_turn(handle, script, pos, spend)  # as the plain agent: keyed by step (demo/spend.py)
                    handle.message(step.role, step.content,
                                   user_id=script.user_id if step.role == "user" else None)
                pos += 1
                continue
            turn = next(t for t in plan if t[0] == pos)
            for i in turn:
                charge_turn(handle, script, i, spend)
            if step.needs_approval:
                with handle.node(f"step{pos}") as path:
                    granted = await_approval(handle, inbox, path, f"{step.tool} needs a human", tool=step.tool,
                                             args=step.args, timeout_s=approval_timeout_s)
                    if not granted:
                        handle.message("assistant", f"{step.tool} was not approved")
                if not granted:
                    pos += 1
                    continue
            calls = [{"name": steps[i].tool, "args": dict(steps[i].args), "id": f"step{i}"} for i in turn]
            return {"messages": [AIMessage(content="", tool_calls=calls)], "pos": turn[-1] + 1}
        return {"messages": [AIMessage(content="done")], "pos": pos}

    # functional syntax: evaluated now, not a string annotation resolved later in this module's globals
    state = TypedDict("state", {"messages": Annotated[list[Any], add_messages], "pos": int})  # type: ignore[misc]  # noqa: UP013
    graph = StateGraph(state)
    graph.add_node("agent", agent)
    graph.add_node("tools", journaled_tool_node(tools, runs, side_effects=effects, reconcile=reconcile,
                                                timeout_ms=2000))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "agent")
    app = runs.compile(graph, checkpoint=False)  # every node journaled (runs.graph_nodes); no checkpointer
    app.invoke({"messages": [], "pos": 0}, {"configurable": {"thread_id": handle.run_id},
                                             "recursion_limit": 4 * len(steps) + 10})
    if script.succeeded:
        handle.succeed({"reward": 1.0})
    else:
        handle.fail("recorded outcome: reward 0.0")

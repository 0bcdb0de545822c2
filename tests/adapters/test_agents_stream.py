"""``stream_agent``: the OpenAI Agents SDK's streamed run appended to the run's durable stream (decision 0055) —
the caller gets the SDK's events unchanged; a reader of the run's stream gets the text deltas and the item events
in order, with an end; the journaled tool ran once, inside the streamed run."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from runjournal.consumers.streams import read_stream
from runjournal.core.settings import Settings
from runjournal.producers.aio import AsyncJournal
from tests.support.readback import events_of, read_committed

pytestmark = pytest.mark.integration


def _agent(calls: list[str]) -> Any:
    from agents import Agent, function_tool
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    from runjournal.adapters.openai_agents import journal_function_tool

    @function_tool(failure_error_function=None)
    def lookup(q: str) -> str:
        """Look something up."""
        calls.append(q)
        return f"found {q}"

    steps = [ModelStep(output=[function_call("lookup", {"q": "x"}, call_id="call-1")]),
             ModelStep(output=[assistant_message("all done")])]
    return Agent(name="looker", model=ScriptedModel(steps), tools=[journal_function_tool(lookup)])


def test_a_streamed_agent_run_reaches_the_runs_durable_stream(topics: Settings) -> None:
    from agents import RunConfig

    from runjournal.adapters.openai_agents import stream_agent

    calls: list[str] = []

    async def main() -> tuple[str, list[Any]]:
        async with await AsyncJournal.open(topics, producer_id=f"ags-{uuid.uuid4().hex[:6]}",
                                           producer_threads=4) as journal:
            run = await journal.start_run("default", "agents", {})
            seen = [e async for e in stream_agent(_agent(calls), "look x up", run=run,
                                                  run_config=RunConfig(tracing_disabled=True))]
            await run.succeed()
            journal.sync.streams.flush(10)
            return run.run_id, seen

    run_id, seen = asyncio.run(main())
    assert calls == ["x"]  # the journaled tool ran once, inside the streamed run
    assert any(getattr(e, "type", None) == "raw_response_event" for e in seen)  # the SDK's events, unchanged
    records = [r for _o, r in read_stream(topics, run_id)]
    chunks = [r.data for r in records if r.kind == "chunk"]
    assert "all done" in "".join(c for c in chunks if isinstance(c, str))
    items = [c for c in chunks if isinstance(c, dict)]
    assert {"event": "tool_called", "item": "tool_call_item", "tool": "lookup"} in items
    assert [c["event"] for c in items].index("tool_called") < [c["event"] for c in items].index("tool_output")
    assert records[-1].kind == "end" and records[-1].segment.startswith("agents.stream#")
    types = [e.type.name for e in events_of(read_committed(topics), run_id)]
    assert types.count("TOOL_CALL_COMMITTED") == 1  # the tool's call is journaled, the stream is not

"""The graph demo agent (the campaign's ``graph`` fault): a LangGraph agent whose model turns ask for parallel tool
calls, interchangeable with the plain agent at any crash (same step keys)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from runjournal.adapters.langgraph import JournalRuns
from runjournal.core.settings import Settings
from runjournal.demo.graph import execute_graph
from runjournal.demo.spend import model_turns
from runjournal.demo.verify import outcome_differs
from runjournal.demo.workload import RunScript, Step, turns
from runjournal.model.reducer import fold
from runjournal.producers import Journal, idempotency_key
from runjournal.producers.approvals import ApprovalInbox
from runjournal.producers.tools import is_builtin
from runjournal.schemas import EventType
from tests.support.provider import Provider, running_provider
from tests.support.readback import events_of, read_committed


def _script(run_id: str) -> RunScript:
    tool = lambda name, n, effect=True: Step("tool", tool=name, args={"n": n}, result=f"{name}-{n}",  # noqa: E731
                                             side_effect=effect)
    steps = (Step("message", role="user", content="book me three things"),
             tool("book", 1), tool("book", 2), tool("lookup", 3, effect=False),
             Step("message", role="assistant", content="and pay"),
             tool("pay", 4))
    return RunScript(run_id=run_id, tenant_id="t", agent="graph", user_id="u1", instruction="book",
                     steps=steps, succeeded=True)


def test_turns_group_consecutive_tool_steps_and_keep_approvals_alone() -> None:
    script = _script("r")
    assert turns(script) == [[1, 2, 3], [5]]
    approval = RunScript(run_id="r", tenant_id="t", agent="a", user_id=None, instruction="",
                         steps=(Step("tool", tool="a"), Step("tool", tool="b", needs_approval=True),
                                Step("tool", tool="c")), succeeded=True)
    assert turns(approval) == [[0], [1], [2]]


@pytest.fixture
def provider(tmp_path: Path, service_env: dict[str, str]) -> Iterator[Provider]:
    with running_provider(tmp_path, service_env) as running:
        yield running


@pytest.mark.integration
def test_a_parallel_turn_journals_each_call_once_under_the_plain_agents_keys(topics: Settings,
                                                                            provider: Provider) -> None:
    run_id = f"graph-{uuid.uuid4().hex[:8]}"
    script = _script(run_id)
    inbox = ApprovalInbox(redis.Redis.from_url(topics.redis_url), topics.topic_prefix)
    with Journal(topics, producer_id=f"graph-{uuid.uuid4().hex[:6]}") as journal:
        handle = journal.start_run("t", "graph", {"instruction": "book"}, run_id=run_id)
        execute_graph(JournalRuns(journal), handle, script, provider_url=provider.url, inbox=inbox)
    events = events_of(read_committed(topics), run_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), "one event per seq"
    state = fold((e, 0, i) for i, e in enumerate(events))
    assert outcome_differs(script, state) is None
    stats = httpx.get(f"{provider.url}/stats", timeout=10).json()
    assert stats["executions"] == 3 and not stats["duplicates"]  # book 1, book 2, pay 4: each once
    intents = Counter(e.payload["idempotency_key"] for e in events if e.type is EventType.TOOL_CALL_INTENDED
                      and not is_builtin(e.payload["tool"]))
    # every model turn's spend, reserved and settled under the step names the plain agent uses (demo/spend.py)
    spend = {e.payload["idempotency_key"] for e in events if e.type is EventType.TOOL_CALL_COMMITTED
             and is_builtin(e.payload["tool"])}
    assert spend == {idempotency_key(run_id, f"#step{i}/model/{part}", 1) for i in model_turns(script)
                     for part in ("reserve", "settle")}
    # the plain agent (runjournal.demo.agent.execute) calls step i with step="step<i>": a run either agent started
    # is resumed by the other under the same keys, its recorded results answering
    assert set(intents) == {idempotency_key(run_id, f"#step{i}", 1) for i in (1, 2, 3, 5)}
    assert set(intents.values()) == {1}
    # the graph's own nodes beside the steps' (RunHandle.node): the model node once per turn and after the last, the
    # tool node once per turn — journaled without moving a key
    nodes = {path: (n.status.value, n.attempt) for path, n in state.nodes.items()}
    assert nodes["agent"] == ("SUCCEEDED", len(turns(script)) + 1) and nodes["tools"][0] == "SUCCEEDED"

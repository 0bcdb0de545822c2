"""Framework runs SIGKILLed and resumed through recovery; the demo provider's SQLite ledger is the witness.

* LangGraph: the agent process dies inside the side-effecting tool (the provider executed the email, the
  tool never returned). The recovery job hands the run over; the new process rebuilds the thread's
  checkpoints from the journal and continues the graph from its checkpoint: the tool node runs again, the
  journal reconciles the unknown call by key (the provider says executed) and the email is not sent again.
* OpenAI Agents SDK: the agent pauses on a tool that needs approval and the process dies while waiting.
  After recovery and ``runjournal approve`` (a subprocess), the resumed process loads the recorded RunState,
  the tool runs once and the run completes; the approval was asked once.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

pytest.importorskip("langgraph")
pytest.importorskip("agents")

from runjournal.consumers.ops.inspect import read_run_events  # noqa: E402
from runjournal.consumers.recovery.job import RecoveryJob  # noqa: E402
from runjournal.core.settings import Settings  # noqa: E402
from runjournal.model.reducer import RunStatus  # noqa: E402
from runjournal.producers.approvals import ApprovalInbox  # noqa: E402
from runjournal.schemas.keys import partition_for  # noqa: E402
from tests.support.provider import Provider, project, running_provider, wait_lease, wait_lease_gone  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.slow]


@pytest.fixture
def provider(tmp_path: Path, service_env: dict[str, str]) -> Iterator[Provider]:
    with running_provider(tmp_path, service_env) as running:
        yield running


def start(module: str, env: dict[str, str], run_id: str, producer_id: str, provider: Provider, mode: str,
          failpoint: str = "") -> subprocess.Popen:
    env = {**env, "RJ_FAILPOINTS": failpoint} if failpoint else env
    return subprocess.Popen([sys.executable, "-m", f"tests.support.{module}", run_id, producer_id, provider.url, mode],
                            env=env, stderr=subprocess.PIPE, text=True)


def hand_over(settings: Settings, env: dict[str, str], module: str, run_id: str, provider: Provider
              ) -> subprocess.Popen:
    """After agent-a died: start agent-b in resume mode and let the recovery job hand the run to it."""
    wait_lease_gone(settings, "agent-a")
    taker = start(module, env, run_id, "agent-b", provider, "resume")
    wait_lease(settings, "agent-b")
    job = RecoveryJob(settings)
    try:
        report = job.recover(stale=True).as_dict()
    finally:
        job.close()
    (outcome,) = report["runs"]
    assert outcome["action"] == "resumed" and outcome["assigned_to"] == "agent-b", report
    return taker


def final_state(settings: Settings, run_id: str):  # noqa: ANN201
    return project(settings).get(partition_for(run_id, settings.partitions), run_id)


def test_langgraph_killed_inside_the_tool_resumes_from_its_checkpoint_and_sends_once(
        topics: Settings, service_env: dict[str, str], provider: Provider) -> None:
    run_id = "lg-crash"
    owner = start("langgraph_child", service_env, run_id, "agent-a", provider, "start",
                  failpoint="tests.langgraph.after_provider=1")
    assert owner.wait(90) == -signal.SIGKILL, owner.stderr.read()[-3000:]
    assert provider.executions() == 1, "the email left before the kill"

    taker = hand_over(topics, service_env, "langgraph_child", run_id, provider)
    assert taker.wait(120) == 0, taker.stderr.read()[-3000:]

    assert provider.executions() == 1, "reconciled by key, not sent again"
    rows = [r for r in read_run_events(topics, run_id) if r.get("event") is not None]
    types = [r["type"] for r in rows]
    assert types.count("TOOL_CALL_INTENDED") == 1 and "TOOL_CALL_RECONCILED" in types
    (reconciled,) = [r["event"] for r in rows if r["type"] == "TOOL_CALL_RECONCILED"]
    assert reconciled.payload["outcome"] == "COMMITTED" and reconciled.epoch == 2
    state = final_state(topics, run_id)
    assert state.status is RunStatus.SUCCEEDED
    # the graph's nodes: the tool node killed in its first attempt ran again as attempt 2 on the resumed run (the
    # plan's count continued, no second node), then the model node's second visit
    assert {p: (n.status.value, n.attempt) for p, n in state.nodes.items()} == {
        "agent": ("SUCCEEDED", 2), "tools": ("SUCCEEDED", 2)}
    (done,) = [r["event"] for r in rows if r["type"] == "RUN_SUCCEEDED"]
    # human, AI tool call, tool answer, final AI: the graph continued from its checkpoint (the first model
    # step was not run again: the resumed child's model knows only the second answer)
    assert '"messages":4' in done.payload["output_json"] and '"last":"sent"' in done.payload["output_json"]


def wait_pending(settings: Settings, run_id: str, call_id: str, timeout_s: float = 60) -> None:
    r = redis.Redis.from_url(settings.redis_url)
    member = f"{run_id}|{call_id}".encode()
    deadline = time.monotonic() + timeout_s
    while not r.sismember(ApprovalInbox(r, settings.topic_prefix).pending_key(), member):
        assert time.monotonic() < deadline, "the agent never asked for approval"
        time.sleep(0.05)


def test_agents_sdk_approval_survives_a_kill_and_the_tool_runs_once(
        topics: Settings, service_env: dict[str, str], provider: Provider) -> None:
    run_id = "agents-approval"
    owner = start("agents_child", service_env, run_id, "agent-a", provider, "start")
    wait_pending(topics, run_id, "call-1")
    owner.send_signal(signal.SIGKILL)
    assert owner.wait(30) == -signal.SIGKILL
    assert provider.executions() == 0, "nothing is sent before a human decides"

    taker = hand_over(topics, service_env, "agents_child", run_id, provider)
    project(topics)  # `approve` checks the projected run shows the request pending
    granted = subprocess.run([sys.executable, "-m", "runjournal", "approve", run_id, "call-1", "--approver", "alice"],
                             env=service_env, capture_output=True, text=True, timeout=60)
    assert granted.returncode == 0, granted.stderr
    assert taker.wait(120) == 0, taker.stderr.read()[-3000:]

    assert provider.executions() == 1
    rows = [r["event"] for r in read_run_events(topics, run_id) if r.get("event") is not None]
    asked = [e for e in rows if e.type == "APPROVAL_REQUESTED"]
    assert len(asked) == 1 and asked[0].payload["call_id"] == "call-1" and asked[0].epoch == 1
    (grant,) = [e for e in rows if e.type == "APPROVAL_GRANTED"]
    assert grant.epoch == 2 and grant.payload["approver"] == "alice"
    assert [e.type for e in rows].count("TOOL_CALL_COMMITTED") == 1
    assert final_state(topics, run_id).status is RunStatus.SUCCEEDED

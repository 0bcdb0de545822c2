"""Replay is not resume: time travel from the journal, agent code re-executed against recorded results.

Real child processes on the real broker and Redis; the demo provider's SQLite ledger (idempotency
OFF, kept running during replay) is the witness that replay never calls a tool.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from runjournal.consumers.ops.replay import ReplayDivergedError, ReplayHandle, replay_run, replay_state
from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core import kafka, redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.demo.tools import ProviderTool
from runjournal.model.reducer import CallStatus, RunStatus, state_digest
from runjournal.schemas.keys import partition_for
from tests.support.agent_child import script
from tests.support.provider import Provider, child, project, running_provider, wait_lease, wait_lease_gone

pytestmark = [pytest.mark.integration]


@pytest.fixture
def provider(tmp_path: Path, service_env: dict[str, str]) -> Iterator[Provider]:
    with running_provider(tmp_path, service_env) as running:
        yield running


def end_offsets(settings: Settings) -> list[int]:
    consumer = kafka.consumer(settings, **{"group.id": "offsets-probe"})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(settings.events_topic, p), timeout=10, cached=False)[1]
                for p in range(settings.partitions)]
    finally:
        consumer.close()


def cli_replay(env: dict[str, str], run_id: str, *extra: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "runjournal", "replay", run_id, "--json", *extra], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def seq_of(timeline: list[dict[str, Any]], etype: str, nth: int = 0) -> int:
    return [row["seq"] for row in timeline if row["type"] == etype][nth]


def test_replay_of_a_historical_run_containing_send_email_does_not_increase_the_provider_call_count(
        topics: Settings, service_env: dict[str, str], provider: Provider) -> None:
    """Seed table: replay of a historical run containing send_email → the provider's real call count does not
    increase. State replay (CLI and library, any seq) and agent-code replay return the recorded result."""
    run_id = "replay-1"
    assert child(service_env, run_id, "agent-a", provider).wait(60) == 0
    assert provider.executions() == 1
    before = end_offsets(topics)

    # 1. state replay through the CLI = the library = what the projector folds
    full = cli_replay(service_env, run_id)
    replayed = replay_state(topics, run_id)
    assert full["state"] == json.loads(replayed.state.to_json())
    assert full["state"]["status"] == "SUCCEEDED"
    projected = project(topics).get(partition_for(run_id, topics.partitions), run_id)
    assert state_digest(replayed.state) == state_digest(projected)
    (record,) = replayed.state.records.values()
    assert record.status is CallStatus.COMMITTED and record.tool == "send_email"
    recorded = json.loads(record.result_json)

    # 2. time travel: at the intent the send is INTENDED and the run RUNNING; before it, no record at all
    intent_seq = seq_of(full["timeline"], "TOOL_CALL_INTENDED")
    at_intent = cli_replay(service_env, run_id, "--until-seq", str(intent_seq))
    assert at_intent["state"]["last_seq"] == intent_seq and at_intent["state"]["status"] == "RUNNING"
    assert [r["status"] for r in at_intent["execution_records"]] == ["INTENDED"]
    assert at_intent["timeline"][-1]["type"] == "TOOL_CALL_INTENDED"
    assert replay_state(topics, run_id, until_seq=intent_seq - 1).state.records == {}

    # 3. the agent's own code, re-executed: the recorded result comes back, the tool never runs
    again = replay_run(topics, run_id, lambda handle: script(handle, provider.url))
    assert again.stopped is None and again.mismatches == () and again.unreached_calls == ()
    (call,) = again.calls
    assert call.tool == "send_email" and call.idempotency_key == record.idempotency_key
    assert call.result == recorded == '{"sent": true}'

    # 4. ... and up to the intent it stops at the send: no outcome was recorded by then
    early = replay_run(topics, run_id, lambda handle: script(handle, provider.url), until_seq=intent_seq)
    assert early.calls == () and "no outcome" in early.stopped

    assert provider.executions() == 1, "replay must never reach the provider"
    assert end_offsets(topics) == before, "replay must publish nothing"


def test_replayed_code_that_diverges_raises(topics: Settings, service_env: dict[str, str],
                                            provider: Provider) -> None:
    """Another tool, other arguments, or a step the finished recording lacks → ReplayDivergedError; nothing runs."""
    run_id = "replay-2"
    assert child(service_env, run_id, "agent-a", provider).wait(60) == 0

    def send(handle: ReplayHandle, *, tool: str = "send_email", subject: str = "booking 0", node: str = "send") -> None:
        with handle.node(node):  # the key derives from (run_id, node path, index): "send", 1
            tool_obj = ProviderTool(name=tool, base_url=provider.url, run_id=run_id, epoch=1, result="x")
            handle.call(tool_obj, {"to": "bob@example.com", "subject": subject})

    with pytest.raises(ReplayDivergedError, match="tool 'send_email'"):
        replay_run(topics, run_id, lambda h: send(h, tool="send_sms"))
    with pytest.raises(ReplayDivergedError, match="arguments differ"):
        replay_run(topics, run_id, lambda h: send(h, subject="another"))
    with pytest.raises(ReplayDivergedError, match="no such call") as raised:
        replay_run(topics, run_id, lambda h: send(h, node="resend"))
    assert raised.value.node_path == "resend" and raised.value.index == 1
    assert replay_run(topics, run_id, lambda h: send(h)).calls[0].result == '{"sent": true}'
    assert provider.executions() == 1


def test_replay_of_a_recovered_run_crosses_epochs_without_calling(topics: Settings, service_env: dict[str, str],
                                                                  provider: Provider) -> None:
    """A run crashed after the send (outcome unknown), recovered, reconciled by the resumed owner: replay of
    the whole history returns the reconciled result; replay to epoch 1's intent stops there. Count stays 1."""
    run_id = "replay-3"
    crashed = child(service_env, run_id, "agent-a", provider, failpoint="producers.call.after_tool=1")
    assert crashed.wait(60) == -signal.SIGKILL
    wait_lease_gone(topics, "agent-a")
    taker = child(service_env, run_id, "agent-b", provider, resume=True)
    wait_lease(topics, "agent-b")
    job = RecoveryJob(topics)
    job.recover(stale=True)
    job.close()
    assert taker.wait(60) == 0
    assert provider.executions() == 1

    full = replay_state(topics, run_id)
    assert full.state.status is RunStatus.SUCCEEDED and full.state.epoch == 2
    (record,) = full.state.records.values()
    assert record.status is CallStatus.RECONCILED
    again = replay_run(topics, run_id, lambda handle: script(handle, provider.url))
    assert [c.result for c in again.calls] == ['{"sent": true}'] and again.stopped is None
    assert again.mismatches == ()

    intent_seq = next(e.seq for e in full.events if e.type == "TOOL_CALL_INTENDED")
    at_crash = replay_run(topics, run_id, lambda handle: script(handle, provider.url), until_seq=intent_seq)
    assert at_crash.replayed.state.epoch == 1 and at_crash.calls == () and at_crash.stopped
    assert redis_client.client(topics).exists(RedisKeys(topics.topic_prefix).plan(run_id))  # untouched
    assert provider.executions() == 1

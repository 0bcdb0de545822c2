"""Durable approvals across crashes: asked once, decided once, the approved tool run once.

Real agent child processes (SIGKILLed), the real recovery job, the ``runjournal approve`` / ``deny``
CLI in a subprocess, the real broker and Redis; the provider's SQLite ledger is the witness.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from runjournal.cli.approvals import ApprovalRefusedError, submit_decision
from runjournal.consumers.ops.inspect import read_run_events
from runjournal.consumers.ops.replay import replay_run
from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core import redis_client
from runjournal.core.settings import Settings
from runjournal.model.reducer import CallStatus, Decision, RunStatus
from runjournal.producers.approvals import ApprovalInbox
from runjournal.producers.plan import ApprovalStatus, PlanStore
from runjournal.schemas import Event, EventType
from runjournal.schemas.keys import partition_for
from tests.support.agent_child import script
from tests.support.provider import Provider, child, project, running_provider, wait_lease, wait_lease_gone
from tests.support.workload import publish

pytestmark = [pytest.mark.integration, pytest.mark.crash]


@pytest.fixture
def provider(tmp_path: Path, service_env: dict[str, str]) -> Iterator[Provider]:
    with running_provider(tmp_path, service_env) as running:
        yield running


def cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runjournal", *argv], env=env, capture_output=True, text=True,
                          timeout=60)


def wait_requested(settings: Settings, run_id: str, call_id: str, timeout_s: float = 30) -> None:
    """Until the owner waits on the inbox (its APPROVAL_REQUESTED is durable by then)."""
    member = f"{run_id}|{call_id}".encode()
    r = redis_client.client(settings)
    deadline = time.monotonic() + timeout_s
    while not r.sismember(ApprovalInbox(r, settings.topic_prefix).pending_key(), member):
        assert time.monotonic() < deadline, "the owner never asked for approval"
        time.sleep(0.05)


def wait_resumed_at_send(settings: Settings, run_id: str, timeout_s: float = 30) -> None:
    """Until the topic shows the resumed owner in the ``send`` node again (attempt 2): it waits there."""
    deadline = time.monotonic() + timeout_s
    while not any(row["type"] == "NODE_STARTED" and row["event"].payload == {"node_path": "send", "attempt": 2}
                  for row in read_run_events(settings, run_id)):
        assert time.monotonic() < deadline, "the resumed owner never reached the send step"
        time.sleep(0.2)


def recover(settings: Settings, env: dict[str, str], provider: Provider, run_id: str) -> subprocess.Popen:
    """After agent-a died: start agent-b (resume mode), recover the stale run onto it; return agent-b."""
    wait_lease_gone(settings, "agent-a")
    taker = child(env, run_id, "agent-b", provider, resume=True, approval=True)
    wait_lease(settings, "agent-b")
    job = RecoveryJob(settings)
    report = job.recover(stale=True).as_dict()
    job.close()
    (outcome,) = report["runs"]
    assert outcome["action"] == "resumed" and outcome["assigned_to"] == "agent-b", report
    return taker


def approval_events(settings: Settings, run_id: str, call_id: str) -> dict[str, list[Event]]:
    out: dict[str, list[Event]] = {}
    for row in read_run_events(settings, run_id):
        event = row.get("event")
        if event is not None and event.type.startswith("APPROVAL_") and event.payload["call_id"] == call_id:
            out.setdefault(str(event.type), []).append(event)
    return out


@pytest.mark.parametrize("decided", ["while_the_resumed_owner_waits", "while_nobody_owns_the_run"])
@pytest.mark.slow
def test_a_pending_approval_survives_a_crash_and_recovery(topics: Settings, service_env: dict[str, str],
                                                          provider: Provider, decided: str) -> None:
    """Seed table: a pending approval survives any crash and recovery. The owner dies while waiting; the
    journal (not Redis: the projection is wiped and rebuilt) keeps the request; recovery hands it over as
    PENDING; the resumed owner does not ask again; the CLI grant reaches it; the send runs once."""
    waiting = decided == "while_the_resumed_owner_waits"
    run_id = "appr-waiting" if waiting else "appr-ownerless"
    owner = child(service_env, run_id, "agent-a", provider, approval=True)
    wait_requested(topics, run_id, "send")
    owner.send_signal(signal.SIGKILL)
    assert owner.wait(30) == -signal.SIGKILL

    store = project(topics)
    state = store.get(partition_for(run_id, topics.partitions), run_id)
    assert set(state.pending_approvals) == {"send"} and state.pending_approvals["send"].tool == "send_email"
    asked = {"to": "bob@example.com", "subject": "booking 0"}  # the approver sees what they decide about (v4)
    assert json.loads(state.pending_approvals["send"].args_json) == asked
    shown = cli({**service_env, "COLUMNS": "200"}, "inspect", run_id, "--no-timeline")
    assert shown.returncode == 0 and 'arguments: {"subject":"booking 0","to":"bob@example.com"}' in shown.stdout, \
        shown.stdout
    if waiting:
        refused = cli(service_env, "approve", run_id, "no-such-call")
        assert refused.returncode == 1 and "no pending approval 'no-such-call'" in refused.stderr
    else:
        assert cli(service_env, "approve", run_id, "send", "--approver", "alice", "--comment", "ok").returncode == 0
    store.wipe()  # Redis is disposable: recovery finds the request in the journal, not in a snapshot

    taker = recover(topics, service_env, provider, run_id)
    plan = PlanStore(redis_client.client(topics), topics.topic_prefix).get(run_id)
    assert dict(plan.approvals) == {"send": ApprovalStatus.PENDING} and dict(plan.calls) == {}
    if waiting:
        wait_resumed_at_send(topics, run_id)
        state = project(topics).get(partition_for(run_id, topics.partitions), run_id)  # rebuilt from the topic
        assert state.status is RunStatus.WAITING_APPROVAL and state.epoch == 2
        assert set(state.pending_approvals) == {"send"}
        assert provider.executions() == 0, "nothing is sent before a human decides"
        granted = cli({**service_env, "COLUMNS": "200"}, "approve", run_id, "send", "--approver", "alice",
                      "--comment", "ok")
        assert granted.returncode == 0, granted.stderr
        assert 'with arguments {"subject": "booking 0", "to": "bob@example.com"}' in granted.stderr, granted.stderr
    assert taker.wait(60) == 0, taker.stderr.read()[-3000:]

    assert provider.executions() == 1
    events = approval_events(topics, run_id, "send")
    assert len(events["APPROVAL_REQUESTED"]) == 1, "asked once, across the crash"
    (grant,) = events["APPROVAL_GRANTED"]
    assert grant.epoch == 2 and grant.payload["approver"] == "alice" and grant.payload["comment"] == "ok"
    state = project(topics).get(partition_for(run_id, topics.partitions), run_id)
    assert state.status is RunStatus.SUCCEEDED and not state.pending_approvals
    assert state.approvals["send"].decision is Decision.GRANTED
    with pytest.raises(ApprovalRefusedError, match="already GRANTED by alice"):
        submit_decision(topics, run_id, "send", granted=True, approver="mallory")
    if waiting:  # replaying the code: the journal's grant answers await_approval; nothing is asked or sent
        inbox = ApprovalInbox(redis_client.client(topics), topics.topic_prefix)
        replayed = replay_run(topics, run_id, lambda handle: script(handle, provider.url, inbox=inbox))
        assert [c.result for c in replayed.calls] == ['{"sent": true}'] and replayed.stopped is None
        assert provider.executions() == 1


@pytest.mark.parametrize("point", ["producers.call.before_intent_commit", "producers.call.after_tool"])
@pytest.mark.slow
def test_an_approval_granted_before_a_crash_is_not_asked_again(topics: Settings, service_env: dict[str, str],
                                                               provider: Provider, point: str) -> None:
    """Seed table: an approval granted before a crash is not asked again, and its tool does not run twice.
    The grant is journaled; the owner dies before the send's intent is acknowledged, or after the send
    happened but before its outcome; the resumed owner neither re-requests nor re-sends."""
    run_id = f"granted-{point.rsplit('.', 1)[1]}"
    owner = child(service_env, run_id, "agent-a", provider, approval=True, failpoint=f"{point}=1")
    wait_requested(topics, run_id, "send")
    project(topics)
    assert cli(service_env, "approve", run_id, "send", "--approver", "bob").returncode == 0
    assert owner.wait(60) == -signal.SIGKILL, owner.stderr.read()[-3000:]

    taker = recover(topics, service_env, provider, run_id)
    plan = PlanStore(redis_client.client(topics), topics.topic_prefix).get(run_id)
    assert dict(plan.approvals) == {"send": ApprovalStatus.GRANTED}
    assert taker.wait(60) == 0, taker.stderr.read()[-3000:]

    assert provider.executions() == 1, "the approved send runs exactly once"
    events = approval_events(topics, run_id, "send")
    assert len(events["APPROVAL_REQUESTED"]) == 1 and len(events["APPROVAL_GRANTED"]) == 1
    state = project(topics).get(partition_for(run_id, topics.partitions), run_id)
    assert state.status is RunStatus.SUCCEEDED
    (record,) = state.records.values()
    expected = CallStatus.COMMITTED if point.endswith("before_intent_commit") else CallStatus.RECONCILED
    assert record.status is expected and record.effect_committed


def test_deny_and_refusals_write_nothing_unwanted(topics: Settings, service_env: dict[str, str]) -> None:
    """``deny`` records the reason as the decision's ``reason`` (issue 35: it was stored and printed as ``comment``,
    beside the request's reason printed as ``reason``); a second decision, an unknown call or an undecided run are
    refused."""
    run_id = "deny-1"
    at = datetime(2026, 1, 1, tzinfo=UTC)

    def event(seq: int, etype: EventType, payload: dict) -> Event:
        return Event(event_id=str(uuid.uuid4()), run_id=run_id, tenant_id="t", seq=seq, epoch=1, producer_id="a",
                     type=etype, occurred_at=at, payload=payload)

    publish(topics, [event(1, EventType.RUN_STARTED, {"agent": "x", "input_json": "{}", "user_id": None}),
                     event(2, EventType.APPROVAL_REQUESTED, {"call_id": "pay", "reason": "big", "tool": "pay"})])
    with pytest.raises(ApprovalRefusedError, match="no projected state"):
        submit_decision(topics, run_id, "pay", granted=False, approver="carol")
    project(topics)
    denied = cli(service_env, "deny", run_id, "pay", "--reason", "too big", "--approver", "carol", "--json")
    assert denied.returncode == 0, denied.stderr
    out = json.loads(denied.stdout)
    assert (out["decision"], out["reason"], out["request_reason"], out["comment"]) == ("DENIED", "too big", "big", None)
    inbox = ApprovalInbox(redis_client.client(topics), topics.topic_prefix)
    stored = json.loads(redis_client.client(topics).hget(inbox.key(run_id), "pay"))
    assert stored["decision"] == "DENIED" and stored["reason"] == "too big" and "comment" not in stored
    assert inbox.decision(run_id, "pay")["reason"] == "too big"
    with pytest.raises(ApprovalRefusedError, match="already waiting"):
        submit_decision(topics, run_id, "pay", granted=True, approver="dave")
    assert inbox.decision(run_id, "pay")["decision"] == "DENIED", "the first decision wins"
    with pytest.raises(ApprovalRefusedError, match="pending: pay"):
        submit_decision(topics, run_id, "refund", granted=True, approver="dave")


def test_approval_arguments_are_canonical_checked_first_and_inlined_up_to_the_limit(topics: Settings) -> None:
    """Envelope v4 (decision 0046): ``request_approval(args=)`` records the arguments as canonical JSON — a value with
    no canonical form is refused before anything is published — and, like an intent's, only up to
    ``inline_result_bytes``."""
    from runjournal.producers import Journal, NonCanonicalValueError

    run_id = f"appr-args-{uuid.uuid4().hex[:6]}"
    with Journal(topics, producer_id=f"asker-{uuid.uuid4().hex[:6]}", inline_result_bytes=64) as journal:
        run = journal.start_run("t", "agent", {}, run_id=run_id)
        with pytest.raises(NonCanonicalValueError):
            run.request_approval("nan", "r", tool="t", args={"x": float("nan")})
        with pytest.raises(NonCanonicalValueError):
            run.request_approval("set", "r", tool="t", args={"x": {1, 2}})
        run.request_approval("small", "r", tool="send_email", args={"to": "bob@example.com"})
        run.request_approval("large", "r", tool="upload", args={"blob": "x" * 200})
        journal.flush()
    asked = {e.payload["call_id"]: e.payload["args_json"] for row in read_run_events(topics, run_id)
             if (e := row.get("event")) is not None and e.type is EventType.APPROVAL_REQUESTED}
    assert asked == {"small": '{"to":"bob@example.com"}', "large": None}  # nothing of the refused two


def test_a_denial_is_journaled_with_its_reason_and_one_stored_as_comment_still_reads(topics: Settings) -> None:
    """The owner journals a denial's ``reason`` as APPROVAL_DENIED ``reason``; a denial stored by the previous release
    (its reason under ``comment``) is read as its reason (kept one release); a grant keeps its ``comment``."""
    from runjournal.producers import Journal
    from runjournal.producers.approvals import await_approval

    r = redis_client.client(topics)
    inbox = ApprovalInbox(r, topics.topic_prefix)
    with Journal(topics, producer_id=f"asker-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("t", "agent", {})
        assert inbox.decide(run.run_id, "new", granted=False, approver="carol", reason="too big")
        r.hset(inbox.key(run.run_id), "old", json.dumps({"decision": "DENIED", "approver": "dave", "comment": "stale",
                                                         "at_ms": 1}))
        assert inbox.decision(run.run_id, "old")["reason"] == "stale"
        assert inbox.decide(run.run_id, "ok", granted=True, approver="erin", comment="fine")
        with pytest.raises(ValueError, match="comment"):
            inbox.decide(run.run_id, "bad", granted=True, approver="erin", reason="a grant has no reason")
        with pytest.warns(DeprecationWarning, match="reason="):
            assert inbox.decide(run.run_id, "legacy", granted=False, approver="frank", comment="as before")
        assert inbox.decision(run.run_id, "legacy")["reason"] == "as before"
        answers = [await_approval(run, inbox, call_id, "why", timeout_s=10) for call_id in ("new", "old", "ok")]
        run.succeed()
    assert answers == [False, False, True]
    said = {e.payload["call_id"]: e.payload for row in read_run_events(topics, run.run_id)
            if (e := row.get("event")) is not None
            and e.type in (EventType.APPROVAL_DENIED, EventType.APPROVAL_GRANTED)}
    assert (said["new"]["reason"], said["old"]["reason"], said["ok"]["comment"]) == ("too big", "stale", "fine")

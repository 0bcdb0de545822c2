"""Settle an unknown outcome by hand (issue 35 case 2): "it happened — record it, with its result" beside re-run
(grant) and deny, so a person who knows a payment went through never has to choose between charging twice and
failing the run.

A tool without ``reconcile`` times out after its effect: the call is OUTCOME_UNKNOWN and only a person can say. The
operator runs ``runjournal settle RUN_ID APPROVAL_ID --result JSON`` (a subprocess, as a user would); the owner
journals TOOL_CALL_RECONCILED(COMMITTED) with that result, then APPROVAL_DENIED saying it was settled by hand, by
whom and why; calling the tool again returns the result without running it — live, and after a resume.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
import redis

from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core.settings import Settings
from runjournal.model.reducer import CallStatus, ReconciledOutcome, fold
from runjournal.producers import Journal, OutcomeUnknownError
from runjournal.producers.approvals import ApprovalInbox, await_approval
from runjournal.schemas import EventType
from tests.support.ledger import Ledger, LedgerTool
from tests.support.provider import project
from tests.support.readback import events_of, read_committed

pytestmark = pytest.mark.integration

RUNJOURNAL = [sys.executable, "-m", "runjournal"]


class _Blind(LedgerTool):
    """The ledger tool without ``reconcile``: its provider cannot be asked."""

    reconcile = None  # type: ignore[assignment]


def _settle(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RUNJOURNAL, "settle", *args], env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def test_an_unknown_outcome_settled_by_hand_is_recorded_and_never_runs_again(topics: Settings,
                                                                              service_env: dict[str, str]) -> None:
    r = redis.Redis.from_url(topics.redis_url)
    ledger = Ledger(r, f"set{uuid.uuid4().hex[:8]}")
    inbox = ApprovalInbox(r, topics.topic_prefix)
    charge = _Blind(ledger, name="charge", then="timeout_after", result={"id": 7})
    run_id = f"settle-{uuid.uuid4().hex[:8]}"
    with Journal(topics, producer_id=f"payer-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("t", "agent", {}, run_id=run_id)
        with pytest.raises(OutcomeUnknownError) as unknown:
            run.call(charge, {"logical": "charge"})  # the charge went through; its answer was lost
        approval = unknown.value.approval_id
        run.request_approval(approval, "the charge timed out after it was sent", tool="charge")
        journal.flush()
        project(topics)
        refused = _settle(service_env, run_id, approval, "--result", "NaN", "--json")
        assert refused.returncode == 2 and "not JSON" in refused.stderr  # checked before anything is written
        wrong = _settle(service_env, run_id, "no-such-approval", "--result", "{}", "--json")
        assert wrong.returncode == 1 and json.loads(wrong.stderr)["error"] == "ApprovalRefusedError"
        done = _settle(service_env, run_id, approval, "--result", '{"id": 7, "via": "bank statement"}',
                       "--approver", "alice", "--comment", "the bank shows the charge", "--json")
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert (out["decision"], out["settles"]) == ("EXECUTED", unknown.value.call_id)
        assert await_approval(run, inbox, approval, "the charge timed out", tool="charge", timeout_s=10)
        assert run.call(charge, {"logical": "charge"}) == {"id": 7, "via": "bank statement"}  # not run again
        assert ledger.executions() == 1
    # the instance went away with the run open: the resumed owner gets the recorded result too, never a re-run
    with Journal(topics, producer_id=f"taker-{uuid.uuid4().hex[:6]}") as taker:
        job = RecoveryJob(topics, max_wait_s=30)
        try:
            report = job.recover(runs=[run_id], force=True, assign_to=taker.producer_id)
        finally:
            job.close()
        assert report.runs[0].action == "resumed", report.runs[0]
        assert taker.claim_assignment(timeout_s=10) == run_id
        resumed = taker.resume(run_id)
        assert await_approval(resumed, inbox, approval, "again", tool="charge", timeout_s=10)  # denied, yet done
        assert resumed.call(charge, {"logical": "charge"}) == {"id": 7, "via": "bank statement"}
        resumed.succeed({})
        taker.flush()
    assert ledger.executions() == 1, "the settled charge ran again"
    events = events_of(read_committed(topics), run_id)
    (reconciled,) = [e for e in events if e.type is EventType.TOOL_CALL_RECONCILED]
    assert reconciled.payload["outcome"] == "COMMITTED" and json.loads(reconciled.payload["result_json"]) == {
        "id": 7, "via": "bank statement"}
    (answer,) = [e for e in events if e.type is EventType.APPROVAL_DENIED]
    assert "settled by hand" in answer.payload["reason"] and "alice" in answer.payload["reason"]
    assert "the bank shows the charge" in answer.payload["reason"]
    assert events.index(reconciled) < events.index(answer)  # the outcome first: a crash between keeps it
    state = fold([(rec.event, rec.partition, rec.offset) for rec in read_committed(topics)
                  if rec.event.run_id == run_id])
    (record,) = state.records.values()
    assert record.status is CallStatus.RECONCILED and record.reconciled_outcome is ReconciledOutcome.COMMITTED
    assert not state.pending_approvals and state.status.value == "SUCCEEDED"


def test_only_an_unknown_outcome_can_be_settled(topics: Settings, service_env: dict[str, str]) -> None:
    """A step's own approval (not bound to one call) and a call already committed are refused; nothing written."""
    r = redis.Redis.from_url(topics.redis_url)
    run_id = f"settle-{uuid.uuid4().hex[:8]}"
    with Journal(topics, producer_id=f"asker-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("t", "agent", {}, run_id=run_id)
        run.request_approval("refund-over-limit", "a refund of 900 EUR", tool="refund")
        journal.flush()
        project(topics)
        out = _settle(service_env, run_id, "refund-over-limit", "--result", "{}", "--json")
        assert out.returncode == 1 and "not bound to one call" in json.loads(out.stderr)["message"]
    assert ApprovalInbox(r, topics.topic_prefix).decision(run_id, "refund-over-limit") is None

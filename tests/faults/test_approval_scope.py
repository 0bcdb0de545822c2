"""Approvals bind to one attempt (issue 28 case 6): a GRANTED approval for an unknown call authorised unlimited blind
re-runs — a tool without reconcile that timed out again after the approved re-run executed four times on one
approval, live and after resume — and a reconcilable tool was not even asked first.
"""

from __future__ import annotations

import uuid

import pytest
import redis

from runjournal.console import ConsoleData
from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core.settings import Settings
from runjournal.producers import Journal, OutcomeUnknownError
from runjournal.producers.approvals import ApprovalInbox, await_approval
from runjournal.schemas import EventType
from tests.support.ledger import Ledger, LedgerTool
from tests.support.provider import project
from tests.support.readback import events_of, read_committed

pytestmark = pytest.mark.integration


class _Blind(LedgerTool):
    """The ledger tool without ``reconcile``: the provider cannot be asked; only a human can authorise a re-run."""

    reconcile = None  # type: ignore[assignment]


def _grant(handle: object, inbox: ApprovalInbox, approval_id: str) -> None:
    inbox.decide(handle.run_id, approval_id, granted=True, approver="ops")  # type: ignore[attr-defined]
    assert await_approval(handle, inbox, approval_id, "outcome unknown", tool="charge", timeout_s=10)  # type: ignore[arg-type]


@pytest.mark.parametrize("asked_under", ["approval_id", "call_id"])
def test_one_approval_authorises_one_re_run_live_and_after_resume(topics: Settings, asked_under: str) -> None:
    r = redis.Redis.from_url(topics.redis_url)
    ledger = Ledger(r, topics.topic_prefix)
    inbox = ApprovalInbox(r, topics.topic_prefix)
    charge = _Blind(ledger, name="charge", then="timeout_after")  # executes, then its answer is lost: every time
    run_id = f"charge-{uuid.uuid4().hex[:8]}"
    with Journal(topics, producer_id=f"payer-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("t", "agent", {}, run_id=run_id)
        with run.node("pay"):
            with pytest.raises(OutcomeUnknownError) as first:
                run.call(charge, {"logical": "charge"})
            _grant(run, inbox, getattr(first.value, asked_under))
            with pytest.raises(OutcomeUnknownError) as second:
                run.call(charge, {"logical": "charge"})  # the approved re-run: executes, times out again
            assert ledger.executions() == 2
            if asked_under == "approval_id":
                assert second.value.approval_id != first.value.approval_id
            with pytest.raises(OutcomeUnknownError):
                run.call(charge, {"logical": "charge"})  # no approval for this attempt: not run
            assert ledger.executions() == 2
    # the instance closed with the run open: recovery hands it to a new owner, whose plan holds no usable grant
    with Journal(topics, producer_id=f"taker-{uuid.uuid4().hex[:6]}") as taker:
        job = RecoveryJob(topics, max_wait_s=30)
        try:
            report = job.recover(runs=[run_id], force=True, assign_to=taker.producer_id)
        finally:
            job.close()
        assert report.runs[0].action == "resumed", report.runs[0]
        assert taker.claim_assignment(timeout_s=10) == run_id
        resumed = taker.resume(run_id)
        with resumed.node("pay"), pytest.raises(OutcomeUnknownError):
            resumed.call(charge, {"logical": "charge"})
    assert ledger.executions() == 2, "a used approval authorised another blind re-run"
    project(topics)  # the console shows what the grant authorised and that the re-run used it
    page = ConsoleData(topics).run(run_id, with_memory=False)
    assert page is not None
    decided = {d["call_id"]: d for d in page.decided}
    grant = decided[getattr(first.value, asked_under)]
    assert grant["decision"] == "GRANTED" and grant["consumed_offset"] is not None
    assert grant["scope"] == ("one re-run of attempt 1" if asked_under == "approval_id" else "this call id")
    # the scope is in the event itself (envelope v3), and the projection carries it into the decision
    (asked,) = [e for e in events_of(read_committed(topics), run_id) if e.type is EventType.APPROVAL_REQUESTED
                and e.payload["call_id"] == getattr(first.value, asked_under)]
    key = first.value.call_id
    expected = (key, 1) if asked_under == "approval_id" else (None, None)
    assert (asked.payload["scope_call_id"], asked.payload["scope_attempt"]) == expected
    decision = page.state.approvals[getattr(first.value, asked_under)]
    assert (decision.scope_call_id, decision.scope_attempt) == expected


def test_a_reconcilable_tool_is_asked_before_an_approval_is_used(topics: Settings) -> None:
    r = redis.Redis.from_url(topics.redis_url)
    ledger = Ledger(r, topics.topic_prefix)
    inbox = ApprovalInbox(r, topics.topic_prefix)
    book = LedgerTool(ledger, name="book", then="timeout_after", result={"booking": "B1"})
    with Journal(topics, producer_id=f"booker-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("t", "agent", {})
        with run.node("book"):
            with pytest.raises(OutcomeUnknownError) as unknown:
                run.call(book, {"logical": "book"})
            _grant(run, inbox, unknown.value.approval_id)
            assert run.call(book, {"logical": "book"}) == {"booking": "B1"}  # reconciled: executed, not re-run
        run.succeed()
    assert ledger.executions() == 1

"""Resuming a run from a RecoveryPlan: same idempotency keys, seq continuity, per-status call behaviour."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from runjournal.core.settings import Settings
from runjournal.producers import (
    ApprovalDeniedError,
    ApprovalStatus,
    CallVerdict,
    Journal,
    NoRecoveryPlanError,
    Outcome,
    OutcomeUnknownError,
    PlanMismatchError,
    PlannedCall,
    RecoveryPlan,
    RunHandle,
    canonical_json,
    idempotency_key,
)
from runjournal.schemas import Event, EventType, new_event_id, utcnow
from tests.support.readback import events_of, read_committed

pytestmark = pytest.mark.integration


class Scripted:
    """A side-effecting tool that plays a script: an Exception entry is raised, anything else returned."""

    name = "book_hotel"
    side_effect = True
    timeout_ms = 2000

    def __init__(self, *script: Any, reconcile_with: Outcome | None | str = "absent") -> None:
        self.script = list(script)
        self.keys: list[str] = []
        self.reconciled: list[str] = []
        if reconcile_with != "absent":
            self.reconcile = self._reconcile
            self._outcome = reconcile_with

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        self.keys.append(idempotency_key)
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    def _reconcile(self, idempotency_key: str) -> Outcome | None:
        self.reconciled.append(idempotency_key)
        return self._outcome  # type: ignore[return-value]


@pytest.fixture
def journal(topics: Settings) -> Iterator[Journal]:
    with Journal(topics, producer_id=f"a-{uuid.uuid4().hex[:8]}") as j:
        yield j


def hand_over(
    journal: Journal,
    run: RunHandle | RecoveryPlan,
    calls: dict[str, PlannedCall],
    approvals: dict[str, ApprovalStatus] | None = None,
    **extra: Any,
) -> RecoveryPlan:
    """Do what the recovery job does: RUN_RESUMED (seq + 1, epoch + 1), store the plan, assign it."""
    last_seq = run.last_seq if isinstance(run, RunHandle) else run.last_seq
    plan = RecoveryPlan(
        run_id=run.run_id,
        tenant_id=run.tenant_id,
        agent=run.agent,
        epoch=run.epoch + 1,
        last_seq=last_seq + 1,
        calls=calls,
        approvals=approvals or {},
        created_at_ms=int(time.time() * 1000),
        assigned_to=journal.producer_id,
        **extra,
    )
    payload = {
        "previous_epoch": run.epoch,
        "recovered_by": "test-recovery",
        "plan_json": plan.to_json(),
        "assigned_to": journal.producer_id,
    }
    resumed = Event(
        new_event_id(),
        run.run_id,
        run.tenant_id,
        plan.last_seq,
        plan.epoch,
        "recovery",
        EventType.RUN_RESUMED,
        utcnow(),
        payload,
    )
    journal.publish(resumed, durable=True)
    journal.plans.put(plan)
    # as recovery hands a dead owner's run over: out of the owner's set, then assigned (an instance that
    # owns a run already is never assigned it again: PlanStore.assign is check-and-set)
    journal.release_run(run.run_id)
    assert journal.plans.assign(run.run_id, journal.producer_id)
    return plan


class Unavailable(RuntimeError):
    """A definite, retryable failure (the provider refused before acting); a timeout would be unknown."""

    retryable = True


def test_two_resumes_derive_the_same_key_and_continue_seq(journal: Journal, topics: Settings) -> None:
    tool = Scripted(Unavailable("busy"), Unavailable("still busy"), {"room": 12})
    run = journal.start_run("tenant-a", "travel", {"city": "Oslo"})
    with pytest.raises(Unavailable), run.node("book"):
        run.call(tool, {"city": "Oslo"})
    key = idempotency_key(run.run_id, "book", 1)
    assert tool.keys == [key]

    plan1 = hand_over(
        journal,
        run,
        {key: PlannedCall(key, tool.name, CallVerdict.FAILED, attempts=1)},
        node_attempts={"book": 1},
    )
    assert journal.claim_assignment(1.0) == run.run_id
    first = journal.resume(run.run_id)
    assert (first.epoch, first.last_seq) == (2, plan1.last_seq)
    with pytest.raises(Unavailable), first.node("book"):
        first.call(tool, {"city": "Oslo"})

    plan2 = hand_over(journal, first, {key: PlannedCall(key, tool.name, CallVerdict.FAILED, attempts=2)})
    second = journal.resume(run.run_id)
    with second.node("book"):
        assert second.call(tool, {"city": "Oslo"}) == {"room": 12}
    second.succeed()
    assert tool.keys == [key, key, key]

    events = events_of(read_committed(topics), run.run_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.epoch for e in events] == sorted(e.epoch for e in events) and events[
        -1
    ].epoch == plan2.epoch == 3
    intents = [e.payload for e in events if e.type == EventType.TOOL_CALL_INTENDED]
    assert [(p["idempotency_key"], p["attempt"]) for p in intents] == [(key, 1), (key, 2), (key, 3)]
    started = [e.payload["attempt"] for e in events if e.type == EventType.NODE_STARTED]
    assert started == [1, 2, 1]  # plan1 knew of one earlier start; plan2 had no node history


def test_committed_call_returns_recorded_result_without_running_the_tool(
    journal: Journal, topics: Settings
) -> None:
    tool = Scripted({"confirmation": "X1"}, {"confirmation": "X2"})
    run = journal.start_run("tenant-a", "travel", {})
    with run.node("book"):
        run.call(tool, {"n": 1})
    key = idempotency_key(run.run_id, "book", 1)
    recorded = canonical_json({"confirmation": "X1"})
    plan = hand_over(
        journal,
        run,
        {key: PlannedCall(key, tool.name, CallVerdict.COMMITTED, result_json=recorded, attempts=1)},
    )
    resumed = journal.resume(run.run_id)
    with resumed.node("book"):
        assert resumed.call(tool, {"n": 1}) == {"confirmation": "X1"}
        assert resumed.last_seq == plan.last_seq + 1  # only NODE_STARTED: the recorded call published nothing
        assert resumed.call(tool, {"n": 2}) == {"confirmation": "X2"}  # the next step runs, with a new key
    assert tool.keys == [key, idempotency_key(run.run_id, "book", 2)]


def test_outcome_unknown_reconciled_as_executed_returns_the_provider_result(
    journal: Journal, topics: Settings
) -> None:
    tool = Scripted(reconcile_with=Outcome(executed=True, result={"confirmation": "R9"}))
    run = journal.start_run("tenant-a", "travel", {})
    key = idempotency_key(run.run_id, "", 1)
    hand_over(journal, run, {key: PlannedCall(key, tool.name, CallVerdict.OUTCOME_UNKNOWN, attempts=1)})
    resumed = journal.resume(run.run_id)
    assert resumed.call(tool, {}) == {"confirmation": "R9"}
    assert tool.keys == [] and tool.reconciled == [key]
    last = events_of(read_committed(topics), run.run_id)[-1]
    assert last.type == EventType.TOOL_CALL_RECONCILED and last.epoch == 2
    assert (last.payload["outcome"], last.payload["result_json"]) == ("COMMITTED", '{"confirmation":"R9"}')


def test_outcome_unknown_reconciled_as_not_executed_runs_with_the_same_key(
    journal: Journal, topics: Settings
) -> None:
    tool = Scripted({"confirmation": "N1"}, reconcile_with=Outcome(executed=False))
    run = journal.start_run("tenant-a", "travel", {})
    key = idempotency_key(run.run_id, "", 1)
    hand_over(journal, run, {key: PlannedCall(key, tool.name, CallVerdict.OUTCOME_UNKNOWN, attempts=1)})
    assert journal.resume(run.run_id).call(tool, {}) == {"confirmation": "N1"}
    assert tool.keys == [key]
    tail = events_of(read_committed(topics), run.run_id)[-3:]
    assert [e.type for e in tail] == [
        EventType.TOOL_CALL_RECONCILED,
        EventType.TOOL_CALL_INTENDED,
        EventType.TOOL_CALL_COMMITTED,
    ]
    assert tail[0].payload["outcome"] == "NOT_EXECUTED" and tail[1].payload["attempt"] == 2
    assert {e.payload["idempotency_key"] for e in tail} == {key}


@pytest.mark.parametrize("reconcile_with", ["absent", None], ids=["no-reconcile", "provider-cannot-tell"])
def test_outcome_unknown_that_cannot_be_settled_raises_and_runs_nothing(
    journal: Journal, topics: Settings, reconcile_with: Any
) -> None:
    tool = Scripted({"never": True}, reconcile_with=reconcile_with)
    run = journal.start_run("tenant-a", "travel", {})
    key = idempotency_key(run.run_id, "", 1)
    plan = hand_over(journal, run, {key: PlannedCall(key, tool.name, CallVerdict.OUTCOME_UNKNOWN, attempts=1)})
    resumed = journal.resume(run.run_id)
    with pytest.raises(OutcomeUnknownError) as info:
        resumed.call(tool, {})
    assert (info.value.call_id, info.value.idempotency_key, info.value.tool) == (key, key, tool.name)
    assert tool.keys == [] and resumed.last_seq == plan.last_seq
    resumed.request_approval(info.value.call_id, "outcome unknown", tool=tool.name)
    last = events_of(read_committed(topics), run.run_id)[-1]
    assert last.type == EventType.APPROVAL_REQUESTED and last.payload["call_id"] == key


def test_approval_decides_an_unknown_outcome(journal: Journal) -> None:
    tool = Scripted({"ok": 1})
    run = journal.start_run("tenant-a", "travel", {})
    key = idempotency_key(run.run_id, "", 1)
    unknown = {key: PlannedCall(key, tool.name, CallVerdict.OUTCOME_UNKNOWN, attempts=1)}
    hand_over(journal, run, unknown, {key: ApprovalStatus.DENIED})
    denied = journal.resume(run.run_id)
    with pytest.raises(ApprovalDeniedError):
        denied.call(tool, {})
    hand_over(journal, denied, unknown, {key: ApprovalStatus.GRANTED})
    assert journal.resume(run.run_id).call(tool, {}) == {"ok": 1}
    assert tool.keys == [key]


def test_plan_mismatch_and_missing_or_foreign_plans_are_refused(journal: Journal, topics: Settings) -> None:
    tool = Scripted({"ok": 1})
    run = journal.start_run("tenant-a", "travel", {})
    key = idempotency_key(run.run_id, "", 1)
    hand_over(journal, run, {key: PlannedCall(key, "send_email", CallVerdict.NOT_STARTED)})
    with pytest.raises(PlanMismatchError):
        journal.resume(run.run_id).call(tool, {})
    assert tool.keys == []
    with pytest.raises(NoRecoveryPlanError):
        journal.resume("no-such-run")
    journal.plans.put(RecoveryPlan("r-foreign", "tenant-a", "travel", 2, 5, assigned_to="someone-else"))
    with pytest.raises(NoRecoveryPlanError, match="assigned to someone-else"):
        journal.resume("r-foreign")


def test_assignment_channel_and_owned_set(journal: Journal, topics: Settings) -> None:
    r = redis.Redis.from_url(topics.redis_url, decode_responses=True)
    started = time.monotonic()
    assert journal.claim_assignment(0.2) is None and time.monotonic() - started < 2
    journal.plans.assign("run-a", journal.producer_id)
    journal.plans.assign("run-b", journal.producer_id)
    assert r.smembers(journal.plans.owned_key(journal.producer_id)) >= {"run-a", "run-b"}
    assert journal.claim_assignment(0) == "run-a" and journal.claim_assignment(1.0) == "run-b"

"""Unit tests of the pure reducer (consumers/reducer.py): one test per event type and per rule.

No Kafka, no Redis: events are built in memory with explicit (partition, offset) positions.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from runjournal.model.reducer import (
    DUPLICATE_WINDOW,
    CallStatus,
    Decision,
    NodeStatus,
    ReconciledOutcome,
    RunState,
    RunStatus,
    StateFormatError,
    UnknownCallError,
    WrongRunError,
    apply,
    block,
    fold,
    mark_outcome_unknown,
    state_digest,
    unsettled_calls,
)
from runjournal.schemas.events import Event, EventType

T = EventType
T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
T0_MS = 1772366400000
PARTITION = 3


def tool(call_id: str, name: str = "send_email") -> dict[str, Any]:
    """The four tool-call payload fields shared by every TOOL_CALL_* type."""
    return {
        "call_id": call_id,
        "tool": name,
        "idempotency_key": f"key-{call_id}",
        "args_digest": f"ad-{call_id}",
    }


def intent(call_id: str, **extra: Any) -> dict[str, Any]:
    return {**tool(call_id), "side_effect": True, "attempt": 1, "timeout_ms": 30_000, **extra}


def committed(call_id: str, **extra: Any) -> dict[str, Any]:
    return {
        **tool(call_id),
        "result_digest": f"rd-{call_id}",
        "result_json": f'{{"id":"{call_id}"}}',
        **extra,
    }


def failed(call_id: str, retryable: bool = True) -> dict[str, Any]:
    return {**tool(call_id), "error": "HTTP 503", "retryable": retryable}


class Run:
    """Builds one run's events: consecutive seqs in the current epoch, increasing offsets."""

    def __init__(self, run_id: str = "run-1") -> None:
        self.run_id = run_id
        self.seq = 0
        self.epoch = 1
        self.offset = 100
        self.tick = 0

    def ev(
        self,
        type_: EventType,
        *,
        epoch: int | None = None,
        seq: int | None = None,
        producer: str = "inst-1",
        node_id: str | None = None,
        **payload: Any,
    ) -> tuple[Event, int, int]:
        """Next event with its position; ``seq`` defaults to the next seq (consuming it)."""
        if seq is None:
            self.seq += 1
            seq = self.seq
        self.offset += 2  # other runs' events interleave in the partition
        self.tick += 1
        event = Event(
            event_id=str(uuid.uuid4()),
            run_id=self.run_id,
            tenant_id="tenant-a",
            seq=seq,
            epoch=self.epoch if epoch is None else epoch,
            producer_id=producer,
            type=type_,
            occurred_at=T0 + timedelta(seconds=self.tick),
            payload=payload,
            node_id=node_id,
        )
        return event, PARTITION, self.offset

    def start(self) -> tuple[Event, int, int]:
        return self.ev(T.RUN_STARTED, agent="mailer", input_json='{"to":"x"}', user_id="u-1")

    def resume(self, assigned_to: str = "inst-2") -> tuple[Event, int, int]:
        self.epoch += 1
        return self.ev(
            T.RUN_RESUMED,
            producer="recovery-1",
            previous_epoch=self.epoch - 1,
            recovered_by="recovery-1",
            plan_json='{"nodes":["a"]}',
            assigned_to=assigned_to,
        )


def step(state: RunState | None, positioned: tuple[Event, int, int]) -> RunState:
    event, partition, offset = positioned
    return apply(state, event, partition=partition, offset=offset)


def run_through(*items: tuple[Event, int, int], state: RunState | None = None) -> RunState:
    result = fold(items, state)
    assert result is not None
    return result


# --------------------------------------------------------------------------- happy path


def test_happy_path_two_tool_calls_and_an_approval() -> None:
    r = Run()
    items = [
        r.start(),
        r.ev(T.PLAN_COMPILED, plan_hash="ph", code_version="cv1", nodes=["fetch", "send"]),
        r.ev(T.NODE_STARTED, node_path="fetch", attempt=1),
        r.ev(T.TOOL_CALL_INTENDED, node_id="fetch", **intent("c1")),
        r.ev(T.TOOL_CALL_COMMITTED, node_id="fetch", **committed("c1")),
        r.ev(T.NODE_SUCCEEDED, node_path="fetch", output_digest="od"),
        r.ev(T.NODE_STARTED, node_path="send", attempt=1),
        r.ev(T.APPROVAL_REQUESTED, call_id="c2", reason="sends mail", tool="send_email"),
    ]
    waiting = run_through(*items)
    assert waiting.status is RunStatus.WAITING_APPROVAL
    assert waiting.pending_approvals["c2"].reason == "sends mail"

    state = run_through(
        r.ev(T.APPROVAL_GRANTED, call_id="c2", approver="alice", comment="ok"),
        r.ev(T.TOOL_CALL_INTENDED, node_id="send", **intent("c2")),
        r.ev(T.TOOL_CALL_COMMITTED, node_id="send", **committed("c2")),
        r.ev(T.NODE_SUCCEEDED, node_path="send"),
        r.ev(T.RUN_SUCCEEDED, output_json='{"sent":true}'),
        state=waiting,
    )
    assert state.status is RunStatus.SUCCEEDED
    assert (state.run_id, state.tenant_id, state.agent, state.user_id) == (
        "run-1",
        "tenant-a",
        "mailer",
        "u-1",
    )
    assert (state.epoch, state.last_seq, state.owner) == (1, 13, "inst-1")
    assert (state.applied_partition, state.applied_offset) == (PARTITION, r.offset)
    assert (state.plan_hash, state.code_version, state.plan_nodes) == ("ph", "cv1", ("fetch", "send"))
    assert state.nodes["fetch"].status is NodeStatus.SUCCEEDED and state.nodes["fetch"].output_digest == "od"
    assert state.nodes["send"].attempt == 1
    assert state.pending_approvals == {}
    assert state.approvals["c2"].decision is Decision.GRANTED and state.approvals["c2"].approver == "alice"
    assert state.approvals["c2"].note == "ok"
    for call_id in ("c1", "c2"):
        record = state.records[call_id]
        assert record.status is CallStatus.COMMITTED and record.effect_committed
        assert record.attempts == 1 and record.epoch == 1 and record.committed_by_epoch == 1
        assert record.result_json == f'{{"id":"{call_id}"}}' and record.result_digest == f"rd-{call_id}"
        assert record.idempotency_key == f"key-{call_id}" and record.side_effect is True
        assert record.timeout_ms == 30_000 and not record.zombie
        assert record.intended_offset is not None and record.outcome_offset == record.intended_offset + 2
    assert state.records["c1"].node_id == "fetch"
    assert state.started_at_ms == T0_MS + 1000
    assert state.finished_at_ms == state.updated_at_ms == T0_MS + 13_000
    assert state.output_json == '{"sent":true}'
    assert (state.rejected_stale_epoch, state.duplicates_ignored, state.rejected_after_terminal) == (0, 0, 0)


def test_apply_never_mutates_its_input() -> None:
    r = Run()
    state = run_through(r.start(), r.ev(T.TOOL_CALL_INTENDED, **intent("c1")))
    before = state.to_json()
    step(state, r.ev(T.TOOL_CALL_COMMITTED, **committed("c1")))
    step(state, r.ev(T.NODE_STARTED, node_path="n", attempt=1))
    assert state.to_json() == before


def test_ms_are_floored_exactly() -> None:
    r = Run()
    event, p, o = r.start()
    odd = replace(event, occurred_at=datetime(2026, 3, 1, 12, 0, 0, 999_999, tzinfo=UTC))
    assert apply(None, odd, partition=p, offset=o).started_at_ms == T0_MS + 999


# --------------------------------------------------------------------------- position and duplicates


def test_event_at_or_below_applied_offset_is_identity() -> None:
    r = Run()
    first, second = r.start(), r.ev(T.NODE_STARTED, node_path="n", attempt=1)
    state = run_through(first, second)
    assert step(state, second) is state
    assert step(state, first) is state
    event, partition, offset = second
    assert apply(state, event, partition=partition, offset=offset - 1) is state


def test_redelivered_event_at_new_offset_is_counted_duplicate() -> None:
    r = Run()
    start, node = r.start(), r.ev(T.NODE_STARTED, node_path="n", attempt=1)
    state = run_through(start, node)
    again = apply(state, node[0], partition=PARTITION, offset=r.offset + 50)
    assert again.duplicates_ignored == 1
    assert again.applied_offset == r.offset + 50
    assert replace(again, duplicates_ignored=0, applied_offset=state.applied_offset) == state


def test_duplicate_older_than_the_window_parks_the_run() -> None:
    r = Run()
    start = r.start()
    messages = [r.ev(T.MESSAGE, role="user", content=str(i)) for i in range(DUPLICATE_WINDOW)]
    state = run_through(start, *messages)
    assert len(state.recent_event_ids) == DUPLICATE_WINDOW
    assert start[0].event_id not in state.recent_event_ids
    parked = apply(state, start[0], partition=PARTITION, offset=r.offset + 1)
    assert parked.status is RunStatus.GAP
    assert (parked.gap_expected_seq, parked.gap_seen_seq) == (DUPLICATE_WINDOW + 2, 1)


def test_event_of_another_run_raises() -> None:
    state = run_through(Run().start())
    other = Run("run-2").start()
    with pytest.raises(WrongRunError):
        step(state, other)


# --------------------------------------------------------------------------- first event and gaps


def test_first_event_not_run_started_gives_gap_expecting_seq_1() -> None:
    r = Run()
    r.seq = 4
    state = step(None, r.ev(T.NODE_STARTED, node_path="n", attempt=1))
    assert state.status is RunStatus.GAP
    assert (state.gap_expected_seq, state.gap_seen_seq, state.last_seq) == (1, 5, 0)
    assert state.nodes == {} and state.agent is None
    assert "RUN_STARTED" in (state.gap_reason or "")


def test_run_started_with_epoch_other_than_1_blocks() -> None:
    state = step(None, Run().ev(T.RUN_STARTED, epoch=2, agent="a", input_json="{}"))
    assert state.status is RunStatus.BLOCKED and "epoch 2" in (state.blocked_reason or "")


def test_seq_gap_parks_and_later_events_only_advance_position() -> None:
    r = Run()
    state = run_through(r.start(), r.ev(T.NODE_STARTED, node_path="n", attempt=1))
    r.seq += 1  # seq 3 is lost
    missing_seq = r.seq
    parked = step(state, r.ev(T.NODE_SUCCEEDED, node_path="n"))
    assert parked.status is RunStatus.GAP
    assert (parked.gap_expected_seq, parked.gap_seen_seq) == (3, 4)
    assert parked.last_seq == 2 and parked.nodes == state.nodes
    late = r.ev(T.TOOL_CALL_COMMITTED, seq=missing_seq, **committed("c9"))
    still = step(parked, late)
    assert still.status is RunStatus.GAP and still.records == {}
    assert still.skipped_while_parked == 1 and still.applied_offset == late[2]
    assert replace(still, skipped_while_parked=0, applied_offset=parked.applied_offset) == parked


def test_lower_seq_with_unknown_event_id_parks_as_conflict() -> None:
    r = Run()
    state = run_through(r.start(), r.ev(T.NODE_STARTED, node_path="n", attempt=1))
    parked = step(state, r.ev(T.NODE_STARTED, seq=2, node_path="m", attempt=1))
    assert parked.status is RunStatus.GAP
    assert (parked.gap_expected_seq, parked.gap_seen_seq) == (3, 2)
    assert "conflict" in (parked.gap_reason or "")


# --------------------------------------------------------------------------- epochs and zombies


def test_resume_raises_epoch_sets_owner_and_marks_old_intents_unknown() -> None:
    r = Run()
    state = run_through(r.start(), r.ev(T.TOOL_CALL_INTENDED, **intent("c1")))
    assert state.records["c1"].status is CallStatus.INTENDED
    resumed = step(state, r.resume(assigned_to="inst-7"))
    assert (resumed.epoch, resumed.owner, resumed.status, resumed.last_seq) == (
        2,
        "inst-7",
        RunStatus.RUNNING,
        3,
    )
    assert resumed.plan_json == '{"nodes":["a"]}'
    assert resumed.records["c1"].status is CallStatus.OUTCOME_UNKNOWN
    assert not resumed.records["c1"].zombie
    assert unsettled_calls(resumed) == ("c1",)


def test_resume_without_assigned_to_makes_its_producer_the_owner() -> None:
    r = Run()
    state = run_through(r.start())
    r.epoch = 2
    resumed = step(state, r.ev(T.RUN_RESUMED, producer="inst-9", previous_epoch=1, recovered_by="rec", plan_json="{}"))
    assert resumed.owner == "inst-9"


def test_lower_epoch_node_started_is_rejected_counted_and_takes_no_seq() -> None:
    r = Run()
    state = run_through(r.start(), r.resume())
    zombie = step(state, r.ev(T.NODE_STARTED, epoch=1, seq=3, node_path="z", attempt=1))
    assert zombie.rejected_stale_epoch == 1
    assert zombie.nodes == {} and zombie.last_seq == 2 and zombie.status is RunStatus.RUNNING
    after = step(zombie, r.ev(T.NODE_STARTED, node_path="live", attempt=1))
    assert after.last_seq == 3 and after.nodes["live"].status is NodeStatus.RUNNING


def test_zombie_lower_epoch_commit_is_recorded_as_fact() -> None:
    r = Run()
    state = run_through(r.start(), r.ev(T.TOOL_CALL_INTENDED, **intent("c1")), r.resume())
    zombie = step(state, r.ev(T.TOOL_CALL_COMMITTED, epoch=1, seq=3, **committed("c1")))
    record = zombie.records["c1"]
    assert record.status is CallStatus.COMMITTED and record.zombie
    assert record.committed_by_epoch == 1 and record.result_digest == "rd-c1"
    assert zombie.last_seq == 3 and zombie.epoch == 2 and zombie.rejected_stale_epoch == 0


def test_zombie_failure_is_recorded_but_never_undoes_a_commit() -> None:
    r = Run()
    state = run_through(r.start(), r.ev(T.TOOL_CALL_INTENDED, **intent("c1")), r.resume())
    failed_state = step(state, r.ev(T.TOOL_CALL_FAILED, epoch=1, seq=3, **failed("c1", retryable=False)))
    assert failed_state.records["c1"].status is CallStatus.FAILED and failed_state.records["c1"].zombie
    assert failed_state.records["c1"].retryable is False
    live = run_through(r.ev(T.TOOL_CALL_COMMITTED, **committed("c1")), state=state)
    after_zombie = step(live, r.ev(T.TOOL_CALL_FAILED, epoch=1, seq=4, **failed("c1")))
    assert after_zombie.records == live.records


def test_zombie_failure_of_a_superseded_attempt_leaves_the_newer_attempt_in_flight() -> None:
    r = Run()
    state = run_through(
        r.start(),
        r.ev(T.TOOL_CALL_INTENDED, **intent("c1")),
        r.resume(),
        r.ev(T.TOOL_CALL_RECONCILED, outcome="NOT_EXECUTED", **tool("c1")),
        r.ev(T.TOOL_CALL_INTENDED, **intent("c1", attempt=2)),
    )
    late = step(state, r.ev(T.TOOL_CALL_FAILED, epoch=1, seq=3, **failed("c1")))
    assert late.records == state.records
    assert late.records["c1"].status is CallStatus.INTENDED and late.records["c1"].epoch == 2
    committed_late = step(late, r.ev(T.TOOL_CALL_COMMITTED, epoch=1, seq=4, **committed("c1")))
    assert committed_late.records["c1"].status is CallStatus.COMMITTED and committed_late.records["c1"].zombie


def test_zombie_intent_is_rejected_but_recorded_as_outcome_unknown() -> None:
    r = Run()
    state = run_through(r.start(), r.resume())
    zombie = step(state, r.ev(T.TOOL_CALL_INTENDED, epoch=1, seq=3, **intent("c5")))
    record = zombie.records["c5"]
    assert zombie.rejected_stale_epoch == 1 and zombie.last_seq == 2
    assert record.status is CallStatus.OUTCOME_UNKNOWN and record.zombie and record.epoch == 1
    assert record.attempts == 1 and record.intended_offset == r.offset


def test_zombie_outcome_for_unknown_call_creates_the_record() -> None:
    r = Run()
    state = run_through(r.start(), r.resume())
    zombie = step(state, r.ev(T.TOOL_CALL_COMMITTED, epoch=1, seq=3, **committed("c8")))
    record = zombie.records["c8"]
    assert record.status is CallStatus.COMMITTED and record.attempts == 0 and record.intended_offset is None
    assert record.side_effect is None and record.zombie


def test_zombie_message_changes_only_position() -> None:
    r = Run()
    state = run_through(r.start(), r.resume())
    zombie = step(state, r.ev(T.MESSAGE, epoch=1, seq=3, role="assistant", content="I sent it"))
    assert zombie.rejected_stale_epoch == 0 and zombie.last_seq == 2
    assert replace(zombie, applied_offset=state.applied_offset, recent_event_ids=state.recent_event_ids) == state


def test_higher_epoch_without_resume_parks_as_epoch_ahead() -> None:
    r = Run()
    state = run_through(r.start())
    parked = step(state, r.ev(T.NODE_STARTED, epoch=2, node_path="n", attempt=1))
    assert parked.status is RunStatus.GAP and parked.epoch == 1
    assert (parked.gap_expected_seq, parked.gap_seen_seq) == (2, 2)
    assert "epoch ahead" in (parked.gap_reason or "")


def test_resume_not_raising_the_epoch_blocks() -> None:
    r = Run()
    state = run_through(r.start())
    blocked = step(state, r.ev(T.RUN_RESUMED, previous_epoch=1, recovered_by="rec", plan_json="{}"))
    assert blocked.status is RunStatus.BLOCKED and blocked.epoch == 1
    assert "does not raise the epoch" in (blocked.blocked_reason or "")


def test_resume_whose_seq_collides_with_unseen_zombie_events_parks() -> None:
    r = Run()
    state = run_through(r.start())
    zombie_first = step(state, r.ev(T.NODE_STARTED, node_path="z", attempt=1))  # seq 2, epoch 1, unfenced
    r.seq = 1  # recovery only saw seq 1
    parked = step(zombie_first, r.resume())
    assert parked.status is RunStatus.GAP and (parked.gap_expected_seq, parked.gap_seen_seq) == (3, 2)


def test_resume_while_approval_pending_waits_for_approval() -> None:
    r = Run()
    state = run_through(r.start(), r.ev(T.APPROVAL_REQUESTED, call_id="c1", reason="r"), r.resume())
    assert state.status is RunStatus.WAITING_APPROVAL


# --------------------------------------------------------------------------- tool calls


def test_retry_after_failure_counts_attempts_and_clears_the_failure() -> None:
    r = Run()
    state = run_through(
        r.start(),
        r.ev(T.TOOL_CALL_INTENDED, **intent("c1")),
        r.ev(T.TOOL_CALL_FAILED, **failed("c1")),
    )
    assert state.records["c1"].status is CallStatus.FAILED and state.records["c1"].error == "HTTP 503"
    retried = step(state, r.ev(T.TOOL_CALL_INTENDED, **intent("c1", attempt=2)))
    record = retried.records["c1"]
    assert (record.status, record.attempts, record.error, record.retryable) == (
        CallStatus.INTENDED,
        2,
        None,
        None,
    )
    assert record.intended_offset == r.offset and record.outcome_offset is None
    done = step(retried, r.ev(T.TOOL_CALL_COMMITTED, **committed("c1")))
    assert done.records["c1"].status is CallStatus.COMMITTED and done.records["c1"].attempts == 2


def test_reintent_of_a_committed_call_keeps_the_commit() -> None:
    r = Run()
    state = run_through(
        r.start(), r.ev(T.TOOL_CALL_INTENDED, **intent("c1")), r.ev(T.TOOL_CALL_COMMITTED, **committed("c1"))
    )
    again = step(state, r.ev(T.TOOL_CALL_INTENDED, **intent("c1")))
    assert again.records["c1"].status is CallStatus.COMMITTED and again.records["c1"].attempts == 2
    assert again.records["c1"].result_json == state.records["c1"].result_json


def test_first_commit_wins() -> None:
    r = Run()
    state = run_through(
        r.start(), r.ev(T.TOOL_CALL_INTENDED, **intent("c1")), r.ev(T.TOOL_CALL_COMMITTED, **committed("c1"))
    )
    second = step(state, r.ev(T.TOOL_CALL_COMMITTED, **committed("c1", result_digest="other")))
    assert second.records == state.records and second.last_seq == state.last_seq + 1


@pytest.mark.parametrize("outcome", list(ReconciledOutcome))
def test_reconcile_settles_an_unknown_outcome(outcome: ReconciledOutcome) -> None:
    r = Run()
    state = run_through(r.start(), r.ev(T.TOOL_CALL_INTENDED, **intent("c1")), r.resume())
    settled = step(state, r.ev(T.TOOL_CALL_RECONCILED, outcome=outcome.value, result_digest="rd", **tool("c1")))
    record = settled.records["c1"]
    assert record.status is CallStatus.RECONCILED and record.reconciled_outcome is outcome
    assert record.effect_committed is (outcome is ReconciledOutcome.COMMITTED)
    assert record.result_digest == ("rd" if outcome is ReconciledOutcome.COMMITTED else None)
    assert unsettled_calls(settled) == ()


def test_not_executed_may_run_again() -> None:
    r = Run()
    state = run_through(
        r.start(),
        r.ev(T.TOOL_CALL_INTENDED, **intent("c1")),
        r.resume(),
        r.ev(T.TOOL_CALL_RECONCILED, outcome="NOT_EXECUTED", **tool("c1")),
        r.ev(T.TOOL_CALL_INTENDED, **intent("c1")),
    )
    record = state.records["c1"]
    assert (record.status, record.attempts, record.epoch, record.reconciled_outcome) == (
        CallStatus.INTENDED,
        2,
        2,
        None,
    )


def test_zombie_commit_after_not_executed_reconcile_wins() -> None:
    r = Run()
    state = run_through(
        r.start(),
        r.ev(T.TOOL_CALL_INTENDED, **intent("c1")),
        r.resume(),
        r.ev(T.TOOL_CALL_RECONCILED, outcome="NOT_EXECUTED", **tool("c1")),
    )
    late = step(state, r.ev(T.TOOL_CALL_COMMITTED, epoch=1, seq=3, **committed("c1")))
    record = late.records["c1"]
    assert record.status is CallStatus.COMMITTED and record.zombie
    assert record.reconciled_outcome is ReconciledOutcome.NOT_EXECUTED


def test_reconcile_contradicting_a_commit_is_noted_not_applied() -> None:
    r = Run()
    state = run_through(
        r.start(), r.ev(T.TOOL_CALL_INTENDED, **intent("c1")), r.ev(T.TOOL_CALL_COMMITTED, **committed("c1"))
    )
    noted = step(state, r.ev(T.TOOL_CALL_RECONCILED, outcome="NOT_EXECUTED", **tool("c1")))
    assert noted.records["c1"].status is CallStatus.COMMITTED
    assert noted.records["c1"].reconciled_outcome is ReconciledOutcome.NOT_EXECUTED


def test_unknown_reconcile_outcome_blocks() -> None:
    r = Run()
    state = run_through(r.start(), r.ev(T.TOOL_CALL_INTENDED, **intent("c1")))
    blocked = step(state, r.ev(T.TOOL_CALL_RECONCILED, outcome="MAYBE", **tool("c1")))
    assert blocked.status is RunStatus.BLOCKED and "MAYBE" in (blocked.blocked_reason or "")
    assert blocked.records == state.records and blocked.last_seq == state.last_seq


def test_missing_required_payload_field_blocks_with_offset() -> None:
    r = Run()
    state = run_through(r.start())
    bad = r.ev(T.TOOL_CALL_INTENDED, **tool("c1"))  # no side_effect / attempt / timeout_ms
    blocked = step(state, bad)
    assert blocked.status is RunStatus.BLOCKED
    assert "side_effect" in (blocked.blocked_reason or "") and f"offset {bad[2]}" in (blocked.blocked_reason or "")
    assert blocked.records == {}


def test_second_run_started_blocks() -> None:
    r = Run()
    state = run_through(r.start(), r.ev(T.RUN_STARTED, agent="a", input_json="{}"))
    assert state.status is RunStatus.BLOCKED and state.last_seq == 1


# --------------------------------------------------------------------------- nodes and approvals


def test_node_failure_and_retry() -> None:
    r = Run()
    state = run_through(
        r.start(),
        r.ev(T.NODE_STARTED, node_path="a/b", attempt=1),
        r.ev(T.NODE_FAILED, node_path="a/b", error="boom", retryable=True),
    )
    node = state.nodes["a/b"]
    assert (node.status, node.attempt, node.error, node.retryable) == (NodeStatus.FAILED, 1, "boom", True)
    retried = step(state, r.ev(T.NODE_STARTED, node_path="a/b", attempt=2))
    assert retried.nodes["a/b"].status is NodeStatus.RUNNING and retried.nodes["a/b"].attempt == 2
    assert retried.nodes["a/b"].error is None


def test_run_waits_until_every_pending_approval_is_decided() -> None:
    r = Run()
    state = run_through(
        r.start(),
        r.ev(T.APPROVAL_REQUESTED, call_id="c1", reason="r1"),
        r.ev(T.APPROVAL_REQUESTED, call_id="c2", reason="r2", tool="pay"),
        r.ev(T.APPROVAL_DENIED, call_id="c1", approver="bob", reason="no"),
    )
    assert state.status is RunStatus.WAITING_APPROVAL and list(state.pending_approvals) == ["c2"]
    assert state.approvals["c1"].decision is Decision.DENIED and state.approvals["c1"].note == "no"
    done = step(state, r.ev(T.APPROVAL_GRANTED, call_id="c2", approver="bob"))
    assert done.status is RunStatus.RUNNING and done.pending_approvals == {}


def test_a_new_request_supersedes_an_earlier_decision() -> None:
    r = Run()
    state = run_through(
        r.start(),
        r.ev(T.APPROVAL_REQUESTED, call_id="c1", reason="r1"),
        r.ev(T.APPROVAL_DENIED, call_id="c1", approver="bob"),
        r.ev(T.APPROVAL_REQUESTED, call_id="c1", reason="again"),
    )
    assert "c1" not in state.approvals and state.pending_approvals["c1"].reason == "again"


# --------------------------------------------------------------------------- transcripts


@pytest.mark.parametrize("type_", [T.MESSAGE, T.USER_CORRECTION])
def test_transcript_events_only_consume_seq(type_: EventType) -> None:
    r = Run()
    state = run_through(r.start(), r.ev(T.TOOL_CALL_INTENDED, **intent("c1")))
    payload = (
        {"role": "assistant", "content": "email c1 was sent"}
        if type_ is T.MESSAGE
        else {"subject": "c1", "text": "it was sent, do not resend"}
    )
    after = step(state, r.ev(type_, **payload))
    assert after.last_seq == state.last_seq + 1
    assert after.records["c1"].status is CallStatus.INTENDED
    assert (
        replace(
            after,
            last_seq=state.last_seq,
            applied_offset=state.applied_offset,
            recent_event_ids=state.recent_event_ids,
        )
        == state
    )


# --------------------------------------------------------------------------- terminal


@pytest.mark.parametrize(
    ("terminal", "payload", "status"),
    [
        (T.RUN_SUCCEEDED, {"output_json": "1"}, RunStatus.SUCCEEDED),
        (T.RUN_FAILED, {"error": "bad"}, RunStatus.FAILED),
        (T.RUN_CANCELLED, {"reason": "user"}, RunStatus.CANCELLED),
    ],
)
def test_after_terminal_outcomes_are_recorded_and_control_flow_is_ignored(
    terminal: EventType, payload: dict[str, Any], status: RunStatus
) -> None:
    r = Run()
    state = run_through(r.start(), r.ev(T.TOOL_CALL_INTENDED, **intent("c1")), r.ev(terminal, **payload))
    assert state.status is status and state.terminal and state.finished_at_ms is not None
    assert state.error == payload.get("error", payload.get("reason"))
    late = [r.ev(T.TOOL_CALL_COMMITTED, **committed("c1")), r.ev(T.NODE_STARTED, node_path="late", attempt=1),
            r.ev(T.TOOL_CALL_INTENDED, **intent("c2")), r.ev(T.RUN_FAILED, error="later")]
    if status is not RunStatus.FAILED:  # RUN_RESUMED reopens a FAILED run only (continuing it)
        late.append(r.resume())
    after = run_through(*late, state=state)
    assert after.status is status and after.epoch == 1 and after.last_seq == state.last_seq + len(late)
    assert after.records["c1"].status is CallStatus.COMMITTED
    assert after.records["c2"].status is CallStatus.OUTCOME_UNKNOWN  # nobody reports it in an ended run
    assert after.nodes == {} and after.rejected_after_terminal == len(late) - 1
    assert after.error == state.error and after.finished_at_ms == state.finished_at_ms


@pytest.mark.parametrize("terminal", [T.RUN_SUCCEEDED, T.RUN_FAILED, T.RUN_CANCELLED])
def test_a_run_that_ends_with_an_intent_and_no_outcome_leaves_it_unknown(terminal: EventType) -> None:
    r = Run()
    payload = {T.RUN_SUCCEEDED: {"output_json": "1"}, T.RUN_FAILED: {"error": "e"}}.get(terminal, {"reason": "r"})
    state = run_through(r.start(), r.ev(T.TOOL_CALL_INTENDED, **intent("c1")),
                        r.ev(T.TOOL_CALL_INTENDED, **intent("c2")), r.ev(T.TOOL_CALL_COMMITTED, **committed("c2")),
                        r.ev(terminal, **payload))
    assert state.records["c1"].status is CallStatus.OUTCOME_UNKNOWN
    assert state.records["c2"].status is CallStatus.COMMITTED


def test_run_resumed_continues_a_failed_run_but_not_a_succeeded_one() -> None:
    r = Run()
    failed = run_through(r.start(), r.ev(T.TOOL_CALL_INTENDED, **intent("c1")),
                         r.ev(T.TOOL_CALL_COMMITTED, **committed("c1")), r.ev(T.RUN_FAILED, error="boom"))
    continued = step(failed, r.resume())
    assert (continued.status, continued.epoch, continued.error, continued.finished_at_ms) == (
        RunStatus.RUNNING, 2, None, None)
    assert continued.records["c1"].status is CallStatus.COMMITTED and continued.rejected_after_terminal == 0
    done = run_through(r.ev(T.RUN_SUCCEEDED, output_json="1"), state=continued)
    assert done.status is RunStatus.SUCCEEDED and done.epoch == 2
    ignored = step(done, r.resume())
    assert ignored.status is RunStatus.SUCCEEDED and ignored.epoch == 2 and ignored.rejected_after_terminal == 1


# --------------------------------------------------------------------------- block


def test_block_from_nothing_and_on_a_running_run() -> None:
    fresh = block(None, "run-1", "UnsupportedSchemaError: v9", partition=PARTITION, offset=7)
    assert fresh.status is RunStatus.BLOCKED and fresh.tenant_id is None
    assert fresh.blocked_reason == f"UnsupportedSchemaError: v9 (partition {PARTITION} offset 7)"
    r = Run()
    state = run_through(r.start())
    blocked = block(state, "run-1", "bad bytes", partition=PARTITION, offset=r.offset + 1)
    assert blocked.status is RunStatus.BLOCKED and blocked.applied_offset == r.offset + 1
    assert block(blocked, "run-1", "again", partition=PARTITION, offset=r.offset + 1) is blocked
    later = block(blocked, "run-1", "again", partition=PARTITION, offset=r.offset + 5)
    assert later.blocked_reason == blocked.blocked_reason and later.skipped_while_parked == 1
    assert step(later, r.ev(T.NODE_STARTED, node_path="n", attempt=1)).nodes == {}
    with pytest.raises(WrongRunError):
        block(state, "run-2", "x", partition=PARTITION, offset=999)


def test_block_on_a_gap_keeps_gap_and_adds_the_reason() -> None:
    r = Run()
    r.seq = 3
    gap = step(None, r.ev(T.NODE_STARTED, node_path="n", attempt=1))
    blocked = block(gap, "run-1", "bad", partition=PARTITION, offset=r.offset + 1)
    assert blocked.status is RunStatus.GAP and blocked.blocked_reason is not None


# --------------------------------------------------------------------------- recovery helpers, replay


def test_mark_outcome_unknown_only_touches_intended_records() -> None:
    r = Run()
    state = run_through(
        r.start(),
        r.ev(T.TOOL_CALL_INTENDED, **intent("c1")),
        r.ev(T.TOOL_CALL_INTENDED, **intent("c2")),
        r.ev(T.TOOL_CALL_COMMITTED, **committed("c2")),
    )
    marked = mark_outcome_unknown(state, ["c1", "c2"])
    assert marked.records["c1"].status is CallStatus.OUTCOME_UNKNOWN
    assert marked.records["c2"] is state.records["c2"]
    assert (marked.last_seq, marked.applied_offset) == (state.last_seq, state.applied_offset)
    assert mark_outcome_unknown(marked, ["c1", "c2"]) is marked
    with pytest.raises(UnknownCallError):
        mark_outcome_unknown(state, ["nope"])


def test_fold_until_seq_replays_the_past_without_later_zombie_facts() -> None:
    r = Run()
    items = [
        r.start(),
        r.ev(T.TOOL_CALL_INTENDED, **intent("c1")),
        r.resume(),
        r.ev(T.TOOL_CALL_COMMITTED, epoch=1, seq=3, **committed("c1")),
        r.ev(T.NODE_STARTED, node_path="n", attempt=1),
    ]
    at_3 = fold(items, until_seq=3)
    assert at_3 is not None and at_3.last_seq == 3
    assert at_3.records["c1"].status is CallStatus.OUTCOME_UNKNOWN
    assert at_3 == fold(items[:3])
    assert fold(items, until_seq=99) == fold(items)
    assert fold([]) is None


# --------------------------------------------------------------------------- JSON


def test_to_json_is_compact_sorted_and_round_trips() -> None:
    r = Run()
    state = run_through(
        r.start(),
        r.ev(T.PLAN_COMPILED, plan_hash="ph", code_version="cv", nodes=["a"]),
        r.ev(T.NODE_STARTED, node_path="a", attempt=1),
        r.ev(T.TOOL_CALL_INTENDED, **intent("c1")),
        r.ev(T.APPROVAL_REQUESTED, call_id="c1", reason="why", tool="send_email"),
        r.ev(T.APPROVAL_GRANTED, call_id="c1", approver="a"),
        r.ev(T.TOOL_CALL_RECONCILED, outcome="COMMITTED", result_digest="x", **tool("c1")),
    )
    text = state.to_json()
    data = json.loads(text)
    assert text == json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert data["v"] == 1
    assert data["records"]["c1"]["status"] == "RECONCILED"
    back = RunState.from_json(text)
    assert back == state and state_digest(back) == state_digest(state)
    assert RunState.from_json(text.encode()) == state


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.update(v=2),
        lambda d: d.pop("v"),
        lambda d: d.update(surprise=1),
        lambda d: d.pop("epoch"),
        lambda d: d.update(status="NAPPING"),
        lambda d: d["records"]["c1"].pop("attempts"),
        lambda d: d["records"]["c1"].update(status="DONE"),
    ],
)
def test_from_json_refuses_what_it_cannot_read(mutate: Any) -> None:
    r = Run()
    state = run_through(r.start(), r.ev(T.TOOL_CALL_INTENDED, **intent("c1")))
    data = json.loads(state.to_json())
    mutate(data)
    with pytest.raises(StateFormatError):
        RunState.from_json(json.dumps(data))


@pytest.mark.parametrize("text", ["not json", "[]", "null"])
def test_from_json_refuses_non_objects(text: str) -> None:
    with pytest.raises(StateFormatError):
        RunState.from_json(text)


def test_digest_changes_with_any_field() -> None:
    state = run_through(Run().start())
    assert state_digest(state) != state_digest(replace(state, duplicates_ignored=1))
    assert len(state_digest(state)) == 64


# --------------------------------------------------------------------------- operator controls (issue 31, v5)


def test_a_paused_resume_holds_the_run_for_nobody_and_a_later_resume_gives_it_an_owner_again() -> None:
    """docs/design/decisions/0047-operator-controls.md: a pause is a RUN_RESUMED with ``paused`` — no owner, status
    PAUSED, the operator and why recorded; not live (never an orphan), not ended; a later RUN_RESUMED resumes it."""
    from runjournal.consumers.projector.store import live_entry

    r = Run()
    state = run_through(r.start(), r.ev(T.TOOL_CALL_INTENDED, **intent("c1")))
    r.epoch += 1
    paused = step(state, r.ev(T.RUN_RESUMED, producer="recovery", previous_epoch=1, recovered_by="rec",
                              plan_json="{}", assigned_to=None, requested_by="ops@h", request_reason="budget",
                              request_id="p-1", paused=True))
    assert (paused.status, paused.owner, paused.epoch) == (RunStatus.PAUSED, None, 2)
    assert (paused.requested_by, paused.request_reason, paused.paused_at_ms) == ("ops@h", "budget",
                                                                                paused.updated_at_ms)
    assert not paused.terminal and not paused.parked and live_entry(paused) == ""
    assert paused.records["c1"].status is CallStatus.OUTCOME_UNKNOWN  # reconciled by whoever resumes it
    resumed = step(paused, r.resume(assigned_to="inst-3"))
    assert (resumed.status, resumed.owner, resumed.epoch, resumed.paused_at_ms) == (RunStatus.RUNNING, "inst-3", 3,
                                                                                   None)
    assert live_entry(resumed) == "3:inst-3"


def test_an_operators_cancel_records_who_and_why_and_a_resume_after_it_is_ignored() -> None:
    r = Run()
    state = run_through(r.start(), r.ev(T.RUN_CANCELLED, reason="runaway loop", requested_by="ops@h",
                                        request_id="c-1"))
    assert (state.status, state.error, state.requested_by) == (RunStatus.CANCELLED, "runaway loop", "ops@h")
    again = step(state, r.resume())
    assert again.status is RunStatus.CANCELLED and again.rejected_after_terminal == 1

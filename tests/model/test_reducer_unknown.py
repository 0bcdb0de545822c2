"""The reducer meets a newer writer's event type (decoded as UNKNOWN): recorded, counted, passed over — or,
when the reader declares that type critical, the run is BLOCKED with a reason naming the fix."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from runjournal.model.reducer import RunState, RunStatus, apply, fold
from runjournal.schemas import EventCodec, InvalidEventError
from runjournal.schemas.events import CONTROL_FLOW_TYPES, KNOWN_TYPES, Event, EventType

T = EventType
_AT = datetime(2026, 1, 1, tzinfo=UTC)


def _ev(seq: int, etype: EventType, payload: dict[str, Any], *, epoch: int = 1) -> Event:
    return Event(event_id=str(uuid.uuid4()), run_id="r", tenant_id="t", seq=seq, epoch=epoch, producer_id="p",
                 type=etype, occurred_at=_AT + timedelta(seconds=seq), payload=payload)


def _unknown(seq: int, symbol: str = "NODE_HEARTBEAT", *, epoch: int = 1) -> Event:
    return _ev(seq, T.UNKNOWN, {"type": symbol, "fields": {"node_path": "main"}}, epoch=epoch)


def _run(*middle: Event, finish: bool = True) -> list[Event]:
    events = [_ev(1, T.RUN_STARTED, {"agent": "a", "input_json": "{}"}), *middle]
    if finish:
        events.append(_ev(len(events) + 1, T.RUN_SUCCEEDED, {"output_json": None}))
    return events


def _fold(events: list[Event], **kwargs: Any) -> RunState:
    state = fold(((e, 0, i) for i, e in enumerate(events)), **kwargs)
    assert state is not None
    return state


def test_unknown_type_is_counted_and_the_run_goes_on() -> None:
    state = _fold(_run(_unknown(2), _unknown(3, "BUDGET_SET"), _unknown(4)))
    assert state.status is RunStatus.SUCCEEDED and state.last_seq == 5
    assert state.unknown_events == {"NODE_HEARTBEAT": 2, "BUDGET_SET": 1}


def test_unknown_type_after_terminal_is_counted_too() -> None:
    state = _fold([*_run(), _unknown(3)])
    assert state.status is RunStatus.SUCCEEDED and state.last_seq == 3 and state.unknown_events == {
        "NODE_HEARTBEAT": 1}


@pytest.mark.parametrize("critical", [frozenset({"NODE_HEARTBEAT"}), frozenset({"*"})])
def test_declared_critical_blocks_with_a_reason(critical: frozenset[str]) -> None:
    state = _fold(_run(_unknown(2)), critical=critical)
    assert state.status is RunStatus.BLOCKED and state.last_seq == 1
    reason = state.blocked_reason or ""
    assert "NODE_HEARTBEAT" in reason and "critical" in reason and "offset 1" in reason
    assert "--rebuild" in reason and state.skipped_while_parked == 1


def test_a_critical_set_naming_other_types_does_not_block() -> None:
    state = _fold(_run(_unknown(2)), critical=frozenset({"BUDGET_SET"}))
    assert state.status is RunStatus.SUCCEEDED and state.unknown_events == {"NODE_HEARTBEAT": 1}


def test_unknown_type_still_obeys_seq_and_epoch() -> None:
    gap = _fold(_run(_unknown(3), finish=False))
    assert gap.status is RunStatus.GAP and gap.gap_expected_seq == 2
    ahead = _fold(_run(_unknown(2, epoch=2), finish=False))
    assert ahead.status is RunStatus.GAP and "epoch ahead" in (ahead.gap_reason or "")
    state = _fold(_run(finish=False))
    stale = apply(state.__class__(**{**state.__dict__, "epoch": 2}), _unknown(2, epoch=1), partition=0, offset=9)
    assert stale.last_seq == 1 and stale.unknown_events == {}  # a zombie's unknown event: ignored


def test_unknown_is_read_only_and_not_control_flow() -> None:
    assert T.UNKNOWN not in KNOWN_TYPES and T.UNKNOWN not in CONTROL_FLOW_TYPES
    with pytest.raises(InvalidEventError, match="read-only"):
        EventCodec().encode(_unknown(2))


def test_state_json_round_trips_and_reads_states_written_before_the_field() -> None:
    state = _fold(_run(_unknown(2)))
    assert RunState.from_json(state.to_json()) == state
    old = json.loads(state.to_json())
    del old["unknown_events"]  # a state a projector wrote before this field existed
    assert RunState.from_json(json.dumps(old)).unknown_events == {}

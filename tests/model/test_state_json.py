"""The run state's canonical JSON is written by orjson and must stay byte for byte what ``json.dumps`` wrote.

``state_digest`` hashes it, Redis holds it, snapshots written before the switch are compared with states folded
after it: any text the journal can carry (control characters, U+2028, astral planes, quotes, backslashes) and
any integer an Avro long holds must serialise exactly as ``json.dumps(sort_keys=True, separators=(",", ":"),
ensure_ascii=False)`` does.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from runjournal.model.reducer import RunState, _state_to_dict, apply, state_digest
from runjournal.schemas.events import Event, EventType

T0 = datetime(2026, 3, 1, tzinfo=UTC)
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
LONG = st.integers(min_value=0, max_value=2**63 - 1)


def _reference(state: RunState) -> bytes:
    """What RunState.to_json wrote before orjson (json.dumps, canonical options), UTF-8."""
    return json.dumps(_state_to_dict(state), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _event(seq: int, etype: EventType, payload: dict[str, object], event_id: str, node: str | None = None) -> Event:
    return Event(event_id=event_id, run_id="run-j", tenant_id="t", seq=seq, epoch=1, producer_id="p", type=etype,
                 occurred_at=T0 + timedelta(milliseconds=seq), payload=payload, node_id=node)


@settings(max_examples=150, deadline=None)
@given(agent=TEXT, input_json=TEXT, call_id=TEXT, tool=TEXT, result=TEXT, error=TEXT, node=TEXT, offset=LONG,
       symbol=TEXT)
def test_orjson_state_bytes_equal_json_dumps(agent: str, input_json: str, call_id: str, tool: str, result: str,
                                             error: str, node: str, offset: int, symbol: str) -> None:
    tool_fields = {"call_id": call_id, "tool": tool, "idempotency_key": f"k{call_id}", "args_digest": "d"}
    events = [
        _event(1, EventType.RUN_STARTED, {"agent": agent, "input_json": input_json}, "e1"),
        _event(2, EventType.NODE_STARTED, {"node_path": node, "attempt": 1}, "e2"),
        _event(3, EventType.TOOL_CALL_INTENDED, {**tool_fields, "side_effect": True, "attempt": 1,
                                                 "timeout_ms": 30_000}, "e3", node),
        _event(4, EventType.TOOL_CALL_COMMITTED, {**tool_fields, "result_json": result, "result_digest": "r"}, "e4"),
        _event(5, EventType.NODE_FAILED, {"node_path": node, "error": error, "retryable": False}, "e5"),
        _event(6, EventType.APPROVAL_REQUESTED, {"call_id": call_id, "reason": error, "tool": tool}, "e6"),
        _event(7, EventType.UNKNOWN, {"type": symbol, "fields": {}}, "e7"),
        _event(8, EventType.RUN_FAILED, {"error": error}, "e8"),
    ]
    state = None
    for i, event in enumerate(events):
        state = apply(state, event, partition=2, offset=offset - len(events) + i if offset >= len(events) else i)
        assert state.to_json_bytes() == _reference(state)
        assert state.to_json().encode() == _reference(state)
    assert state is not None
    back = RunState.from_json(state.to_json_bytes())
    assert back == state and state_digest(back) == state_digest(state)


def test_a_blocked_state_with_a_reason_of_every_escape_class() -> None:
    text = "\x00\x01\x1f\"\\/\x7f\u2028\u2029é€😀\ufeff\t\n\r\b\f"
    state = apply(None, _event(1, EventType.RUN_STARTED, {"agent": text, "input_json": text}, text),
                  partition=0, offset=0)
    assert state.to_json_bytes() == _reference(state)

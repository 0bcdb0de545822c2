"""Round-trip properties (hypothesis) over every event type, for both envelope versions."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from io import BytesIO
from typing import Any

from fastavro import schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runjournal.schemas import KNOWN_TYPES, PAYLOAD_FIELDS, Event, EventCodec, EventType, load_versions
from runjournal.schemas.versions import payload_record_name

CODEC = EventCodec()
V1, V2, *_, CURRENT = load_versions()

# -- properties: every type, both versions ----------------------------------------------------

_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
_INT32 = st.integers(0, 2**31 - 2)


def _value(name: str, py: type) -> st.SearchStrategy[Any]:
    if py is bool:
        return st.booleans()
    if py is int:
        return st.integers(0, 2**62) if name in ("timeout_ms", "resume_at_ms") else _INT32
    if py is list:
        return st.lists(_TEXT, max_size=5)
    return _TEXT


def _payload(etype: EventType) -> st.SearchStrategy[dict[str, Any]]:
    fields = {
        name: _value(name, py) if required else st.none() | _value(name, py)
        for name, (py, required) in PAYLOAD_FIELDS[etype].items()
    }
    return st.fixed_dictionaries(fields)


_WHEN = st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1)).map(
    lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000, tzinfo=UTC)
)


@st.composite
def events(draw: st.DrawFn) -> Event:
    etype = draw(st.sampled_from(KNOWN_TYPES))
    return Event(
        event_id=draw(_TEXT),
        run_id=draw(_TEXT),
        tenant_id=draw(_TEXT),
        seq=draw(st.integers(1, 2**63 - 1)),
        epoch=draw(st.integers(1, 2**31 - 1)),
        producer_id=draw(_TEXT),
        type=etype,
        occurred_at=draw(_WHEN),
        payload=draw(_payload(etype)),
        node_id=draw(st.none() | _TEXT),
        traceparent=draw(st.none() | _TEXT),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events())
def test_current_round_trip_every_type(event: Event) -> None:
    value = CODEC.encode(event)
    assert value[:10] == CURRENT.header
    assert CODEC.decode(value) == event


_ADDED_AFTER_V1 = {"APPROVAL_REQUESTED": ("scope_call_id", "scope_attempt", "args_json"),  # v3, v4: null for older
                   "RUN_RESUMED": ("requested_by", "request_reason", "request_id", "paused", "resume_at_ms",
                                   "waiting_for"),  # v5
                   "RUN_CANCELLED": ("requested_by", "request_id"),  # v5
                   "RUN_STARTED": ("forked_from", "forked_at_seq", "fork_lineage", "requested_by",
                                   "request_reason")}  # v5


def _v1_expected(symbol: str, payload: dict[str, Any]) -> dict[str, Any]:
    out = dict(payload)
    for name in _ADDED_AFTER_V1.get(symbol, ()):
        out[name] = None
    if symbol in ("NODE_STARTED", "TOOL_CALL_INTENDED"):
        out["attempt"] = payload["attempt"] + 1
    if symbol == "TOOL_CALL_INTENDED":
        out["timeout_ms"] = out.pop("timeout_s") * 1000
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events(), st.integers(0, 2**31 - 1))
def test_v1_bytes_decode_to_the_current_shape(event: Event, timeout_s: int) -> None:
    symbol = event.type.value
    payload = dict(event.payload)
    if symbol == "TOOL_CALL_INTENDED":
        payload["timeout_s"] = timeout_s
        del payload["timeout_ms"]
    record = {
        "event_id": event.event_id,
        "run_id": event.run_id,
        "tenant_id": event.tenant_id,
        "seq": event.seq,
        "epoch": event.epoch,
        "instance_id": event.producer_id,
        "type": symbol,
        "occurred_at": event.occurred_at,
        "node_id": event.node_id,
        "payload": (payload_record_name(symbol), payload),
    }
    buf = BytesIO()
    schemaless_writer(buf, V1.parsed, record)
    decoded = CODEC.decode(V1.header + buf.getvalue())
    expected = dataclasses.replace(event, traceparent=None, payload=_v1_expected(symbol, payload))
    assert decoded == expected

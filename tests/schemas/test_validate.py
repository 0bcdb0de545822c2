"""The codec checks every Avro value against its type and range before writing; the error names the field.

A table of refusals per Avro type (envelope and payload), the generic validator on the types the envelope
does not use (float, bytes, enum, map, fixed, logical types), and a property: every int the validator lets
into an Avro ``int`` / ``long`` field is written and read back unchanged by fastavro, and every other int
is refused by name.
"""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from io import BytesIO
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from runjournal.schemas import Event, EventCodec, EventType, InvalidEventError
from runjournal.schemas._validate import INT_RANGE, LONG_RANGE, RecordValidator

CODEC = EventCodec()
AT = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def event(etype: EventType = EventType.NODE_STARTED, payload: dict[str, Any] | None = None, **envelope: Any) -> Event:
    fields: dict[str, Any] = {"event_id": str(uuid.uuid4()), "run_id": "r", "tenant_id": "t", "seq": 2, "epoch": 1,
                              "producer_id": "p", "type": etype, "occurred_at": AT}
    fields.update(envelope)
    return Event(**fields, payload=payload if payload is not None else {"node_path": "n", "attempt": 1})


@pytest.mark.parametrize(("bad", "field"), [
    (event(payload={"node_path": "n", "attempt": 2**31}), "payload.attempt"),
    (event(payload={"node_path": "n", "attempt": -(2**31) - 1}), "payload.attempt"),
    (event(epoch=2**31), "epoch"),
    (event(seq=2**63), "seq"),
    (event(seq=True), "seq"),
    (event(payload={"node_path": "caf\udce9", "attempt": 1}), "payload.node_path"),
    (event(run_id=b"r"), "run_id"),
    (event(node_id="\ud800"), "node_id"),
    (event(node_id=7), "node_id"),
    (event(EventType.TOOL_CALL_INTENDED, {"call_id": "c", "tool": "t", "idempotency_key": "k", "args_digest": "d",
                                          "side_effect": True, "attempt": 1, "timeout_ms": 2**63}),
     "payload.timeout_ms"),
    (event(EventType.RUN_RESUMED, {"previous_epoch": 2**31, "recovered_by": "r", "plan_json": "{}"}),
     "payload.previous_epoch"),
    (event(EventType.PLAN_COMPILED, {"plan_hash": "h", "code_version": "v", "nodes": ["a", "b\udc80"]}),
     "payload.nodes[1]"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_a_value_outside_its_avro_type_is_refused_by_field(bad: Event, field: str) -> None:
    with pytest.raises(InvalidEventError) as info:
        CODEC.encode(bad)
    assert info.value.field == field and field in str(info.value)
    assert isinstance(info.value.__cause__, TypeError | ValueError)


def test_the_edges_of_int_and_long_are_accepted_and_round_trip() -> None:
    for attempt in INT_RANGE:
        for seq in LONG_RANGE:
            written = event(payload={"node_path": "n", "attempt": attempt}, seq=seq)
            assert CODEC.decode(CODEC.encode(written)) == written


SCHEMA = parse_schema({
    "type": "record", "name": "T", "namespace": "x", "fields": [
        {"name": "f", "type": "float", "default": 0.0},
        {"name": "d", "type": "double", "default": 0.0},
        {"name": "b", "type": "bytes", "default": ""},
        {"name": "e", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}, "default": "RED"},
        {"name": "m", "type": {"type": "map", "values": "int"}, "default": {}},
        {"name": "fx", "type": {"type": "fixed", "name": "Four", "size": 4}, "default": "aaaa"},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}, "default": 0},
        {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}, "default": 0},
        {"name": "u", "type": {"type": "string", "logicalType": "uuid"}, "default": str(uuid.UUID(int=0))},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 2},
         "default": ""},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}, "default": 0},
        {"name": "again", "type": ["null", "Color"], "default": None},
    ]})
CHECK = RecordValidator(SCHEMA)
VALID = {"f": 1.5, "d": 2.5, "b": b"x", "e": "RED", "m": {}, "fx": b"abcd", "day": 1, "tm": 0,
         "u": str(uuid.UUID(int=0)), "dec": decimal.Decimal("1.00"), "ts": 0, "again": None}


@pytest.mark.parametrize(("field", "value"), [
    ("f", 3.5e38), ("f", "1.0"), ("f", True), ("d", 10**400), ("b", "text"), ("e", "BLUE"), ("e", 1),
    ("m", {1: 2}), ("m", {"a": 2**31}), ("fx", b"abc"), ("day", 2**31), ("tm", 86_400_000), ("tm", -1),
    ("u", "not-a-uuid"), ("dec", decimal.Decimal("1234.5")), ("dec", decimal.Decimal("1.234")),
    ("dec", decimal.Decimal("NaN")), ("ts", dt.datetime(2026, 1, 1)), ("again", "BLUE"),
])
def test_the_validator_refuses_by_type_and_range(field: str, value: Any) -> None:
    with pytest.raises(InvalidEventError) as info:
        CHECK({field: value})
    assert info.value.field is not None and info.value.field.startswith(field)


@pytest.mark.parametrize(("field", "value"), [
    ("f", 3.4e38), ("f", float("nan")), ("f", float("inf")), ("f", 1), ("d", 1e308), ("b", bytearray(b"x")),
    ("e", "GREEN"), ("m", {"a": 1}), ("fx", b"abcd"), ("day", dt.date(2026, 1, 1)), ("tm", dt.time(12)),
    ("tm", 86_399_999), ("u", uuid.uuid4()), ("u", str(uuid.uuid4())), ("dec", decimal.Decimal("123.45")),
    ("ts", AT), ("again", None), ("again", "GREEN"),
])
def test_the_validator_accepts_what_fastavro_writes_faithfully(field: str, value: Any) -> None:
    record = {**VALID, field: value}
    CHECK(record)
    buf = BytesIO()
    schemaless_writer(buf, SCHEMA, record)
    schemaless_reader(BytesIO(buf.getvalue()), SCHEMA)


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=-(2**70), max_value=2**70), st.integers(min_value=-(2**70), max_value=2**70))
def test_an_int_is_either_written_unchanged_or_refused_by_name(attempt: int, seq: int) -> None:
    written = event(payload={"node_path": "n", "attempt": attempt}, seq=seq)
    fits = INT_RANGE[0] <= attempt <= INT_RANGE[1] and LONG_RANGE[0] <= seq <= LONG_RANGE[1]
    if fits:
        assert CODEC.decode(CODEC.encode(written)) == written
    else:
        with pytest.raises(InvalidEventError) as info:
            CODEC.encode(written)
        assert info.value.field in ("payload.attempt", "seq")

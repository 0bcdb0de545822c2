"""EventCodec, single-object wire format: exact bytes, failure tables, byte caps, tombstones."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta, timezone
from io import BytesIO
from typing import Any

import pytest
from fastavro import schemaless_writer

from runjournal.schemas import (
    DEFAULT_MAX_EVENT_BYTES,
    CorruptEventError,
    DecodeError,
    Event,
    EventCodec,
    EventTooLargeError,
    EventType,
    InvalidEventError,
    NaiveDatetimeError,
    SchemaError,
    TombstoneError,
    UnsupportedSchemaError,
    is_tombstone,
    load_versions,
)
from runjournal.schemas.versions import fingerprint_of, payload_record_name

CODEC = EventCodec()
V1, V2, V3, V4, V5 = load_versions()

# -- exact bytes -------------------------------------------------------------------------------

HEADER_V2 = "c301" + "40c6d1760c4792be"  # C3 01 + CRC-64-AVRO(v2) little-endian
HEADER_V3 = "c301" + "7a38d4edef2a57d5"  # v3: the same bodies for these types
HEADER_V4 = "c301" + "83e4c07b218afc51"  # v4: the same bodies for these types
HEADER_V5 = "c301" + "db94cf82334e67b6"  # v5 (the current writer): the same bodies for these types

EXACT = [
    pytest.param(
        Event(
            event_id="0b7f2a44-8f7b-4b7e-9a8c-1f2d3c4b5a69",
            run_id="run-42",
            tenant_id="acme",
            seq=7,
            epoch=1,
            producer_id="agent-a1",
            type=EventType.TOOL_CALL_INTENDED,
            occurred_at=datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
            payload={
                "call_id": "c1",
                "tool": "send_email",
                "idempotency_key": "k1",
                "args_digest": "ab12",
                "side_effect": True,
                "attempt": 1,
                "timeout_ms": 30000,
                "args_json": None,
            },
            node_id="plan/send",
        ),
        HEADER_V2 + "4830623766326134342d386637622d346237652d396138632d3166326433633462356136390c72756e2d3432"
        "0861636d650e02106167656e742d61310adc8cc3cf84650212706c616e2f73656e64000a0463311473656e645f656d"
        "61696c046b3108616231320102e0d40300",
        id="tool-call-intended",
    ),
    pytest.param(
        Event(
            event_id="e2",
            run_id="r",
            tenant_id="t",
            seq=1,
            epoch=2,
            producer_id="p",
            type=EventType.RUN_SUCCEEDED,
            occurred_at=datetime(1970, 1, 1, tzinfo=UTC),
            payload={"output_json": None},
            traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ),
        HEADER_V2 + "04653202720274020402701a0000026e30302d34626639326633353737623334646136613363653932396430"
        "653065343733362d303066303637616130626139303262372d30311a00",
        id="run-succeeded-epoch-zero-traceparent",
    ),
    pytest.param(
        Event(
            event_id="e3",
            run_id="r",
            tenant_id="t",
            seq=2,
            epoch=1,
            producer_id="p",
            type=EventType.PLAN_COMPILED,
            occurred_at=datetime(2024, 6, 30, 23, 59, 59, 999000, tzinfo=timezone(timedelta(hours=2))),
            payload={"plan_hash": "h", "code_version": "v", "nodes": ["a", "é"]},
        ),
        HEADER_V2 + "046533027202740402027002fefbcbb28d640000020268027604026104c3a900",
        id="plan-compiled-utc+2-multibyte",
    ),
]


@pytest.mark.parametrize(("event", "wire_hex"), EXACT)
def test_encode_gives_exact_bytes(event: Event, wire_hex: str) -> None:
    """v3 and v4 changed APPROVAL_REQUESTED only: these types keep v2's bodies under v4's header."""
    assert CODEC.encode(event).hex() == HEADER_V5 + wire_hex[len(HEADER_V2):]


@pytest.mark.parametrize(("event", "wire_hex"), EXACT)
@pytest.mark.parametrize("header", [HEADER_V2, HEADER_V3, HEADER_V4, HEADER_V5])
def test_decode_exact_bytes(event: Event, wire_hex: str, header: str) -> None:
    decoded = CODEC.decode(bytes.fromhex(header + wire_hex[len(HEADER_V2):]))
    assert decoded == event
    assert decoded.occurred_at.tzinfo is UTC


def _crc64_avro(data: bytes) -> int:
    """Rabin CRC-64-AVRO, straight from the Avro spec (independent of fastavro)."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def test_fingerprints_follow_the_avro_spec() -> None:
    assert _crc64_avro(b'"null"') == 0x63DD24E7CC258F8A  # the spec's test vector
    for version in (V1, V2, V3, V4, V5):
        assert version.fingerprint == _crc64_avro(version.canonical_form.encode())
        assert version.header == b"\xc3\x01" + version.fingerprint.to_bytes(8, "little")
    assert CODEC.fingerprint == V5.fingerprint == 0xB6674E3382CF94DB
    assert V4.fingerprint == 0x51FC8A217BC0E483
    assert V3.fingerprint == 0xD5572AEFEDD4387A
    assert V2.fingerprint == 0xBE92470C76D1C640
    assert V1.fingerprint == 0xE4C401603E59C6ED


# -- failures ----------------------------------------------------------------------------------


def _event(etype: EventType = EventType.RUN_FAILED, **payload: Any) -> Event:
    return Event(
        event_id="00000000-0000-4000-8000-000000000001",
        run_id="run-1",
        tenant_id="t",
        seq=3,
        epoch=1,
        producer_id="agent-a",
        type=etype,
        occurred_at=datetime(2024, 1, 1, tzinfo=UTC),
        payload=payload or {"error": "boom"},
    )


def _raw_v2(record_overrides: dict[str, Any], payload: tuple[str, dict[str, Any]]) -> bytes:
    record = {
        "event_id": "x",
        "run_id": "r",
        "tenant_id": "t",
        "seq": 1,
        "epoch": 1,
        "producer_id": "p",
        "type": "RUN_FAILED",
        "occurred_at": 0,
        "node_id": None,
        "traceparent": None,
        "payload": payload,
        **record_overrides,
    }
    buf = BytesIO()
    schemaless_writer(buf, V2.parsed, record)
    return V2.header + buf.getvalue()


GOOD = CODEC.encode(_event())
UNKNOWN_FP = 0x0123456789ABCDEF

DECODE_FAILURES = [
    pytest.param(b"", CorruptEventError, id="empty"),
    pytest.param(b"\xc3", CorruptEventError, id="one-byte"),
    pytest.param(GOOD[:10], CorruptEventError, id="header-only"),
    pytest.param(b"\xc3\x02" + GOOD[2:], CorruptEventError, id="bad-magic"),
    pytest.param(b"\x00\x00\x00\x00\x01" + GOOD[10:], UnsupportedSchemaError, id="confluent-id-nobody-knows"),
    pytest.param(b"\x01" + bytes(16) + GOOD[10:], UnsupportedSchemaError, id="confluent-guid-framing"),
    pytest.param(b"\x02\x01" + GOOD[2:], CorruptEventError, id="no-known-magic"),
    pytest.param(GOOD[:-1], CorruptEventError, id="truncated-body"),
    pytest.param(GOOD + b"\x00", CorruptEventError, id="trailing-byte"),
    pytest.param(GOOD[:10] + b"\xff" * 6, CorruptEventError, id="garbage-body"),
    pytest.param(
        b"\xc3\x01" + UNKNOWN_FP.to_bytes(8, "little") + GOOD[10:], UnsupportedSchemaError, id="unknown-fp"
    ),
    pytest.param(
        _raw_v2({"type": "NODE_STARTED"}, (payload_record_name("RUN_FAILED"), {"error": "e"})),
        CorruptEventError,
        id="type-payload-mismatch",
    ),
    pytest.param(
        _raw_v2({"type": "UNKNOWN"}, (payload_record_name("RUN_FAILED"), {"error": "e"})),
        CorruptEventError,
        id="writer-wrote-UNKNOWN",
    ),
]


@pytest.mark.parametrize(("value", "error"), DECODE_FAILURES)
def test_decode_failures_are_named_and_located(value: bytes, error: type[DecodeError]) -> None:
    with pytest.raises(error) as info:
        CODEC.decode(value, topic="runjournal.events", partition=2, offset=41)
    exc = info.value
    assert isinstance(exc, SchemaError)
    assert (exc.topic, exc.partition, exc.offset) == ("runjournal.events", 2, 41)
    assert "runjournal.events[2]@41" in str(exc)


def test_unknown_fingerprint_is_carried() -> None:
    value = b"\xc3\x01" + UNKNOWN_FP.to_bytes(8, "little") + GOOD[10:]
    with pytest.raises(UnsupportedSchemaError) as info:
        CODEC.decode(value)
    assert info.value.fingerprint == UNKNOWN_FP
    assert "0x0123456789abcdef" in str(info.value)


def test_truncated_body_chains_the_fastavro_error() -> None:
    with pytest.raises(CorruptEventError) as info:
        CODEC.decode(GOOD[:-1])
    assert isinstance(info.value.__cause__, EOFError)
    assert info.value.fingerprint == V5.fingerprint


def test_tombstone_is_rejected_by_name() -> None:
    assert is_tombstone(None) and not is_tombstone(b"") and not is_tombstone(GOOD)
    with pytest.raises(TombstoneError) as info:
        CODEC.decode(None, topic="t", partition=0, offset=9)
    assert isinstance(info.value, TypeError)
    assert info.value.offset == 9


def test_naive_datetime_is_rejected() -> None:
    with pytest.raises(NaiveDatetimeError):
        dataclasses.replace(_event(), occurred_at=datetime(2024, 1, 1))
    smuggled = _event()
    object.__setattr__(smuggled, "occurred_at", datetime(2024, 1, 1))  # bypassing Event's own check
    with pytest.raises(NaiveDatetimeError) as info:
        CODEC.encode(smuggled)
    assert isinstance(info.value, SchemaError) and isinstance(info.value, ValueError)


def test_sub_millisecond_precision_is_truncated_to_utc_millis() -> None:
    india = timezone(timedelta(hours=5, minutes=30))
    event = dataclasses.replace(_event(), occurred_at=datetime(2024, 1, 1, 1, 0, 0, 123999, tzinfo=india))
    decoded = CODEC.decode(CODEC.encode(event))
    assert decoded.occurred_at == datetime(2023, 12, 31, 19, 30, 0, 123000, tzinfo=UTC)
    assert decoded.occurred_at.tzinfo is UTC


ENCODE_FAILURES = [
    pytest.param(EventType.RUN_FAILED, {}, "payload.error", id="missing-required"),
    pytest.param(EventType.RUN_FAILED, {"error": None}, "payload.error", id="required-none"),
    pytest.param(EventType.RUN_FAILED, {"error": "e", "eror": "typo"}, "payload.eror", id="unknown-field"),
    pytest.param(
        EventType.NODE_STARTED, {"node_path": "n", "attempt": "1"}, "payload.attempt", id="str-for-int"
    ),
    pytest.param(
        EventType.NODE_STARTED, {"node_path": "n", "attempt": True}, "payload.attempt", id="bool-for-int"
    ),
    pytest.param(
        EventType.NODE_FAILED,
        {"node_path": "n", "error": "e", "retryable": 1},
        "payload.retryable",
        id="int-for-bool",
    ),
    pytest.param(
        EventType.PLAN_COMPILED,
        {"plan_hash": "h", "code_version": "v", "nodes": "abc"},
        "payload.nodes",
        id="str-nodes",
    ),
]


@pytest.mark.parametrize(("etype", "payload", "field"), ENCODE_FAILURES)
def test_encode_rejects_payload_not_fitting_the_schema(
    etype: EventType, payload: dict[str, Any], field: str
) -> None:
    event = dataclasses.replace(_event(), type=etype, payload=payload)
    with pytest.raises(InvalidEventError) as info:
        CODEC.encode(event)
    assert info.value.field == field


def test_encode_rejects_bad_envelope_types_with_cause() -> None:
    with pytest.raises(InvalidEventError) as info:
        CODEC.encode(dataclasses.replace(_event(), seq="7"))  # type: ignore[arg-type]
    assert info.value.__cause__ is not None
    assert "seq" in str(info.value)


def test_over_cap_in_bytes_though_under_in_characters() -> None:
    text = "é" * 460_000  # 460 000 characters, 920 000 UTF-8 bytes
    assert len(text) < DEFAULT_MAX_EVENT_BYTES < len(text.encode())
    event = _event(EventType.RUN_SUCCEEDED, output_json=text)
    with pytest.raises(EventTooLargeError) as info:
        CODEC.encode(event)
    assert info.value.limit_bytes == DEFAULT_MAX_EVENT_BYTES
    assert info.value.size_bytes > len(text.encode())
    assert info.value.event_id == event.event_id
    # issue 35 case 7: the advice is one the caller can follow (they cannot set result_ref on an output)
    assert "result_ref" not in str(info.value) and "the run's output (succeed()) is too large" in str(info.value)


def test_just_under_the_cap_is_accepted() -> None:
    event = _event(EventType.RUN_SUCCEEDED, output_json="é" * 440_000)
    value = CODEC.encode(event)
    assert len(value) <= DEFAULT_MAX_EVENT_BYTES
    assert CODEC.decode(value).payload["output_json"] == "é" * 440_000


def test_custom_cap() -> None:
    small = EventCodec(max_event_bytes=64)
    with pytest.raises(EventTooLargeError) as info:
        small.encode(_event(error="x" * 100))
    assert info.value.limit_bytes == 64


def test_absent_optional_fields_decode_as_none() -> None:
    event = _event(EventType.MESSAGE, role="user", content="hi")
    decoded = CODEC.decode(CODEC.encode(event))
    assert decoded.payload == {"role": "user", "content": "hi", "user_id": None}


def test_codec_exposes_the_current_writer_version() -> None:
    assert fingerprint_of(V5.parsed) == V5.fingerprint
    assert CODEC.schema_version is V5 and CODEC.wire_format == "single-object"


def test_v3_records_an_approvals_scope_and_v2_writers_read_as_unscoped() -> None:
    """Envelope v3 (issue 28): APPROVAL_REQUESTED carries the call and attempt a grant authorises; a v2 writer's
    request decodes with both None (no upcaster changes meaning)."""
    asked = _event(EventType.APPROVAL_REQUESTED, call_id="k@2", reason="unknown outcome", tool="pay",
                   scope_call_id="k", scope_attempt=2)
    assert CODEC.decode(CODEC.encode(asked)).payload == {"call_id": "k@2", "reason": "unknown outcome", "tool": "pay",
                                                         "scope_call_id": "k", "scope_attempt": 2, "args_json": None}
    old = _raw_v2({"type": "APPROVAL_REQUESTED"},
                  ("runjournal.ApprovalRequestedPayload", {"call_id": "k@2", "reason": "r", "tool": None}))
    assert CODEC.decode(old).payload == {"call_id": "k@2", "reason": "r", "tool": None, "scope_call_id": None,
                                         "scope_attempt": None, "args_json": None}


def test_v4_records_the_arguments_an_approver_decides_about() -> None:
    """Envelope v4 (issue 35): APPROVAL_REQUESTED carries the call's arguments (canonical JSON) so the approver sees
    the recipient and subject, not only "send_email needs approval"; older writers' requests decode with None."""
    asked = _event(EventType.APPROVAL_REQUESTED, call_id="send", reason="needs a human", tool="send_email",
                   args_json='{"subject":"booking","to":"bob@example.com"}')
    assert CODEC.decode(CODEC.encode(asked)).payload["args_json"] == '{"subject":"booking","to":"bob@example.com"}'
    assert CODEC.encode(asked)[:10] == V5.header


def test_v5_records_who_asked_for_a_cancel_pause_or_resume_and_older_writers_read_as_nobody() -> None:
    """Envelope v5 (issue 31): RUN_CANCELLED and RUN_RESUMED say which operator asked, why, and under which request;
    a RUN_RESUMED with ``paused`` holds the run for nobody. Older writers' events decode with None (no operator)."""
    cancelled = _event(EventType.RUN_CANCELLED, reason="runaway loop", requested_by="ops@host", request_id="c-1")
    assert CODEC.decode(CODEC.encode(cancelled)).payload == {"reason": "runaway loop", "requested_by": "ops@host",
                                                             "request_id": "c-1"}
    paused = _event(EventType.RUN_RESUMED, previous_epoch=2, recovered_by="recovery@1", plan_json="{}",
                    assigned_to=None, requested_by="ops@host", request_reason="budget review", request_id="p-1",
                    paused=True, resume_at_ms=1_796_000_000_000, waiting_for="approved")
    assert CODEC.decode(CODEC.encode(paused)).payload["paused"] is True
    assert CODEC.decode(CODEC.encode(paused)).payload["resume_at_ms"] == 1_796_000_000_000
    assert CODEC.encode(paused)[:10] == V5.header
    old = _raw_v2({"type": "RUN_CANCELLED"}, ("runjournal.RunCancelledPayload", {"reason": "r"}))
    assert CODEC.decode(old).payload == {"reason": "r", "requested_by": None, "request_id": None}

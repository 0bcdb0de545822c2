"""The generated envelope writer (``runjournal.schemas._direct``) writes fastavro's bytes or declines.

Oracle: the codec's checked path (record dict, ``RecordValidator``, fastavro ``schemaless_writer``). For every
event the writer either returns exactly the checked path's bytes, or returns None — and then ``encode`` raises
exactly what the checked path raises. Generated events of every type (valid ones, and ones with values of the
wrong type, out of range, lone surrogates, unknown keys, other time zones), every type at its field extremes,
both framings, and the size cap.
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from datetime import UTC, datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runjournal.schemas import (
    KNOWN_TYPES,
    PAYLOAD_FIELDS,
    Event,
    EventCodec,
    EventTooLargeError,
    EventType,
    SchemaError,
    load_versions,
)
from runjournal.schemas._direct import DirectWriter, zigzag_varint
from runjournal.schemas.versions import payload_record_name

V1, V2, *_, CURRENT = load_versions()
CODEC = EventCodec()
CODEC.encode(Event(event_id="warm", run_id="r", tenant_id="t", seq=1, epoch=1, producer_id="p",
                   type=EventType.RUN_FAILED, occurred_at=datetime(2024, 1, 1, tzinfo=UTC), payload={"error": "e"}))
WRITER = CODEC._direct
assert WRITER is not None
RECORD_NAMES = {t: payload_record_name(t.value) for t in KNOWN_TYPES}


def _checked(event: Event, codec: EventCodec = CODEC) -> bytes | SchemaError:
    """What the checked path writes for ``event``, or the error it raises."""
    try:
        return codec._encode_checked(event, codec._topic)
    except SchemaError as exc:
        return exc


def _encoded(event: Event, codec: EventCodec = CODEC) -> bytes | SchemaError:
    try:
        return codec.encode(event)
    except SchemaError as exc:
        return exc


def _same(a: bytes | SchemaError, b: bytes | SchemaError) -> bool:
    if isinstance(a, bytes) or isinstance(b, bytes):
        return a == b
    return (type(a), str(a), getattr(a, "field", None)) == (type(b), str(b), getattr(b, "field", None))


def _assert_direct_or_declined(event: Event, codec: EventCodec = CODEC) -> bytes | None:
    """The property: the writer's bytes are the checked path's, or it declines and encode() behaves as that path."""
    header = codec._headers[codec._topic if codec._registry is not None else ""]
    direct = codec._direct(event, header) if codec._direct is not None else None
    checked = _checked(event, codec)
    if direct is not None:
        assert isinstance(checked, bytes), f"the writer accepted what the checked path refuses: {checked!r}"
        assert direct.hex() == checked.hex()
    assert _same(_encoded(event, codec), checked)
    return direct


# -- generated events -----------------------------------------------------------------------------------------

_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=30)
_SURROGATE = st.text(st.characters(categories=("Cs",)), min_size=1, max_size=2)


class _Str(str):
    """A str subclass: the writer declines it (the checked path accepts it)."""


class _Int(enum.IntEnum):
    ONE = 1


_ODD = st.sampled_from([None, True, False, 1.5, b"x", _Str("s"), _Int.ONE, ["a"], ("a",), {"a": 1}, 2**63,
                        -(2**63) - 1])
_UTC_WHEN = st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31), timezones=st.just(UTC))
_ZONES = st.sampled_from([timezone(timedelta(hours=h, minutes=m)) for h, m in ((2, 0), (-5, 0), (5, 30), (0, 0))])
_OTHER_WHEN = st.datetimes(min_value=datetime(2, 1, 1), max_value=datetime(9998, 1, 1), timezones=_ZONES)


def _good(py: type, name: str) -> st.SearchStrategy[Any]:
    if py is bool:
        return st.booleans()
    if py is int:
        longs = name in ("timeout_ms", "resume_at_ms")
        return st.integers(-(2**63), 2**63 - 1) if longs else st.integers(-(2**31), 2**31 - 1)
    if py is list:
        return st.lists(_TEXT, max_size=4)
    return _TEXT


def _payload(etype: EventType, *, odd: bool) -> st.SearchStrategy[dict[str, Any]]:
    fields = {name: _good(py, name) if required else st.none() | _good(py, name)
              for name, (py, required) in PAYLOAD_FIELDS[etype].items()}
    if not odd:
        return st.fixed_dictionaries({n: s for n, s in fields.items() if PAYLOAD_FIELDS[etype][n][1]},
                                     optional={n: s for n, s in fields.items() if not PAYLOAD_FIELDS[etype][n][1]})
    spoiled = {name: s | _ODD | _SURROGATE for name, s in fields.items()}
    return st.fixed_dictionaries({}, optional={**spoiled, "extra": _TEXT})


@st.composite
def events(draw: st.DrawFn, *, odd: bool) -> Event:
    etype = draw(st.sampled_from(KNOWN_TYPES))
    text = (_TEXT | _SURROGATE | _ODD) if odd else _TEXT
    return Event(
        event_id=draw(text), run_id=draw(text), tenant_id=draw(text),
        seq=draw(st.integers(-(2**64), 2**64) | _ODD if odd else st.integers(-(2**63), 2**63 - 1)),
        epoch=draw(st.integers(-(2**32), 2**32) | _ODD if odd else st.integers(-(2**31), 2**31 - 1)),
        producer_id=draw(text), type=etype,
        occurred_at=draw(_UTC_WHEN | _OTHER_WHEN if odd else _UTC_WHEN),
        payload=draw(_payload(etype, odd=odd)),
        node_id=draw(st.none() | text), traceparent=draw(st.none() | text),
    )


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events(odd=False))
def test_every_valid_event_is_written_directly_with_fastavros_bytes(event: Event) -> None:
    assert _assert_direct_or_declined(event) is not None


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events(odd=True))
def test_any_other_event_is_fastavros_bytes_or_declined_with_the_checked_error(event: Event) -> None:
    _assert_direct_or_declined(event)


# -- every type at its field extremes ------------------------------------------------------------------------

_LONG_TEXT = "é" * 3000 + "\U0001f600" * 600  # 8 400 UTF-8 bytes: a 2-byte length beyond the table
_STRINGS = ["", "a", "\x00", "é", "\U0001f600", "x" * 63, "x" * 64, "x" * 4095, "x" * 4096, _LONG_TEXT]
_EDGES: dict[type, list[Any]] = {
    str: _STRINGS,
    bool: [True, False],
    list: [[], [""], ["a", "é", _LONG_TEXT], ["x"] * 70],
}
_INT_EDGES = [0, 1, -1, 63, 64, -64, -65, 2047, 2048, 4095, 4096, 8191, 8192, 2**31 - 1, -(2**31)]
_LONG_EDGES = [*_INT_EDGES, 2**31, -(2**31) - 1, 2**62, 2**63 - 1, -(2**63)]
_WHEN_EDGES = [datetime(1970, 1, 1, tzinfo=UTC), datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
               datetime(1969, 12, 31, 23, 59, 59, 500, tzinfo=UTC), datetime(1970, 1, 1, 0, 0, 0, 999, tzinfo=UTC),
               datetime(1970, 1, 1, 0, 0, 4, 95000, tzinfo=UTC), datetime(1, 1, 1, tzinfo=UTC),
               datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
               datetime(2026, 12, 1, 8, 0, 0, 123456, tzinfo=UTC)]


def _base(etype: EventType) -> Event:
    payload: dict[str, Any] = {}
    for name, (py, required) in PAYLOAD_FIELDS[etype].items():
        if required:
            payload[name] = {str: "v", bool: True, int: 1, list: ["n"]}[py]
    return Event(event_id=str(uuid.uuid4()), run_id="run-1", tenant_id="acme", seq=5, epoch=1, producer_id="agent",
                 type=etype, occurred_at=datetime(2026, 1, 1, tzinfo=UTC), payload=payload)


def _extremes(etype: EventType) -> list[Event]:
    base = _base(etype)
    out = [base]
    for name, (py, required) in PAYLOAD_FIELDS[etype].items():
        values = _EDGES.get(py, _LONG_EDGES if name in ("timeout_ms", "resume_at_ms") else _INT_EDGES)
        out += [dataclasses.replace(base, payload={**base.payload, name: v}) for v in values]
        if not required:
            out.append(dataclasses.replace(base, payload={**base.payload, name: None}))
    envelope: dict[str, list[Any]] = {
        "event_id": _STRINGS, "run_id": _STRINGS, "tenant_id": _STRINGS, "producer_id": _STRINGS,
        "seq": _LONG_EDGES, "epoch": _INT_EDGES, "occurred_at": _WHEN_EDGES,
        "node_id": [None, *_STRINGS], "traceparent": [None, *_STRINGS]}
    for name, values in envelope.items():
        out += [dataclasses.replace(base, **{name: v}) for v in values]
    return out


@pytest.mark.parametrize("etype", KNOWN_TYPES, ids=str)
def test_every_type_at_its_field_extremes_is_written_directly_with_fastavros_bytes(etype: EventType) -> None:
    for event in _extremes(etype):
        assert _assert_direct_or_declined(event) is not None, event


@pytest.mark.parametrize("etype", KNOWN_TYPES, ids=str)
def test_just_outside_the_ranges_the_writer_declines_and_the_checked_error_stands(etype: EventType) -> None:
    base = _base(etype)
    bad = [dataclasses.replace(base, seq=2**63), dataclasses.replace(base, seq=-(2**63) - 1),
           dataclasses.replace(base, epoch=2**31), dataclasses.replace(base, epoch=True),
           dataclasses.replace(base, run_id="\ud800"), dataclasses.replace(base, node_id=b"n"),
           dataclasses.replace(base, payload={**base.payload, "nope": 1})]
    for name, (py, required) in PAYLOAD_FIELDS[etype].items():
        wrong = {str: 7, bool: 1, int: True, list: ("a",)}[py]
        bad.append(dataclasses.replace(base, payload={**base.payload, name: wrong}))
        if required:
            bad.append(dataclasses.replace(base, payload={k: v for k, v in base.payload.items() if k != name}))
        if py is int:
            high = 2**63 if name in ("timeout_ms", "resume_at_ms") else 2**31
            bad.append(dataclasses.replace(base, payload={**base.payload, name: high}))
    for event in bad:
        assert isinstance(_checked(event), SchemaError), event
        assert _assert_direct_or_declined(event) is None


def test_what_it_declines_but_fastavro_takes_is_still_written_by_the_checked_path() -> None:
    base = _base(EventType.NODE_STARTED)
    india = timezone(timedelta(hours=5, minutes=30))
    for event in [dataclasses.replace(base, occurred_at=datetime(2024, 1, 1, 5, 30, tzinfo=india)),
                  dataclasses.replace(base, run_id=_Str("run-1")), dataclasses.replace(base, seq=_Int.ONE),
                  dataclasses.replace(base, payload={"node_path": "n", "attempt": _Int.ONE})]:
        assert _assert_direct_or_declined(event) is None
        assert isinstance(CODEC.encode(event), bytes)


def test_the_timestamp_cache_follows_the_object() -> None:
    base = _base(EventType.RUN_FAILED)
    when = datetime(2026, 5, 5, 5, 5, 5, 5000, tzinfo=UTC)
    for at in (when, when, datetime(2026, 5, 5, 5, 5, 5, 6000, tzinfo=UTC), when, when + timedelta(days=-20000)):
        _assert_direct_or_declined(dataclasses.replace(base, occurred_at=at))


def test_a_runs_remembered_identity_is_right_for_many_runs_and_after_it_starts_over() -> None:
    base = _base(EventType.MESSAGE)
    for i in range(5000):  # more distinct run ids than it remembers (2,048): it starts over, twice
        event = dataclasses.replace(base, run_id=f"run-{i}-é", tenant_id=f"t{i % 7}", producer_id="agent#2")
        assert _assert_direct_or_declined(event) is not None
    remembered = WRITER.writers[EventType.MESSAGE].__globals__["REMEMBERED"]  # the generated code's namespace
    assert 0 < len(remembered) <= 2048


# -- framing, cap, first use, compile -------------------------------------------------------------------------

class _FakeRegistry:
    """Just enough of a SchemaRegistryClient for writers: an id per subject."""

    def __init__(self) -> None:
        self.ids = {"a.events-value": 7, "b.events-value": 300_000}

    def lookup_schema(self, subject: str, schema: Any) -> SimpleNamespace:
        return SimpleNamespace(schema_id=self.ids[subject])


def test_confluent_framing_prepends_the_subjects_id_either_way() -> None:
    codec = EventCodec(schema_registry_client=_FakeRegistry(), topic="a.events")  # type: ignore[arg-type]
    for topic, schema_id in (("a.events", 7), ("b.events", 300_000)):
        for event in _extremes(EventType.TOOL_CALL_INTENDED)[:20]:
            value = codec.encode(event, topic=topic)
            assert value[:5] == b"\x00" + schema_id.to_bytes(4, "big")
            header = codec._headers[topic]
            assert codec._direct is not None and codec._direct(event, header) == value
            assert codec._encode_checked(event, topic) == value
            assert value[5:] == CODEC.encode(event)[10:]


def test_the_cap_applies_to_the_directly_written_bytes() -> None:
    small = EventCodec(max_event_bytes=200)
    small.encode(_base(EventType.RUN_FAILED))
    event = dataclasses.replace(_base(EventType.RUN_FAILED), payload={"error": "x" * 300})
    size = len(small._encode_checked(event, small._topic))
    with pytest.raises(EventTooLargeError) as info:
        small.encode(event)
    assert (info.value.size_bytes, info.value.limit_bytes) == (size, 200)


def test_the_first_event_goes_through_the_checked_path_so_an_invalid_one_announces_nothing() -> None:
    class Catalog:
        announced = 0

        def announce(self, version: Any, *, registry_id: int | None) -> None:
            Catalog.announced += 1

    codec = EventCodec(catalog=Catalog())  # type: ignore[arg-type]
    bad = dataclasses.replace(_base(EventType.RUN_FAILED), seq=2**63)
    assert isinstance(_encoded(bad, codec), SchemaError) and Catalog.announced == 0
    assert isinstance(codec.encode(_base(EventType.RUN_FAILED)), bytes) and Catalog.announced == 1


def test_the_current_schema_compiles_for_every_type() -> None:
    assert WRITER.types == frozenset(KNOWN_TYPES)
    assert WRITER(dataclasses.replace(_base(EventType.MESSAGE), type=EventType.UNKNOWN), CURRENT.header) is None


def test_a_schema_or_payload_it_cannot_write_gets_no_writer() -> None:
    raw = CURRENT.parsed
    fields = [f if f["name"] != "seq" else {**f, "type": "double"} for f in raw["fields"]]
    assert DirectWriter.compile({**raw, "fields": fields}, record_names=RECORD_NAMES, contract=PAYLOAD_FIELDS) is None
    contract = {**PAYLOAD_FIELDS, EventType.MESSAGE: {**PAYLOAD_FIELDS[EventType.MESSAGE], "role": (int, True)}}
    partial = DirectWriter.compile(raw, record_names=RECORD_NAMES, contract=contract)
    assert partial is not None and partial.types == frozenset(KNOWN_TYPES) - {EventType.MESSAGE}
    assert DirectWriter.compile(V1.parsed, record_names=RECORD_NAMES, contract=PAYLOAD_FIELDS) is None


def test_a_field_the_contract_requires_is_refused_as_none_even_where_avro_allows_null() -> None:
    contract = {**PAYLOAD_FIELDS, EventType.MESSAGE: {**PAYLOAD_FIELDS[EventType.MESSAGE], "user_id": (str, True)}}
    strict = DirectWriter.compile(CURRENT.parsed, record_names=RECORD_NAMES, contract=contract)
    assert strict is not None
    event = _base(EventType.MESSAGE)
    assert strict(event, CURRENT.header) is None
    assert strict(dataclasses.replace(event, payload={**event.payload, "user_id": None}), CURRENT.header) is None
    with_user = dataclasses.replace(event, payload={**event.payload, "user_id": "u"})
    assert strict(with_user, CURRENT.header) == CODEC.encode(with_user)


@pytest.mark.parametrize("n", [0, 1, -1, 63, -64, 64, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)])
def test_zigzag_varint_follows_the_avro_spec(n: int) -> None:
    z = (n << 1) ^ (n >> 63)
    expected = bytearray()
    while True:
        byte, z = z & 0x7F, z >> 7
        expected.append(byte | (0x80 if z else 0))
        if not z:
            break
    assert zigzag_varint(n) == bytes(expected)


def test_a_codec_that_only_decodes_never_compiles_the_writer() -> None:
    """The generated writer is compiled on first encode: a process that only reads (``inspect``, the console, the
    recovery job's readers) does not pay for it (it was compiled by every codec's constructor)."""
    event = Event(event_id="lazy", run_id="r", tenant_id="t", seq=1, epoch=1, producer_id="p",
                  type=EventType.RUN_FAILED, occurred_at=datetime(2024, 1, 1, tzinfo=UTC), payload={"error": "e"})
    data = CODEC.encode(event)
    reader = EventCodec()
    assert reader.decode(data).event_id == "lazy"
    assert "_direct" not in vars(reader) and "_direct_by_type" not in vars(reader)
    assert reader.encode(event) == data and reader.encode(event) == data  # compiled on use: the same bytes
    assert vars(reader)["_direct"] is not None

"""EventCodec with Confluent Schema Registry framing, against the in-memory ``mock://`` registry."""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import UTC, datetime

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from fastavro import parse_schema

from runjournal.core.settings import Settings
from runjournal.schemas import (
    CorruptEventError,
    Event,
    EventCodec,
    EventTooLargeError,
    EventType,
    RegistryError,
    UnsupportedSchemaError,
    codec_from_settings,
    load_versions,
)
from runjournal.schemas._confluent import registry_client
from runjournal.schemas.versions import fingerprint_of, payload_record_name

V1, V2 = load_versions()
TOPIC = "runjournal.events"


@pytest.fixture
def url() -> str:
    return f"mock://{uuid.uuid4().hex}"


def _event(seq: int = 1) -> Event:
    return Event(
        event_id=str(uuid.uuid4()),
        run_id="run-1",
        tenant_id="t",
        seq=seq,
        epoch=1,
        producer_id="agent-a",
        type=EventType.NODE_STARTED,
        occurred_at=datetime(2024, 5, 6, 7, 8, 9, 10000, tzinfo=UTC),
        payload={"node_path": "plan/a", "attempt": 1},
        node_id="plan/a",
        traceparent="00-aa-bb-01",
    )


def _write_v1(client: SchemaRegistryClient, topic: str) -> bytes:
    """What an old (envelope v1) producer wrote through the registry."""
    serializer = AvroSerializer(client, Schema(V1.text, "AVRO"))
    record = {
        "event_id": "00000000-0000-4000-8000-00000000000a",
        "run_id": "run-old",
        "tenant_id": "t",
        "seq": 4,
        "epoch": 1,
        "instance_id": "agent-old",
        "type": "TOOL_CALL_INTENDED",
        "occurred_at": datetime(2023, 1, 1, tzinfo=UTC),
        "node_id": "plan/send",
        "payload": (
            payload_record_name("TOOL_CALL_INTENDED"),
            {
                "call_id": "c",
                "tool": "send_email",
                "idempotency_key": "k",
                "args_digest": "d",
                "side_effect": True,
                "attempt": 0,
                "timeout_s": 15,
                "args_json": None,
            },
        ),
    }
    return serializer(record, SerializationContext(topic, MessageField.VALUE))


def test_round_trip_uses_confluent_framing_and_topic_subject(url: str) -> None:
    producer, consumer = EventCodec(schema_registry_url=url), EventCodec(schema_registry_url=url)
    assert producer.wire_format == "confluent"
    event = _event()
    value = producer.encode(event, topic="orders.events")
    assert value[0] == 0  # Confluent magic byte, then a 4-byte big-endian schema id
    schema_id = int.from_bytes(value[1:5], "big")
    client = registry_client(url)
    assert "orders.events-value" in client.get_subjects()
    registered = parse_schema(json.loads(client.get_schema(schema_id).schema_str))
    assert fingerprint_of(registered) == V2.fingerprint  # the full v2 .avsc was registered
    assert consumer.decode(value, topic="orders.events") == event


def test_evolution_v1_writer_is_resolved_and_upcast(url: str) -> None:
    client = registry_client(url)
    old_value = _write_v1(client, TOPIC)
    codec = EventCodec(schema_registry_url=url)
    decoded = codec.decode(old_value, topic=TOPIC, partition=0, offset=3)
    assert decoded.producer_id == "agent-old"  # v1 instance_id, renamed by alias
    assert decoded.traceparent is None  # added in v2 with a default
    assert decoded.payload["attempt"] == 1  # 0-based in v1, upcast
    assert decoded.payload["timeout_ms"] == 15_000  # seconds in v1, upcast
    new_value = codec.encode(_event(seq=5))
    assert sorted(client.get_versions(f"{TOPIC}-value")) == [1, 2]  # v1 then v2 under one subject
    assert int.from_bytes(new_value[1:5], "big") != int.from_bytes(old_value[1:5], "big")
    assert codec.decode(new_value).seq == 5


def test_injected_client_is_used() -> None:
    client = SchemaRegistryClient.new_client({"url": "mock://injected"})
    codec = EventCodec(schema_registry_client=client)
    codec.encode(_event())
    assert client.get_subjects() == [f"{TOPIC}-value"]


def test_unknown_schema_id(url: str) -> None:
    codec = EventCodec(schema_registry_url=url)
    with pytest.raises(UnsupportedSchemaError) as info:
        codec.decode(b"\x00\x00\x00\x03\xe7" + b"\x02\x00", topic=TOPIC, partition=1, offset=7)
    assert info.value.schema_id == 999
    assert info.value.offset == 7


def test_registered_schema_that_is_no_known_version(url: str) -> None:
    client = registry_client(url)
    foreign = AvroSerializer(
        client,
        Schema('{"type": "record", "name": "Other", "fields": [{"name": "x", "type": "int"}]}', "AVRO"),
    )
    value = foreign({"x": 1}, SerializationContext(TOPIC, MessageField.VALUE))
    with pytest.raises(UnsupportedSchemaError) as info:
        EventCodec(schema_registry_url=url).decode(value, topic=TOPIC)
    assert info.value.fingerprint is not None
    assert info.value.fingerprint not in {V1.fingerprint, V2.fingerprint}


@pytest.mark.parametrize(
    ("value", "error"),
    [
        pytest.param(b"", CorruptEventError, id="empty"),
        pytest.param(b"\x00\x00\x00\x00", CorruptEventError, id="short"),
        pytest.param(
            b"\xc3\x01" + V2.fingerprint.to_bytes(8, "little") + b"\x00", CorruptEventError, id="single-obj"
        ),
        pytest.param(b"\x01" + b"\x00" * 20, UnsupportedSchemaError, id="guid-framing"),
    ],
)
def test_registry_framing_failures(url: str, value: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        EventCodec(schema_registry_url=url).decode(value, topic=TOPIC)


def test_truncated_registry_body_is_corrupt(url: str) -> None:
    codec = EventCodec(schema_registry_url=url)
    value = codec.encode(_event())
    with pytest.raises(CorruptEventError) as info:
        codec.decode(value[:-3], topic=TOPIC)
    assert info.value.__cause__ is not None


def test_size_cap_applies_to_registry_framing(url: str) -> None:
    codec = EventCodec(schema_registry_url=url, max_event_bytes=1000)
    big = dataclasses.replace(_event(), type=EventType.RUN_FAILED, payload={"error": "ü" * 600})
    with pytest.raises(EventTooLargeError) as info:
        codec.encode(big)
    assert info.value.size_bytes > 1200


def test_codec_from_settings(url: str) -> None:
    plain = codec_from_settings(Settings(topic_prefix="p1"))
    assert plain.wire_format == "single-object"
    registry = codec_from_settings(Settings(topic_prefix="p2", schema_registry_url=url))
    assert registry.wire_format == "confluent"
    registry.encode(_event())
    assert registry_client(url).get_subjects() == ["p2.events-value"]


def test_stock_avro_deserializer_reads_our_bytes(url: str) -> None:
    event = _event()
    value = EventCodec(schema_registry_url=url).encode(event)
    stock = AvroDeserializer(registry_client(url), Schema(V2.text, "AVRO"), return_record_name=True)
    record = stock(value, SerializationContext(TOPIC, MessageField.VALUE))
    assert record["event_id"] == event.event_id and record["producer_id"] == "agent-a"
    assert record["payload"] == (payload_record_name("NODE_STARTED"), {"node_path": "plan/a", "attempt": 1})


def test_unreachable_registry_is_a_registry_error() -> None:
    client = SchemaRegistryClient.new_client({"url": "http://127.0.0.1:1", "max.retries": 0})
    codec = EventCodec(schema_registry_client=client)
    with pytest.raises(RegistryError) as info:
        codec.encode(_event())
    assert info.value.__cause__ is not None
    with pytest.raises(RegistryError):
        codec.decode(b"\x00\x00\x00\x00\x07\x02\x00", topic=TOPIC)

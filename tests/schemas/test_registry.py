"""EventCodec with Confluent framing against a real schema registry process (Apicurio, from Maven Central).

Each test uses its own topic name, so its subject ``{topic}-value`` is its own. Versions are
registered the way the publish tool does it (:func:`register_versions`); producers only look ids up.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from io import BytesIO
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from fastavro import schemaless_writer

from runjournal.schemas import (
    CorruptEventError,
    Event,
    EventCodec,
    EventTooLargeError,
    EventType,
    RegistryError,
    UnregisteredSchemaError,
    UnsupportedSchemaError,
    load_versions,
)
from runjournal.schemas._confluent import registry_client
from runjournal.schemas.compat import check_all
from runjournal.schemas.registration import register_versions, registry_accepts
from runjournal.schemas.versions import load_version, payload_record_name
from tests.conftest import LocalRegistry
from tests.support.newer_writer import NEXT_VERSION, write_candidate

pytestmark = [pytest.mark.registry]

V1, V2, *_, CURRENT = load_versions()
REGISTERED = [v.label for v in load_versions() if v.version >= 2]
"""What ``register_versions`` registers: every published version from v2 (registration.py)."""
RUNJOURNAL = [sys.executable, "-m", "runjournal"]


@pytest.fixture
def url(registry: LocalRegistry) -> str:
    return registry.url


@pytest.fixture
def topic(url: str) -> str:
    """A fresh topic whose subject holds the published versions (as `runjournal schemas publish` leaves it)."""
    name = f"t{uuid.uuid4().hex[:10]}.events"
    register_versions(url, f"{name}-value")
    return name


def _event(seq: int = 1) -> Event:
    return Event(
        event_id=str(uuid.uuid4()), run_id="run-1", tenant_id="t", seq=seq, epoch=1, producer_id="agent-a",
        type=EventType.NODE_STARTED, occurred_at=datetime(2024, 5, 6, 7, 8, 9, 10000, tzinfo=UTC),
        payload={"node_path": "plan/a", "attempt": 1}, node_id="plan/a", traceparent="00-aa-bb-01",
    )


def test_publish_sets_full_transitive_and_producers_only_look_up(url: str) -> None:
    subject = f"t{uuid.uuid4().hex[:10]}.events-value"
    first = register_versions(url, subject)
    assert [(r.version, r.action) for r in first] == [(v, "registered") for v in REGISTERED]
    client = registry_client(url)
    assert client.get_compatibility(subject) == "FULL_TRANSITIVE"
    again = register_versions(url, subject)
    assert [(r.version, r.action, r.schema_id) for r in again] == [(r.version, "exists", r.schema_id) for r in first]

    event = _event()
    value = EventCodec(schema_registry_url=url, topic=subject.removesuffix("-value")).encode(event)
    assert value[0] == 0 and int.from_bytes(value[1:5], "big") == first[-1].schema_id  # the current version's id
    assert client.get_versions(subject) == list(range(1, len(REGISTERED) + 1))  # encoding registered nothing
    assert EventCodec(schema_registry_url=url).decode(value) == event


def test_producers_never_register(url: str) -> None:
    unpublished = f"t{uuid.uuid4().hex[:10]}.events"
    codec = EventCodec(schema_registry_url=url, topic=unpublished)
    with pytest.raises(UnregisteredSchemaError, match="runjournal schemas publish --registry"):
        codec.encode(_event())
    assert f"{unpublished}-value" not in registry_client(url).get_subjects()


def test_round_trip_and_stock_serde_interop(url: str, topic: str) -> None:
    event = _event()
    ours = EventCodec(schema_registry_url=url, topic=topic)
    value = ours.encode(event)
    assert EventCodec(schema_registry_url=url).decode(value, topic=topic) == event
    client = registry_client(url)
    stock = AvroDeserializer(client, Schema(CURRENT.text, "AVRO"), return_record_name=True)
    record = stock(value, SerializationContext(topic, MessageField.VALUE))
    assert record["event_id"] == event.event_id and record["producer_id"] == "agent-a"
    assert record["payload"] == (payload_record_name("NODE_STARTED"), {"node_path": "plan/a", "attempt": 1})
    serializer = AvroSerializer(client, Schema(CURRENT.text, "AVRO"), conf={"auto.register.schemas": False})
    theirs = serializer(ours._to_record(event), SerializationContext(topic, MessageField.VALUE))
    assert theirs == value  # the same bytes: same id, same body


def test_v1_writer_through_the_registry_is_resolved_and_upcast(url: str) -> None:
    """An old agent wrote envelope v1 with its own (auto-registering) serializer: read by id, upcast."""
    legacy_topic = f"t{uuid.uuid4().hex[:10]}.legacy"
    serializer = AvroSerializer(registry_client(url), Schema(V1.text, "AVRO"))
    old = serializer({
        "event_id": "00000000-0000-4000-8000-00000000000a", "run_id": "run-old", "tenant_id": "t", "seq": 4,
        "epoch": 1, "instance_id": "agent-old", "type": "TOOL_CALL_INTENDED",
        "occurred_at": datetime(2023, 1, 1, tzinfo=UTC), "node_id": "plan/send",
        "payload": (payload_record_name("TOOL_CALL_INTENDED"), {
            "call_id": "c", "tool": "send_email", "idempotency_key": "k", "args_digest": "d", "side_effect": True,
            "attempt": 0, "timeout_s": 15, "args_json": None}),
    }, SerializationContext(legacy_topic, MessageField.VALUE))
    decoded = EventCodec(schema_registry_url=url).decode(old, topic=legacy_topic, partition=0, offset=3)
    assert decoded.producer_id == "agent-old" and decoded.traceparent is None
    assert decoded.payload["attempt"] == 1 and decoded.payload["timeout_ms"] == 15_000


def test_unknown_id_and_foreign_schema_are_unsupported(url: str) -> None:
    codec = EventCodec(schema_registry_url=url)
    with pytest.raises(UnsupportedSchemaError) as info:
        codec.decode(b"\x00\x00\x0f\x42\x3f" + b"\x02\x00", topic="x", partition=1, offset=7)
    assert info.value.schema_id == 999_999 and info.value.offset == 7
    foreign = AvroSerializer(registry_client(url), Schema(
        '{"type": "record", "name": "Other", "fields": [{"name": "x", "type": "int"}]}', "AVRO"))
    value = foreign({"x": 1}, SerializationContext(f"t{uuid.uuid4().hex[:8]}", MessageField.VALUE))
    with pytest.raises(UnsupportedSchemaError) as foreign_info:
        codec.decode(value)
    assert foreign_info.value.fingerprint not in {v.fingerprint for v in load_versions()}


@pytest.mark.parametrize(("value", "error"), [
    pytest.param(b"", CorruptEventError, id="empty"),
    pytest.param(b"\x00\x00\x00\x00", CorruptEventError, id="short"),
    pytest.param(b"\xc3\x01" + V2.fingerprint.to_bytes(8, "little") + b"\x00", CorruptEventError, id="so-corrupt"),
    pytest.param(b"\x01" + b"\x00" * 20, UnsupportedSchemaError, id="guid-framing"),
])
def test_registry_framing_failures(url: str, value: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        EventCodec(schema_registry_url=url).decode(value, topic="x")


def test_truncated_body_and_size_cap(url: str, topic: str) -> None:
    codec = EventCodec(schema_registry_url=url, topic=topic, max_event_bytes=1000)
    with pytest.raises(CorruptEventError):
        codec.decode(codec.encode(_event())[:-3], topic=topic)
    big = dataclasses.replace(_event(), type=EventType.RUN_FAILED, payload={"error": "ü" * 600})
    with pytest.raises(EventTooLargeError) as info:
        codec.encode(big)
    assert info.value.size_bytes > 1200


def test_unreachable_registry_is_a_registry_error(own_registry: LocalRegistry) -> None:
    """Transport failures are RegistryError (wait and retry), never Unsupported/Corrupt (quarantine)."""
    topic = f"t{uuid.uuid4().hex[:10]}.events"
    register_versions(own_registry.url, f"{topic}-value")
    value = EventCodec(schema_registry_url=own_registry.url, topic=topic).encode(_event())
    own_registry.stop()
    with pytest.raises(RegistryError) as info:
        EventCodec(schema_registry_url=own_registry.url).decode(value, topic=topic)
    assert info.value.__cause__ is not None
    with pytest.raises(RegistryError):
        EventCodec(schema_registry_url=own_registry.url, topic=topic).encode(_event())
    own_registry.start()  # back with the same storage: the same id decodes again
    assert EventCodec(schema_registry_url=own_registry.url).decode(value, topic=topic).seq == 1


def test_breaking_candidate_is_refused_by_the_gate_and_by_the_registry(url: str, topic: str, tmp_path: Path) -> None:
    """Acceptance 3: the local gate and the registry's FULL_TRANSITIVE check both refuse it."""
    subject = f"{topic}-value"
    for breaking in ("required-field", "int-to-string"):
        directory = tmp_path / breaking
        directory.mkdir()
        candidate = write_candidate(directory, new_type=False, optional_field=False, breaking=breaking)
        assert check_all(candidates=[candidate], samples=5)  # the local gate
        version = load_version(candidate, NEXT_VERSION)
        assert registry_accepts(url, subject, version) is False  # the registry's own check
        (refused,) = register_versions(url, subject, versions=(version,))
        assert refused.action == "refused" and refused.schema_id is None
    assert registry_client(url).get_versions(subject) == list(range(1, len(REGISTERED) + 1))

    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RUNJOURNAL_")},
           "RUNJOURNAL_SCHEMA_REGISTRY_URL": url, "RUNJOURNAL_TOPIC_PREFIX": topic.removesuffix(".events"),
           "RUNJOURNAL_STACK_DIR": str(tmp_path / "stack")}
    cli = subprocess.run([*RUNJOURNAL, "schemas", "check", "--candidate", str(candidate), "--registry", "--json"],
                         capture_output=True, text=True, env=env, timeout=300, check=False)
    assert cli.returncode == 1
    readers = {p["reader"] for p in json.loads(cli.stdout)["problems"]}
    assert "v2" in readers and f"registry:{subject}" in readers


def test_compatible_newer_writer_registers_and_is_read_by_todays_codec(url: str, topic: str, tmp_path: Path) -> None:
    """A v3 adding an optional field: both checks accept it, the publish tool registers it, today's reader reads it.

    A v3 that adds an event type passes the local gate (open payload union) but not the registry's standard
    Avro check, which closes unions: the caveat stated in docs/reference/event-contract.md, kept true by this test.
    """
    subject = f"{topic}-value"
    additive = load_version(write_candidate(tmp_path, new_type=False), NEXT_VERSION)
    assert not check_all(candidates=[additive.path], samples=5)
    (row,) = register_versions(url, subject, versions=(additive,))
    assert row.action == "registered"
    assert registry_client(url).get_compatibility(subject) == "FULL_TRANSITIVE"
    with_type = tmp_path / "with-type"
    with_type.mkdir()
    assert registry_accepts(url, subject, load_version(write_candidate(with_type), NEXT_VERSION + 1)) is False

    event, body = _event(), BytesIO()
    schemaless_writer(body, additive.parsed, {**EventCodec()._to_record(event), "labels": "canary"})
    value = b"\x00" + int(row.schema_id or 0).to_bytes(4, "big") + body.getvalue()
    assert EventCodec(schema_registry_url=url).decode(value, topic=topic) == event


def test_schemas_publish_cli_registers_at_full_transitive(url: str, tmp_path: Path) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RUNJOURNAL_")},
           "RUNJOURNAL_TOPIC_PREFIX": prefix, "RUNJOURNAL_STACK_DIR": str(tmp_path / "stack")}
    out = subprocess.run([*RUNJOURNAL, "schemas", "publish", "--registry", url, "--json"], capture_output=True,
                         text=True, env=env, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] and report["subject"] == f"{prefix}.events-value" and report["policy"] == "FULL_TRANSITIVE"
    assert [r["version"] for r in report["registered"]] == REGISTERED
    assert registry_client(url).get_compatibility(f"{prefix}.events-value") == "FULL_TRANSITIVE"
    bad = subprocess.run([*RUNJOURNAL, "schemas", "publish", "--registry", "http://127.0.0.1:1/apis/ccompat/v6",
                          "--json"], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert bad.returncode == 1 and bad.stdout == ""
    assert json.loads(bad.stderr)["error"] == "RegistryError"

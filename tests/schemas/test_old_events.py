"""Old events in new code, end to end: v1 records on the real topic, the current projector reading them.

v1 events are resolved and upcast into the current shape (0-based attempts → 1-based, timeout
seconds → ms, ``instance_id`` → ``producer_id``) and projected as such; a record written with a schema
this reader does not know is never guessed at: it lands in the DLQ with ``UnsupportedSchemaError``
and its source offset, and its run is BLOCKED while the partition's other runs go on.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from io import BytesIO
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from fastavro import schemaless_writer

from runjournal.consumers.ops.inspect import read_run_events
from runjournal.consumers.projector import Projector
from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.model.reducer import CallStatus, RunStatus, fold, state_digest
from runjournal.schemas import Event, EventType, load_versions
from runjournal.schemas.keys import partition_for
from runjournal.schemas.versions import payload_record_name
from tests.schemas.test_fixture import MANIFEST, RECORDS, _expected
from tests.support.workload import publish

pytestmark = [pytest.mark.integration]

_AT = datetime(2024, 3, 1, 12, tzinfo=UTC)
_TOOL = {"call_id": "c1", "tool": "send_email", "idempotency_key": "k1", "args_digest": "a" * 64}

#: A complete run as a v1 writer published it (v1 meaning: attempt 0-based, timeout in whole seconds).
CLEAN_V1_RUN: list[tuple[str, str | None, dict[str, Any]]] = [
    ("RUN_STARTED", None, {"agent": "mailer", "input_json": "{}", "user_id": "u-1"}),
    ("NODE_STARTED", "plan/send", {"node_path": "plan/send", "attempt": 0}),
    ("TOOL_CALL_INTENDED", "plan/send", {**_TOOL, "side_effect": True, "attempt": 0, "timeout_s": 5,
                                         "args_json": '{"to": "ana"}'}),
    ("TOOL_CALL_COMMITTED", "plan/send", {**_TOOL, "result_json": '{"id": 7}', "result_ref": None,
                                          "result_digest": "r" * 64}),
    ("NODE_SUCCEEDED", "plan/send", {"node_path": "plan/send", "output_digest": None}),
    ("RUN_SUCCEEDED", None, {"output_json": '{"ok": true}'}),
]


def v1_bytes(run_id: str, seq: int, symbol: str, node_id: str | None, payload: dict[str, Any]) -> bytes:
    """One envelope-v1 record value (single-object encoding), written with the v1 .avsc, not the codec."""
    v1 = load_versions()[0]
    body = BytesIO()
    envelope = {"event_id": str(uuid.UUID(int=seq)), "run_id": run_id, "tenant_id": "tenant-a", "seq": seq,
                "epoch": 1, "instance_id": "agent-v1", "type": symbol, "occurred_at": _AT + timedelta(seconds=seq),
                "node_id": node_id, "payload": (payload_record_name(symbol), payload)}
    schemaless_writer(body, v1.parsed, envelope)
    return v1.header + body.getvalue()


def unknown_fingerprint_value() -> bytes:
    fingerprint = 0x0123_4567_89AB_CDEF
    assert fingerprint not in {v.fingerprint for v in load_versions()}
    return b"\xc3\x01" + fingerprint.to_bytes(8, "little") + b"\x02a-body-no-reader-knows"


def dlq_records(settings: Settings) -> list[tuple[str, dict[str, bytes], bytes]]:
    consumer = kafka.consumer(settings, **{"group.id": f"dlq-{uuid.uuid4()}",
                         "enable.auto.commit": False})
    out = []
    try:
        meta = consumer.list_topics(settings.events_dlq_topic, timeout=10).topics[settings.events_dlq_topic]
        for p in meta.partitions:
            tp = TopicPartition(settings.events_dlq_topic, p)
            end = consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1]
            if end == 0:
                continue
            consumer.assign([TopicPartition(settings.events_dlq_topic, p, OFFSET_BEGINNING)])
            while consumer.position([tp])[0].offset < end:
                for msg in consumer.consume(100, timeout=1):
                    if not msg.error():
                        out.append((msg.key().decode(), dict(msg.headers() or []), msg.value()))
    finally:
        consumer.close()
    return out


def test_old_event_fixture_in_new_code_migrates_or_fails_with_an_explicit_unsupported_error(topics: Settings) -> None:
    """Seed table: old event fixture in new code → migrates, or fails with an explicit unsupported error."""
    golden = [MANIFEST["events"][i]["expected"] for i in range(len(RECORDS))]
    mixed_start = Event(event_id=str(uuid.uuid4()), run_id="run-mixed", tenant_id="tenant-a", seq=1, epoch=1,
                        producer_id="agent-new", type=EventType.RUN_STARTED, occurred_at=_AT,
                        payload={"agent": "mailer", "input_json": "{}", "user_id": None})
    mixed_after = Event(event_id=str(uuid.uuid4()), run_id="run-mixed", tenant_id="tenant-a", seq=3, epoch=1,
                        producer_id="agent-new", type=EventType.MESSAGE, occurred_at=_AT,
                        payload={"role": "assistant", "content": "after the unknown record", "user_id": None})
    publish(topics, [
        *((f"{e['run_id']}:{e['epoch']}:{e['seq']}", value) for e, value in zip(golden, RECORDS, strict=True)),
        *((f"run-v1-clean:1:{seq}", v1_bytes("run-v1-clean", seq, *spec)) for seq, spec in enumerate(CLEAN_V1_RUN, 1)),
        mixed_start, ("run-mixed:1:2", unknown_fingerprint_value()), mixed_after,
    ])

    projector = Projector(topics)
    stats = projector.run(until_caught_up=True, idle_timeout_s=60)
    store = projector.store
    assert stats.dead_lettered == 1 and stats.blocked_runs == {"run-mixed"}

    # migrates: the golden v1 records read back from the topic are the current shape, and the projected
    # state is exactly the fold of those current-shape events at their offsets
    rows = read_run_events(topics, "run-v1")
    assert [row["event"] for row in rows] == [_expected(e) for e in golden]
    p_golden = partition_for("run-v1", topics.partitions)
    reference = fold((_expected(e), p_golden, row["offset"]) for e, row in zip(golden, rows, strict=True))
    projected = store.get(p_golden, "run-v1")
    assert state_digest(projected) == state_digest(reference)
    assert "RUN_STARTED" in projected.blocked_reason  # the fixture's second RUN_STARTED breaks the contract,
    assert "Schema" not in projected.blocked_reason  # not the schema: every record decoded

    # migrates: a complete v1 run is projected with v2 meaning
    clean = store.get(partition_for("run-v1-clean", topics.partitions), "run-v1-clean")
    assert clean.status is RunStatus.SUCCEEDED and clean.owner == "agent-v1" and clean.last_seq == 6
    assert clean.nodes["plan/send"].attempt == 1  # v1 0-based attempt 0 is attempt 1
    (record,) = clean.records.values()
    assert record.status is CallStatus.COMMITTED and record.attempts == 1 and record.result_json == '{"id": 7}'
    assert record.timeout_ms == 5000  # v1 timeout_s=5 seconds

    # fails explicitly: the unknown writer schema is quarantined with its offset, its run BLOCKED
    p_mixed = partition_for("run-mixed", topics.partitions)
    unknown_offset = next(r["offset"] for r in read_run_events(topics, "run-mixed") if r["type"] == "UNDECODABLE")
    (dead,) = dlq_records(topics)
    key, headers, value = dead
    assert key == "run-mixed:1:2" and value == unknown_fingerprint_value()
    assert headers["rj.error.type"] == b"UnsupportedSchemaError"
    assert headers["rj.source.partition"] == str(p_mixed).encode()
    assert headers["rj.source.offset"] == str(unknown_offset).encode()
    mixed = store.get(p_mixed, "run-mixed")
    assert mixed.status is RunStatus.BLOCKED and mixed.last_seq == 1
    assert "UnsupportedSchemaError" in mixed.blocked_reason and f"offset {unknown_offset}" in mixed.blocked_reason
    assert mixed.skipped_while_parked == 1  # seq 3 is not applied over the hole: never guessed at

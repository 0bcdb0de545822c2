"""Write the golden v1 fixture: ``python -m runjournal.schemas.tools.make_v1_fixture`` (run once; then frozen).

Produces, under ``tests/fixtures/``:

* ``v1_events.bin`` — envelope **v1** events, one or more of every type, each as a 4-byte
  big-endian length followed by the Avro single-object bytes (``C3 01`` + v1 fingerprint + body);
* ``v1_events.json`` — manifest: for each event, its byte range and the value the *current*
  codec must decode it to (current Event shape, after Avro resolution and upcasting).

The bytes are written with fastavro and the v1 ``.avsc`` directly, not with the codec, and the
expected values follow the v1 → v2 rules spelled out below, not ``runjournal.schemas.upcasters``: the
fixture is an independent witness. It refuses to overwrite an existing fixture without ``--force``.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from io import BytesIO
from pathlib import Path
from typing import Any

from fastavro import schemaless_writer

from runjournal.schemas.versions import ENVELOPE_DIR, load_version, payload_record_name

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures"
BASE_TIME = datetime(2024, 3, 1, 12, 0, 0, 123000, tzinfo=UTC)
_TOOL = {
    "call_id": "call-1",
    "tool": "send_email",
    "idempotency_key": "run-v1:plan/send:0",
    "args_digest": "a" * 64,
}

#: (type symbol, node_id, v1 payload): one or more events of every type, as v1 wrote them.
V1_EVENTS: list[tuple[str, str | None, dict[str, Any]]] = [
    ("RUN_STARTED", None, {"agent": "mailer", "input_json": '{"to": "ana@example.com"}', "user_id": "u-1"}),
    ("RUN_STARTED", None, {"agent": "mailer", "input_json": "{}", "user_id": None}),
    (
        "PLAN_COMPILED",
        None,
        {"plan_hash": "p" * 64, "code_version": "1.0.0", "nodes": ["plan/draft", "plan/send"]},
    ),
    ("NODE_STARTED", "plan/draft", {"node_path": "plan/draft", "attempt": 0}),
    ("NODE_SUCCEEDED", "plan/draft", {"node_path": "plan/draft", "output_digest": "d" * 64}),
    ("NODE_FAILED", "plan/draft", {"node_path": "plan/draft", "error": "timeout", "retryable": True}),
    (
        "TOOL_CALL_INTENDED",
        "plan/send",
        {**_TOOL, "side_effect": True, "attempt": 0, "timeout_s": 30, "args_json": '{"subject": "héllo ✉"}'},
    ),
    (
        "TOOL_CALL_INTENDED",
        "plan/send",
        {**_TOOL, "side_effect": False, "attempt": 2, "timeout_s": 1, "args_json": None},
    ),
    (
        "TOOL_CALL_COMMITTED",
        "plan/send",
        {**_TOOL, "result_json": '{"id": 7}', "result_ref": None, "result_digest": "r" * 64},
    ),
    ("TOOL_CALL_FAILED", "plan/send", {**_TOOL, "error": "503", "retryable": True}),
    (
        "TOOL_CALL_RECONCILED",
        "plan/send",
        {
            **_TOOL,
            "outcome": "COMMITTED",
            "result_json": None,
            "result_ref": "s3://bucket/r1",
            "result_digest": "r" * 64,
        },
    ),
    (
        "APPROVAL_REQUESTED",
        "plan/send",
        {"call_id": "call-1", "reason": "external email", "tool": "send_email"},
    ),
    ("APPROVAL_GRANTED", "plan/send", {"call_id": "call-1", "approver": "boss", "comment": None}),
    ("APPROVAL_DENIED", "plan/send", {"call_id": "call-1", "approver": "boss", "reason": "not now"}),
    (
        "RUN_RESUMED",
        None,
        {"previous_epoch": 1, "recovered_by": "recovery-1", "plan_json": "{}", "assigned_to": "agent-b"},
    ),
    ("RUN_SUCCEEDED", None, {"output_json": '{"ok": true}'}),
    ("RUN_FAILED", None, {"error": "gave up"}),
    ("RUN_CANCELLED", None, {"reason": "user cancelled"}),
    ("USER_CORRECTION", None, {"subject": "tone", "text": "less formal, s'il vous plaît", "user_id": "u-1"}),
    ("MESSAGE", None, {"role": "assistant", "content": "Done.", "user_id": None}),
]


def expected_current(symbol: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The v1 payload with v2 meaning: attempt 0-based → 1-based; timeout_s (seconds) → timeout_ms (ms)."""
    out = dict(payload)
    if symbol in ("NODE_STARTED", "TOOL_CALL_INTENDED"):
        out["attempt"] = payload["attempt"] + 1
    if symbol == "TOOL_CALL_INTENDED":
        out["timeout_ms"] = out.pop("timeout_s") * 1000
    return out


def build() -> tuple[bytes, dict[str, Any]]:
    """``(bin file bytes, manifest)`` for :data:`V1_EVENTS`."""
    v1 = load_version(ENVELOPE_DIR / "v1.avsc")
    blob, entries = BytesIO(), []
    for seq, (symbol, node_id, payload) in enumerate(V1_EVENTS, 1):
        epoch = 2 if seq > 14 else 1
        envelope = {
            "event_id": f"00000000-0000-4000-8000-{seq:012d}",
            "run_id": "run-v1",
            "tenant_id": "tenant-a",
            "seq": seq,
            "epoch": epoch,
            "instance_id": "agent-a" if epoch == 1 else "agent-b",
            "type": symbol,
            "occurred_at": BASE_TIME + timedelta(seconds=seq),
            "node_id": node_id,
        }
        body = BytesIO()
        schemaless_writer(body, v1.parsed, {**envelope, "payload": (payload_record_name(symbol), payload)})
        value = v1.header + body.getvalue()
        start = blob.tell() + 4
        blob.write(len(value).to_bytes(4, "big") + value)
        expected = {k: v for k, v in envelope.items() if k != "instance_id"}
        expected.update(
            producer_id=envelope["instance_id"],
            occurred_at=envelope["occurred_at"].isoformat(),
            traceparent=None,
            payload=expected_current(symbol, payload),
        )
        entries.append({"start": start, "length": len(value), "hex": value.hex(), "expected": expected})
    manifest = {
        "about": "Envelope v1 events (single-object encoding) and what the current codec decodes them to.",
        "format": "v1_events.bin: repeated [4-byte big-endian length][value]",
        "writer_schema": "schemas/avro/envelope/v1.avsc",
        "writer_fingerprint": f"{v1.fingerprint:#018x}",
        "events": entries,
    }
    return blob.getvalue(), manifest


def main(argv: list[str]) -> int:
    """Write the fixture files; returns the exit code (1 when they exist and ``--force`` is absent)."""
    bin_path, json_path = FIXTURES / "v1_events.bin", FIXTURES / "v1_events.json"
    if (bin_path.exists() or json_path.exists()) and "--force" not in argv:
        print(f"refusing to overwrite the frozen fixture in {FIXTURES} (use --force)", file=sys.stderr)
        return 1
    data, manifest = build()
    FIXTURES.mkdir(parents=True, exist_ok=True)
    bin_path.write_bytes(data)
    json_path.write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(manifest['events'])} v1 events ({len(data)} bytes) to {bin_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

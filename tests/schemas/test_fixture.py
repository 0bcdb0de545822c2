"""The golden v1 fixture (frozen bytes) decodes into the current Event shape, forever."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from runjournal.schemas import KNOWN_TYPES, Event, EventCodec, EventType, load_versions

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BIN = FIXTURES / "v1_events.bin"
MANIFEST = json.loads((FIXTURES / "v1_events.json").read_text(encoding="utf-8"))
#: The fixture is frozen: regenerating it is not a way to make this suite pass.
BIN_SHA256 = "01e3373080ceaa535d3cc182c1ae741df8e31b8e128c634e940d083dec7d3991"


def _records(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        out.append(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    assert pos == len(data)
    return out


RECORDS = _records(BIN.read_bytes())


def test_fixture_is_frozen() -> None:
    assert hashlib.sha256(BIN.read_bytes()).hexdigest() == BIN_SHA256
    assert [bytes.fromhex(e["hex"]) for e in MANIFEST["events"]] == RECORDS


def test_fixture_is_v1_and_covers_every_type() -> None:
    v1 = load_versions()[0]
    assert MANIFEST["writer_fingerprint"] == f"{v1.fingerprint:#018x}"
    assert all(record[:10] == v1.header for record in RECORDS)
    assert {e["expected"]["type"] for e in MANIFEST["events"]} == {t.value for t in KNOWN_TYPES}


def _expected(values: dict[str, Any]) -> Event:
    return Event(
        **{
            **values,
            "type": EventType(values["type"]),
            "occurred_at": datetime.fromisoformat(values["occurred_at"]),
        }
    )


@pytest.mark.parametrize("index", range(len(MANIFEST["events"])))
def test_v1_event_decodes_to_current_shape(index: int) -> None:
    entry = MANIFEST["events"][index]
    decoded = EventCodec().decode(RECORDS[index], topic="fixture", partition=0, offset=index)
    assert decoded == _expected(entry["expected"])

"""Issue 33's shredding acceptance: ``runjournal erase --tenant T --subject U`` destroys the user's key, and then a
dead-letter copy of the user's events, the raw segment files of the broker's log directory, a Redis backup (an RDB
dump) and an archived copy (the records' bytes kept in a file, as an archive keeps them) no longer yield the text —
while before the erase each did, and another user's content still does. ``--tenant`` alone shreds the tenant and
every user of it. Real broker and Redis; the command runs as a user runs it (a subprocess)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from runjournal.core import kafka
from runjournal.core.crypto import (
    Binding,
    FieldCipher,
    KeyDestroyedError,
    KeyScope,
    LocalKeyDirectory,
    parse_token,
)
from runjournal.core.crypto.cipher import _dek_context
from runjournal.core.settings import Settings
from runjournal.producers import Journal
from runjournal.producers.encryption import CONTENT_FIELDS, address_of
from runjournal.schemas import codec_from_settings
from tests.conftest import Endpoints
from tests.support.at_rest import rdb_dump, segment_bytes
from tests.support.provider import project
from tests.support.readback import topic_messages

pytestmark = [pytest.mark.integration]

TOKEN = re.compile(rb"rjenc:1:[A-Za-z0-9_-]+:[0-9]+:[A-Za-z0-9_-]+:[A-Za-z0-9_-]+:[A-Za-z0-9_-]+")


class Echo:
    name = "echo"
    side_effect = True
    timeout_ms = 2000

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        return {"echo": args["text"]}


def raw_records(settings: Settings, topic: str) -> list[bytes]:
    return [m.value() for m in topic_messages(settings, topic)]


def dead_letter(settings: Settings, values: list[bytes]) -> None:
    """Copies of the events on the dead-letter topic, as the projector writes a record it quarantines."""
    producer = kafka.producer(settings)
    for value in values:
        producer.produce(settings.events_dlq_topic, value=value)
    assert producer.flush(30) == 0


def readable(keys: Path, copies: dict[str, list[bytes]], kek_id: str) -> dict[str, int]:
    """Per copy, how many of ``kek_id``'s tokens in it still yield their data key (an empty copy fails the test)."""
    kms = LocalKeyDirectory(keys)
    out = {}
    for where, blobs in copies.items():
        tokens = {t.decode() for blob in blobs for t in TOKEN.findall(blob)}
        mine = [parse_token(t) for t in tokens if parse_token(t).kek_id == kek_id]
        assert mine, f"{where}: no token of the subject found: the check would prove nothing"
        ok = 0
        for token in mine:
            try:
                kms.unwrap(token.kek_id, token.version, token.wrapped, _dek_context(token.dek_id))
                ok += 1
            except KeyDestroyedError:
                pass
        out[where] = ok if ok == len(mine) else -ok  # all readable: the count; none: 0; mixed: negative
    return out


def decoded_fields(settings: Settings, values: list[bytes]) -> list[tuple[str, Binding]]:
    codec = codec_from_settings(settings)
    out = []
    for value in values:
        event = codec.decode(value, topic=settings.events_topic)
        for name, _ in CONTENT_FIELDS.get(event.type, ()):
            if event.payload.get(name) is not None:
                out.append((event.payload[name], Binding(event.run_id, address_of(event, name) or "", name)))
    return out


def erase(env: dict[str, str], *args: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "runjournal", "erase", *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dict(json.loads(proc.stdout))


def test_erase_subject_shreds_every_copy_and_keeps_other_users_readable(topics: Settings, endpoints: Endpoints,
                                                                        service_env: dict[str, str],
                                                                        tmp_path: Path) -> None:
    if not any(endpoints.stack_dir.rglob("meta.properties")):
        pytest.skip("the broker's data directory is not on this host (given endpoints)")
    keys = tmp_path / "keys"
    s = topics.model_copy(update={"encryption": "on", "keys_dir": keys})
    mark = f"MARKER-{uuid.uuid4().hex}"
    with Journal(s, producer_id="shred-writer", compression="none") as journal:
        for user in ("dave", "erin"):
            run = journal.start_run("acme", "agent", {"ask": f"{mark} {user}"}, user_id=user)
            run.call(Echo(), {"text": f"{mark} {user}"})
            run.message("user", f"{user} says {mark}")
            run.succeed({"out": mark})
    project(topics)
    events = raw_records(topics, topics.events_topic)
    dead_letter(topics, events)
    archived = tmp_path / "archived.bin"  # an archive's copy of the records: their bytes, kept elsewhere
    archived.write_bytes(b"\n".join(events))
    dave, erin = KeyScope("acme", "dave").kek_id, KeyScope("acme", "erin").kek_id

    def copies() -> dict[str, list[bytes]]:
        return {"dead-letter topic": raw_records(topics, topics.events_dlq_topic),
                "broker segment files": list(segment_bytes(endpoints.stack_dir, topics.topic_prefix).values()),
                "redis dump": [rdb_dump(topics)], "archived file": [archived.read_bytes()]}

    before = copies()
    assert all(n > 0 for n in readable(keys, before, dave).values())  # the check can fail: dave reads before
    env = {**service_env, "RUNJOURNAL_KEYS_DIR": str(keys)}
    report = erase(env, "--tenant", "acme", "--subject", "dave", "--yes", "--json")
    assert report["shredded"] == [{"scope": "subject", "kek_id": dave, "destroyed": True}]
    assert report["deleted"] == [] and "unreadable" in report["note"]
    after = copies()
    assert readable(keys, after, dave) == dict.fromkeys(after, 0)  # every copy: not one token of dave's reads
    assert all(n > 0 for n in readable(keys, after, erin).values())  # erin untouched
    cipher = FieldCipher(LocalKeyDirectory(keys))
    dlq_fields = decoded_fields(topics, raw_records(topics, topics.events_dlq_topic))
    shown = {}
    for value, binding in dlq_fields:
        try:
            shown[value] = cipher.decrypt(value, binding)
        except KeyDestroyedError:
            shown[value] = None
    assert any(v is None for v in shown.values()) and any(v and "erin" in v for v in shown.values())
    assert not any(v and "dave" in v for v in shown.values())
    again = erase(env, "--tenant", "acme", "--subject", "dave", "--yes", "--json")  # idempotent
    assert again["shredded"] == [{"scope": "subject", "kek_id": dave, "destroyed": False}]
    whole = erase(env, "--tenant", "acme", "--yes", "--json")  # the tenant and its remaining users
    assert {(k["kek_id"], k["destroyed"]) for k in whole["shredded"]} == {(KeyScope("acme").kek_id, True),
                                                                          (erin, True)}
    assert readable(keys, copies(), erin) == dict.fromkeys(after, 0)


def test_erase_needs_a_run_or_a_tenant_not_both(service_env: dict[str, str]) -> None:
    for args in (["--yes", "--json"], ["r1", "--tenant", "acme", "--yes", "--json"],
                 ["--subject", "dave", "--yes", "--json"]):
        proc = subprocess.run([sys.executable, "-m", "runjournal", "erase", *args], env=service_env,
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 2 and json.loads(proc.stderr.strip().splitlines()[-1])["error"] == "UsageError"

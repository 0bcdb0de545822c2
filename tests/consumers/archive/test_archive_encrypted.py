"""The archive with encryption on (issue 33, decisions 0056, 0058 and 0059), on the real broker and Redis and a local
archive folder: an archived run keeps its tokens, and the archive's readers — ``runjournal query`` (the ``events``
table's ``payload_json``), ``replay`` and ``inspect`` of an archived run — show its content opened with the key
directory, ``encrypted`` without it (never a token as if it were text), and ``encrypted`` for everyone once the
user's key is erased. An archived FAILED run continued with encryption on resumes with its plain input and recorded
results (a large one read from the archive): the restored tokens stay bound to the same run."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from runjournal.consumers.archive import archive_run, read_archived
from runjournal.consumers.recovery import continue_run
from runjournal.core.crypto import is_encrypted
from runjournal.core.settings import Settings
from runjournal.producers import Journal
from runjournal.schemas import codec_from_settings
from tests.consumers.archive.test_continue_archived import _payloads_compacted_away

pytestmark = pytest.mark.integration


class Echo:
    """Returns its text, padded to ``pad`` characters (a large result goes by reference); counts its calls."""

    side_effect = True
    timeout_ms = 2000

    def __init__(self, name: str, pad: int = 0) -> None:
        self.name = name
        self.pad = pad
        self.calls = 0

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        self.calls += 1
        return {"echo": args["text"], "pad": "x" * self.pad}


@pytest.fixture
def archived(topics: Settings, tmp_path: Path) -> Settings:
    return topics.model_copy(update={"archive_url": (tmp_path / "archive").as_uri(), "encryption": "on",
                                     "keys_dir": tmp_path / "keys", "payload_chunk_bytes": 8192})


def cli(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "runjournal", *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_the_archives_readers_open_tokens_with_the_key_show_encrypted_without_and_after_erasure(
        archived: Settings, service_env: dict[str, str], tmp_path: Path) -> None:
    mark = f"MARKER-{uuid.uuid4().hex}"
    with Journal(archived, producer_id=f"arc-enc-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("acme", "agent", {"ask": mark}, user_id="alice")
        run.call(Echo("echo"), {"text": mark})
        run.message("user", f"I said {mark}")
        run.succeed({"out": mark})
    archive_run(archived, run.run_id)
    stored = read_archived(archived, run.run_id)
    assert stored is not None and not any(mark.encode() in r["value"] for r in stored.rows if r["value"])
    codec = codec_from_settings(archived)
    assert any(is_encrypted(codec.decode(r["value"]).payload.get("input_json")) for r in stored.rows
               if r["source"] == "events")  # the archive holds tokens: shredding reaches it

    base = {**service_env, "RUNJOURNAL_ARCHIVE_URL": str(archived.archive_url)}
    keys = {**base, "RUNJOURNAL_KEYS_DIR": str(archived.keys_dir)}
    nokeys = {**base, "RUNJOURNAL_KEYS_DIR": str(tmp_path / "not-these-keys")}
    sql = f"SELECT type, payload_json FROM events WHERE run_id = '{run.run_id}' ORDER BY \"offset\""

    def payloads(env: dict[str, str]) -> dict[str, dict[str, Any]]:
        rows = json.loads(cli(env, "query", sql, "--json", "--no-live"))
        assert "rjenc:" not in json.dumps(rows)  # never a token shown as text
        return {r["type"]: json.loads(r["payload_json"]) for r in rows}

    opened = payloads(keys)
    assert json.loads(opened["RUN_STARTED"]["input_json"]) == {"ask": mark}
    assert json.loads(opened["TOOL_CALL_INTENDED"]["args_json"]) == {"text": mark}
    assert json.loads(opened["TOOL_CALL_COMMITTED"]["result_json"])["echo"] == mark
    assert mark in opened["MESSAGE"]["content"] and json.loads(opened["RUN_SUCCEEDED"]["output_json"]) == {
        "out": mark}
    hidden = payloads(nokeys)
    assert mark not in json.dumps(hidden)
    assert hidden["RUN_STARTED"]["input_json"] == "encrypted" and hidden["MESSAGE"]["content"] == "encrypted"

    def shown(env: dict[str, str], command: str) -> dict[str, Any]:
        out = cli(env, command, run.run_id, "--json")
        assert "rjenc:" not in out
        report = json.loads(out)
        assert report["archived"]
        return dict(report["state"])

    for command in ("replay", "inspect"):
        state = shown(keys, command)
        assert json.loads(state["input_json"]) == {"ask": mark} and json.loads(state["output_json"]) == {"out": mark}
        state = shown(nokeys, command)
        assert state["input_json"] == "encrypted" and state["output_json"] == "encrypted"

    cli(keys, "erase", "--tenant", "acme", "--subject", "alice", "--yes", "--json")  # crypto-shredding
    after = payloads(keys)
    assert mark not in json.dumps(after) and after["RUN_STARTED"]["input_json"] == "encrypted"
    for command in ("replay", "inspect"):
        state = shown(keys, command)
        assert state["input_json"] == "encrypted" and mark not in json.dumps(state)


def test_a_continued_archived_run_resumes_with_its_plain_input_and_results(archived: Settings) -> None:
    mark = f"MARKER-{uuid.uuid4().hex}"
    fetch, book = Echo("fetch", pad=20_000), Echo("book")  # fetch's result goes by reference (payloads topic)

    def agent(run: Any) -> tuple[Any, Any]:
        with run.node("fetch"):
            page = run.call(fetch, {"text": mark + "-page"})
        with run.node("book"):
            booking = run.call(book, {"text": mark + "-book"})
        return page, booking

    with Journal(archived, producer_id=f"first-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("acme", "travel", {"ask": mark}, user_id="bob")
        agent(run)
        run.fail("payment provider down")
    archive_run(archived, run.run_id)
    _payloads_compacted_away(archived)  # the large result's (sealed) records exist only in the archive now

    with Journal(archived, producer_id=f"op-{uuid.uuid4().hex[:6]}") as journal:
        continued = continue_run(journal, run.run_id, max_wait_s=5)
        with continued:
            assert continued.input == {"ask": mark}  # opened: bound to the same run id
            page, booking = agent(continued)
            continued.succeed({"done": mark})
    assert page == {"echo": mark + "-page", "pad": "x" * 20_000} and booking == {"echo": mark + "-book", "pad": ""}
    assert fetch.calls == 1 and book.calls == 1, "no committed call ran again"

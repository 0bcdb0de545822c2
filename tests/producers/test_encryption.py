"""The journal's write path with encryption on (issue 33, decision 0059), on the real broker and Redis: every content
field leaves the agent as a token bound to its run, the digests stay those of the plain text, the projector and the
recovery job work without any key, a resumed run reads its recorded input and results back in plain text and writes
under its subject's key, ``inspect`` shows content to a reader with the key and ``encrypted`` to one without, and
the memory extractor's rules turn no token into memory."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from runjournal.consumers.memory.extract import RuleExtractor
from runjournal.consumers.ops.inspect import inspect_run, read_run_events
from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core.crypto import Binding, FieldCipher, KeyScope, LocalKeyDirectory, is_encrypted, parse_token
from runjournal.core.settings import Settings
from runjournal.producers import Journal, canonical_json, digest
from runjournal.producers.encryption import CONTENT_FIELDS, ENCRYPTED, address_of
from runjournal.schemas import EventType
from tests.support.provider import project

pytestmark = pytest.mark.integration


class Echo:
    """Returns its text, padded to ``pad`` characters (a large result goes by reference)."""

    name = "echo"
    side_effect = True
    timeout_ms = 2000

    def __init__(self, pad: int = 0) -> None:
        self.pad = pad
        self.calls = 0

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        self.calls += 1
        return {"echo": args["text"], "pad": "x" * self.pad}


def encrypted(settings: Settings, keys: Path, on: bool = True) -> Settings:
    return settings.model_copy(update={"encryption": "on" if on else "off", "keys_dir": keys})


def contents(settings: Settings, run_id: str) -> list[tuple[Any, str, str]]:
    """``(event, field, stored value)`` of every content field of the run's events."""
    out = []
    for row in read_run_events(settings, run_id):
        event = row.get("event")
        if event is None:
            continue
        for name, _ in CONTENT_FIELDS.get(event.type, ()):
            if event.payload.get(name) is not None:
                out.append((event, name, event.payload[name]))
    return out


def test_an_encrypted_run_is_written_projected_and_read_back(topics: Settings, tmp_path: Path) -> None:
    mark = f"MARKER-{uuid.uuid4().hex}"
    s = encrypted(topics, tmp_path / "keys")
    with Journal(s, producer_id="enc-writer", inline_result_bytes=256) as journal:
        run = journal.start_run("acme", "agent", {"ask": mark}, user_id="alice")
        small = run.call(Echo(), {"text": mark})
        large = run.call(Echo(pad=2000), {"text": mark + "-large"})
        run.message("user", f"I prefer {mark}")
        run.correction("seat", f"window seat {mark}")
        run.succeed({"out": mark})
    assert small["echo"] == mark and large["echo"] == mark + "-large"  # the caller gets plain values
    fields = contents(s, run.run_id)
    assert {(e.type, f) for e, f, _ in fields} >= {(EventType.RUN_STARTED, "input_json"),
                                                   (EventType.TOOL_CALL_INTENDED, "args_json"),
                                                   (EventType.TOOL_CALL_COMMITTED, "result_json"),
                                                   (EventType.MESSAGE, "content"),
                                                   (EventType.USER_CORRECTION, "text"),
                                                   (EventType.RUN_SUCCEEDED, "output_json")}
    reader = FieldCipher(LocalKeyDirectory(tmp_path / "keys"))
    alice = KeyScope("acme", "alice").kek_id
    for event, name, stored in fields:
        assert is_encrypted(stored) and mark not in stored, (event.type, name)
        assert parse_token(stored).kek_id == alice  # the run's subject's key, for every field
        plain = reader.decrypt(stored, Binding(run.run_id, address_of(event, name) or "", name))
        assert mark in plain or (name, plain) == ("subject", "seat")
        if name == "args_json":  # idempotency and recovery: digests of the plain text, in clear
            assert event.payload["args_digest"] == digest(plain)
        if name == "result_json":
            assert event.payload["result_digest"] == digest(plain)
    committed = [e for e, _, _ in fields if e.type is EventType.TOOL_CALL_COMMITTED]
    by_ref = [row["event"] for row in read_run_events(s, run.run_id) if row.get("event") is not None
              and row["event"].type is EventType.TOOL_CALL_COMMITTED and row["event"].payload["result_ref"]]
    assert len(committed) == 1 and len(by_ref) == 1
    assert by_ref[0].payload["result_digest"] == digest(canonical_json(large))

    project(topics)
    shown = inspect_run(s, run.run_id, with_timeline=False)  # the projector ran without a key
    assert shown is not None and shown["state"]["status"] == "SUCCEEDED"
    assert json.loads(shown["state"]["input_json"]) == {"ask": mark}
    assert json.loads(shown["state"]["output_json"]) == {"out": mark}
    record = next(r for r in shown["state"]["records"].values() if r["result_json"])
    assert json.loads(record["result_json"])["echo"] == mark
    keyless = inspect_run(topics.model_copy(update={"keys_dir": tmp_path / "no-keys"}), run.run_id,
                          with_timeline=False)
    assert keyless is not None and keyless["state"]["input_json"] == ENCRYPTED
    assert keyless["state"]["status"] == "SUCCEEDED"  # the structure is all there

    extractor = RuleExtractor()  # holds no key: encrypted messages and corrections make no memory
    drafts = [d for row in read_run_events(s, run.run_id) if row.get("event") is not None
              for d in extractor.extract(row["event"], None)]
    assert all(mark not in d.text and "rjenc:" not in d.text for d in drafts)


def test_a_resumed_encrypted_run_reads_its_records_and_writes_under_its_subject(topics: Settings,
                                                                                tmp_path: Path) -> None:
    mark = f"MARKER-{uuid.uuid4().hex}"
    s = encrypted(topics, tmp_path / "keys")
    tool = Echo(pad=2000)  # by reference: the payloads topic's copy is sealed too
    first = Journal(s, producer_id="enc-first", inline_result_bytes=256)
    run = first.start_run("acme", "agent", {"ask": mark}, user_id="bob")
    recorded = run.call(tool, {"text": mark})
    first.close()
    with Journal(s, producer_id="enc-second") as second:
        project(topics)
        report = RecoveryJob(topics).recover(runs=[run.run_id], force=True, assign_to=second.producer_id)
        assert report is not None
        resumed = second.resume(run.run_id)
        assert resumed.input == {"ask": mark}  # the plan's input, opened
        assert resumed.call(tool, {"text": mark}) == recorded and tool.calls == 1  # recorded, read back in clear
        resumed.succeed({"out": mark})
    outputs = [(e, f, v) for e, f, v in contents(s, run.run_id) if e.type is EventType.RUN_SUCCEEDED]
    assert len(outputs) == 1 and is_encrypted(outputs[0][2])
    assert parse_token(outputs[0][2]).kek_id == KeyScope("acme", "bob").kek_id  # the plan carried the subject


def test_a_journal_without_encryption_writes_plain_text_and_escapes_the_prefix(topics: Settings,
                                                                               tmp_path: Path) -> None:
    s = encrypted(topics, tmp_path / "keys", on=False)
    with Journal(s, producer_id="plain-writer") as journal:
        run = journal.start_run("acme", "agent", {"ask": "plain"})
        run.message("user", "rjenc:1:not-a-token")
        run.succeed(None)
    stored = {f: v for _, f, v in contents(s, run.run_id)}
    assert stored["input_json"] == canonical_json({"ask": "plain"})
    assert stored["content"] == "rjenc:0:rjenc:1:not-a-token" and not is_encrypted(stored["content"])
    assert not (tmp_path / "keys").exists()  # off: no key directory is ever made


def test_a_fork_of_an_encrypted_run_reads_its_sources_tokens_through_its_lineage(topics: Settings,
                                                                                 tmp_path: Path) -> None:
    """The fork's history is written by the recovery producer, which holds no key: it copies the source's tokens,
    bound to the source run. The fork's owner reads them (input, an inline result, a result by reference) through
    the fork's lineage, and what the fork writes itself is bound to the fork."""
    from runjournal.consumers.ops.control import Operator
    from tests.consumers.ops.test_control import LEASE_MS

    mark = f"MARKER-{uuid.uuid4().hex}"
    s = encrypted(topics, tmp_path / "keys")
    small, large = Echo(), Echo(pad=2000)
    with Journal(s, producer_id=f"enc-{uuid.uuid4().hex[:6]}", lease_ttl_ms=LEASE_MS,
                 inline_result_bytes=256) as journal, Operator(topics, wait_s=10, poll_s=0.1) as operator:
        source = journal.start_run("acme", "agent", {"ask": mark}, user_id="frank")
        first = source.call(small, {"text": mark})
        second = source.call(large, {"text": mark})
        source.succeed({"out": mark})
        at = max(row["seq"] for row in read_run_events(s, source.run_id) if row.get("event") is not None
                 and row["event"].type is EventType.TOOL_CALL_COMMITTED)
        forked = operator.fork(source.run_id, at_seq=at, reason="again", requested_by="ops@test")
        assert forked.outcome == "forked", forked
        assert journal.claim_assignment(10) == forked.fork_run_id
        fork = journal.resume(forked.fork_run_id)
        assert fork.input == {"ask": mark}
        assert fork.call(small, {"text": mark}) == first and fork.call(large, {"text": mark}) == second
        assert (small.calls, large.calls) == (1, 1)  # recorded, decrypted: neither ran again
        fork.succeed({"out": "fork"})
    copied = [v for e, f, v in contents(s, forked.fork_run_id) if e.type is EventType.RUN_STARTED]
    assert len(copied) == 1 and is_encrypted(copied[0])
    own = [(e, f, v) for e, f, v in contents(s, forked.fork_run_id) if e.type is EventType.RUN_SUCCEEDED]
    reader = FieldCipher(LocalKeyDirectory(tmp_path / "keys"))
    assert json.loads(reader.decrypt(own[0][2], Binding(forked.fork_run_id, "run", "output_json"))) == {"out": "fork"}


def test_an_approvers_view_of_encrypted_arguments_needs_the_key(topics: Settings, tmp_path: Path) -> None:
    """APPROVAL_REQUESTED's arguments are content: the operator with the key directory sees them, one without sees
    ``encrypted`` — and the decision is written either way."""
    from runjournal.consumers.ops.approvals import submit_decision

    s = encrypted(topics, tmp_path / "keys")
    with Journal(s, producer_id="enc-approvals") as journal:
        run = journal.start_run("acme", "agent", {}, user_id="gina")
        run.request_approval("pay-1", "over budget", "pay", args={"card": "4111"})
        run.request_approval("pay-2", "over budget", "pay", args={"card": "5500"})
        project(topics)
        seen = submit_decision(s, run.run_id, "pay-1", granted=True, approver="ops")
        blind = submit_decision(topics.model_copy(update={"keys_dir": tmp_path / "none"}), run.run_id, "pay-2",
                                granted=False, approver="ops", reason="no")
        run.succeed(None)
    assert seen["args"] == {"card": "4111"} and seen["decision"] == "GRANTED"
    assert blind["args"] == ENCRYPTED and blind["decision"] == "DENIED"


def test_replay_of_an_encrypted_run_answers_from_the_recording_and_the_cli_shows_content_to_key_holders(
        topics: Settings, service_env: dict[str, str], tmp_path: Path) -> None:
    import subprocess
    import sys

    from runjournal.consumers.ops.replay import replay_run

    mark = f"MARKER-{uuid.uuid4().hex}"
    s = encrypted(topics, tmp_path / "keys")
    tool = Echo()

    def agent(run: Any) -> Any:
        out = run.call(tool, {"text": mark})
        run.message("user", f"hello {mark}")
        return out

    with Journal(s, producer_id="enc-replay") as journal:
        run = journal.start_run("acme", "agent", {"ask": mark}, user_id="hana")
        recorded = agent(run)
        run.succeed({"out": mark})
    again = replay_run(s, run.run_id, agent)
    assert again.value == recorded and again.mismatches == () and tool.calls == 1  # answered, matched, not run

    def cli(keys: Path) -> dict[str, Any]:
        env = {**service_env, "RUNJOURNAL_KEYS_DIR": str(keys)}
        proc = subprocess.run([sys.executable, "-m", "runjournal", "replay", run.run_id, "--json"], env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return dict(json.loads(proc.stdout))

    shown = cli(tmp_path / "keys")
    assert json.loads(shown["state"]["input_json"]) == {"ask": mark}
    assert json.loads(shown["execution_records"][0]["result_json"])["echo"] == mark
    blind = cli(tmp_path / "other-keys")
    assert blind["state"]["input_json"] == ENCRYPTED and blind["execution_records"][0]["result_json"] == ENCRYPTED
    assert mark not in json.dumps(blind)


def test_a_result_just_under_the_limit_is_recorded_though_its_token_is_over_it(topics: Settings,
                                                                              tmp_path: Path) -> None:
    """``max_result_bytes`` bounds the plain text (checked by the handle); the sealed token is 4/3 of it and must
    still be written by reference."""
    s = encrypted(topics, tmp_path / "keys").model_copy(update={"max_result_bytes": 2048})
    tool = Echo(pad=1900)
    with Journal(s, producer_id="enc-limit", inline_result_bytes=256) as journal:
        run = journal.start_run("acme", "agent", {}, user_id="ivan")
        out = run.call(tool, {"text": "x"})
        run.succeed(None)
    committed = [row["event"] for row in read_run_events(s, run.run_id) if row.get("event") is not None
                 and row["event"].type is EventType.TOOL_CALL_COMMITTED]
    assert out["pad"] == "x" * 1900 and len(committed) == 1
    assert committed[0].payload["result_ref"] and committed[0].payload["result_digest"] == digest(canonical_json(out))

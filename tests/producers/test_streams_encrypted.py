"""Durable streams with encryption on (issue 33, decisions 0055 and 0059), on the real broker and Redis: every chunk's
``data`` and an end's error text leave the agent as tokens under the run's user's key (read the topic raw: no
marker), the reader opens them with the key directory, shows ``encrypted`` with the error's name without it (the
console's reader, a reader with another key directory, ``runjournal stream`` without the keys), a chunk moved to
another position or segment fails its binding, and after ``runjournal erase --subject`` of that user no chunk opens
— while the stream goes on (gaps, ends and later chunks are still delivered)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import orjson
import pytest

from runjournal.consumers.streams import StreamReader, read_stream
from runjournal.core import kafka
from runjournal.core.crypto import KeyScope, is_encrypted
from runjournal.core.settings import Settings
from runjournal.producers import Journal
from runjournal.producers.streams import UnsealableStreamError
from tests.support.readback import topic_messages

pytestmark = pytest.mark.integration


def raw_stream(settings: Settings, run_id: str) -> list[tuple[int, bytes]]:
    """The run's records on ``{prefix}.streams``, raw: ``(partition, value)``."""
    return [(m.partition(), m.value()) for m in topic_messages(settings, settings.streams_topic, committed=False)
            if m.key() == run_id.encode()]


def events(settings: Settings, run_id: str, **kw: object) -> list[dict[str, object]]:
    with StreamReader(settings, run_id, **kw) as reader:  # type: ignore[arg-type]
        end, out = reader.high_watermark(), []
        while reader.position < end:
            out += [e.as_dict() for e in reader.poll(0.5)]
    return out


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "runjournal", *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_an_encrypted_stream_is_sealed_at_rest_opened_with_the_key_and_encrypted_without(
        topics: Settings, service_env: dict[str, str], tmp_path: Path) -> None:
    mark = f"MARKER-{uuid.uuid4().hex}"
    keys = tmp_path / "keys"
    s = topics.model_copy(update={"encryption": "on", "keys_dir": keys})
    with Journal(s, producer_id=f"enc-stream-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("acme", "agent", {"ask": "hi"}, user_id="alice")
        with run.stream("answer") as st:
            st.write(f"tok {mark} ")
            st.write({"progress": mark, "n": 1})
        with pytest.raises(RuntimeError), run.stream("tool") as st2:
            st2.write("working")
            raise RuntimeError(f"boom {mark}")
        run.succeed({"out": "ok"})
        journal.streams.flush(10)
    raw = raw_stream(topics, run.run_id)
    records = [orjson.loads(v) for _p, v in raw]
    assert len(records) == 5 and not any(mark.encode() in v for _p, v in raw)  # nothing in clear in the topic
    chunks = [r for r in records if r["kind"] == "chunk"]
    assert [r["sealed"] for r in chunks] == ["str", "json", "str"] and all(is_encrypted(r["data"]) for r in chunks)
    ends = [r for r in records if r["kind"] == "end"]
    assert ends[0]["data"] is None and is_encrypted(ends[1]["data"]["error"]) and ends[1]["sealed"] == "str"

    opened = events(s, run.run_id)  # the key directory: plain chunks, JSON values, the end's error
    assert [(e["kind"], e["data"]) for e in opened] == [
        ("chunk", f"tok {mark} "), ("chunk", {"progress": mark, "n": 1}), ("end", None), ("chunk", "working"),
        ("end", {"error": f"RuntimeError: boom {mark}"})]
    assert not any("encrypted" in e for e in opened)

    for reader_kw, named in (({"content": None}, "EncryptedContentError"), ({}, "UnknownKeyError")):
        other = s if reader_kw else s.model_copy(update={"keys_dir": tmp_path / "not-these-keys"})
        shown = events(other, run.run_id, **reader_kw)
        assert [(e["kind"], e["data"], e.get("encrypted")) for e in shown] == [
            ("chunk", "encrypted", named), ("chunk", "encrypted", named), ("end", None, None),
            ("chunk", "encrypted", named), ("end", {"error": "encrypted"}, named)]
        assert mark not in json.dumps(shown) and "rjenc:" not in json.dumps(shown)

    with_keys = {**service_env, "RUNJOURNAL_KEYS_DIR": str(keys)}
    assert [json.loads(line)["data"] for line in cli(with_keys, "stream", run.run_id, "--json").stdout.splitlines()
            ][:2] == [f"tok {mark} ", {"progress": mark, "n": 1}]
    assert f"tok {mark} " in cli(with_keys, "stream", run.run_id).stdout
    without = {**service_env, "RUNJOURNAL_KEYS_DIR": str(tmp_path / "elsewhere")}
    text = cli(without, "stream", run.run_id).stdout
    assert "⟨encrypted: UnknownKeyError⟩" in text and mark not in text and "rjenc:" not in text
    lines = [json.loads(line) for line in cli(without, "stream", run.run_id, "--json").stdout.splitlines()]
    assert lines[0]["data"] == "encrypted" and lines[0]["encrypted"] == "UnknownKeyError"

    # crypto-shredding: erase alice's key; no chunk opens any more, the stream is still read to its end
    report = json.loads(cli(with_keys, "erase", "--tenant", "acme", "--subject", "alice", "--yes", "--json").stdout)
    assert report["shredded"] == [{"scope": "subject", "kek_id": KeyScope("acme", "alice").kek_id,
                                   "destroyed": True}]
    after = events(s, run.run_id)
    assert [(e["kind"], e["data"], e.get("encrypted")) for e in after] == [
        ("chunk", "encrypted", "KeyDestroyedError"), ("chunk", "encrypted", "KeyDestroyedError"),
        ("end", None, None), ("chunk", "encrypted", "KeyDestroyedError"),
        ("end", {"error": "encrypted"}, "KeyDestroyedError")]
    shredded = cli(with_keys, "stream", run.run_id).stdout
    assert "⟨encrypted: KeyDestroyedError⟩" in shredded and mark not in shredded


def test_a_moved_chunk_fails_its_binding_and_the_stream_goes_on(topics: Settings, tmp_path: Path) -> None:
    s = topics.model_copy(update={"encryption": "on", "keys_dir": tmp_path / "keys"})
    with Journal(s, producer_id=f"enc-move-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("acme", "agent", {}, user_id="bob")
        with run.stream("answer") as st:
            st.write("first")
            st.write("second")
        journal.streams.flush(10)
        (partition, value), *_ = raw_stream(topics, run.run_id)
        first = orjson.loads(value)
        assert first["n"] == 1
        producer = kafka.producer(topics)
        for moved in ({**first, "n": 2}, {**first, "segment": "other#1.1"}):  # same token, another position
            producer.produce(topics.streams_topic, value=orjson.dumps(moved), key=run.run_id.encode(),
                             partition=partition)
        assert producer.flush(10) == 0
        with run.stream("after") as st3:
            st3.write("third")
        journal.streams.flush(10)
    got = [(e.kind, e.data, e.encrypted) for _o, e in read_stream(s, run.run_id)]
    assert got == [("chunk", "first", None), ("chunk", "second", None), ("end", None, None),
                   ("chunk", "encrypted", "CiphertextBindingError"), ("chunk", "encrypted", "CiphertextBindingError"),
                   ("chunk", "third", None), ("end", None, None)]


def test_a_stream_of_a_run_the_journal_does_not_write_is_refused_not_written_in_clear(topics: Settings,
                                                                                     tmp_path: Path) -> None:
    s = topics.model_copy(update={"encryption": "on", "keys_dir": tmp_path / "keys"})
    with Journal(s, producer_id=f"enc-unseal-{uuid.uuid4().hex[:6]}") as journal:
        with pytest.raises(UnsealableStreamError):
            journal.streams.open(f"stranger-{uuid.uuid4().hex}", 1, "answer")
    clear = topics.model_copy(update={"encryption": "off"})
    with Journal(clear, producer_id=f"clear-{uuid.uuid4().hex[:6]}") as journal:  # off: as before, no seal
        run = journal.start_run("acme", "agent", {}, user_id="bob")
        with run.stream("answer") as st:
            st.write("rjenc:1:looks-like-a-token")
        journal.streams.flush(10)
    [(_p, value), _end] = raw_stream(topics, run.run_id)
    assert "sealed" not in orjson.loads(value)
    assert [(e.data, e.encrypted) for _o, e in read_stream(clear, run.run_id)][0] == ("rjenc:1:looks-like-a-token",
                                                                                      None)


def test_a_resumed_run_streams_under_the_same_key_and_both_epochs_open(topics: Settings, tmp_path: Path) -> None:
    from tests.support.readback import take_over

    s = topics.model_copy(update={"encryption": "on", "keys_dir": tmp_path / "keys"})
    dead = Journal(s, producer_id=f"dead-{uuid.uuid4().hex[:6]}")
    run = dead.start_run("acme", "agent", {}, user_id="carol")
    run.stream("answer").write("before the crash")
    dead.streams.flush(10)
    dead.close()
    with Journal(s, producer_id=f"live-{uuid.uuid4().hex[:6]}") as live:
        resumed = take_over(live, s, run.run_id)  # Journal.resume notes the run's scope (the plan's user)
        with resumed.stream("answer") as st:
            st.write("after it")
        live.streams.flush(10)
    raw = [orjson.loads(v) for _p, v in raw_stream(topics, run.run_id)]
    assert [r["kind"] for r in raw] == ["chunk", "gap", "chunk", "end"] and "sealed" not in raw[1]
    assert raw[1]["data"]["segments"] == [{"segment": "answer#1.1", "epoch": 1}]  # the gap's structure: clear
    assert [(e.kind, e.data if e.kind != "gap" else e.data["dead_epoch"], e.encrypted)
            for _o, e in read_stream(s, run.run_id)] == [("chunk", "before the crash", None), ("gap", 1, None),
                                                         ("chunk", "after it", None), ("end", None, None)]

"""Durable streams of partial output (``run.stream()``, decision 0055) on the real stack: written by the sync and
the async handle, read from an offset and resumed with no duplicate, a gap marked when a new owner resumes after a
crash (a real SIGKILL mid-stream), a zombie's late tokens fenced by the reader; nothing enters the journal."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest

from runjournal.consumers.streams import StreamReader, read_stream
from runjournal.core import redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.producers import Journal
from runjournal.producers.aio import AsyncJournal
from runjournal.producers.streams import StreamChunkTooLargeError, StreamDataError
from tests.support.readback import events_of, read_committed, take_over

pytestmark = pytest.mark.integration


def _read(settings: Settings, run_id: str, from_offset: int | None = None) -> list[Any]:
    return [e for _o, e in read_stream(settings, run_id, from_offset)]


def _texts(events: list[Any]) -> list[Any]:
    return [(e.kind, e.epoch, e.data) for e in events]


def test_sync_stream_is_read_back_in_order_and_stays_out_of_the_journal(topics: Settings) -> None:
    with Journal(topics, producer_id=f"st-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("t", "a", {})
        with run.stream("answer") as s:
            for tok in ("Hel", "lo", {"tool": "search", "progress": 0.5}):
                s.write(tok)
        other = journal.start_run("t", "a", {})  # another run's stream on the same topic is not read
        with other.stream() as s2:
            s2.write("not mine")
        run.succeed()
        journal.streams.flush(10)
    events = _read(topics, run.run_id)
    assert _texts(events) == [("chunk", 1, "Hel"), ("chunk", 1, "lo"),
                              ("chunk", 1, {"tool": "search", "progress": 0.5}), ("end", 1, None)]
    assert [e.n for e in events] == [1, 2, 3, 3] and {e.segment for e in events} == {"answer#1.1"}
    assert [e.offset for e in events] == sorted(e.offset for e in events)
    journal_types = {e.type.name for e in events_of(read_committed(topics), run.run_id)}
    assert journal_types == {"RUN_STARTED", "RUN_SUCCEEDED"}  # a stream write is not a step
    assert redis_client.client(topics).hlen(RedisKeys(topics.topic_prefix).streams(run.run_id)) == 0


def test_a_chunk_that_is_not_json_or_too_large_is_refused_before_it_is_produced(topics: Settings) -> None:
    settings = topics.model_copy(update={"stream_chunk_bytes": 64})
    with Journal(settings, producer_id=f"st-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("t", "a", {})
        with run.stream() as s:
            with pytest.raises(StreamDataError):
                s.write(object())
            with pytest.raises(StreamChunkTooLargeError):
                s.write("x" * 65)
            s.write("ok")
        journal.streams.flush(10)
    assert _texts(_read(settings, run.run_id)) == [("chunk", 1, "ok"), ("end", 1, None)]


def test_async_stream_and_an_exception_ends_the_segment_with_its_error(topics: Settings) -> None:
    async def main() -> str:
        async with await AsyncJournal.open(topics, producer_id=f"as-{uuid.uuid4().hex[:6]}") as journal:
            run = await journal.start_run("t", "a", {})
            async with run.stream("reply") as s:
                await s.write("a")
                await s.write("b")
            with pytest.raises(RuntimeError):
                async with run.stream("tool") as s:
                    await s.write("half")
                    raise RuntimeError("boom")
            journal.sync.streams.flush(10)
            return run.run_id

    run_id = asyncio.run(main())
    events = _read(topics, run_id)
    assert _texts(events) == [("chunk", 1, "a"), ("chunk", 1, "b"), ("end", 1, None), ("chunk", 1, "half"),
                              ("end", 1, {"error": "RuntimeError: boom"})]
    assert [e.segment for e in events] == ["reply#1.1"] * 3 + ["tool#1.2"] * 2


def test_a_reader_that_disconnects_resumes_by_offset_with_no_duplicate(topics: Settings) -> None:
    with Journal(topics, producer_id=f"st-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("t", "a", {})
        with run.stream() as s:
            for i in range(200):
                s.write(f"t{i}")
        journal.streams.flush(10)
    whole = _read(topics, run.run_id)
    seen: list[Any] = []
    with StreamReader(topics, run.run_id) as reader:  # disconnects after the first 37 records
        while len(seen) < 37:
            seen += reader.poll(0.5, max_records=10)
    seen = seen[:37]
    resumed = _read(topics, run.run_id, from_offset=seen[-1].offset + 1)
    assert [e.offset for e in seen + resumed] == [e.offset for e in whole]
    assert [e.data for e in seen + resumed] == [f"t{i}" for i in range(200)] + [None]


def test_new_owner_marks_the_gap_and_the_reader_fences_the_zombie(topics: Settings) -> None:
    """In one process: the dead owner's segment never ends; the resume appends a gap naming it; a late chunk of
    the dead epoch (a zombie) after the gap is dropped, also by a reader that resumes after the gap."""
    dead = Journal(topics, producer_id=f"dead-{uuid.uuid4().hex[:6]}")
    run = dead.start_run("t", "a", {})
    s = run.stream("answer")
    for i in range(3):
        s.write(f"old{i}")
    dead.streams.flush(10)
    dead.close()
    with Journal(topics, producer_id=f"live-{uuid.uuid4().hex[:6]}") as live:
        resumed = take_over(live, topics, run.run_id)
        assert resumed.epoch == 2
        dead.streams.append(run.run_id, 1, s.segment, 4, "chunk", "zombie")  # the dead owner's late token
        dead.streams.flush(10)
        with resumed.stream("answer") as s2:
            s2.write("new0")
        live.streams.flush(10)
    events = _read(topics, run.run_id)
    assert _texts(events) == [("chunk", 1, "old0"), ("chunk", 1, "old1"), ("chunk", 1, "old2"),
                              ("gap", 2, {"dead_epoch": 1, "segments": [
                                  {"segment": "answer#1.1", "epoch": 1, "last_offset": events[2].offset,
                                   "last_n": 3}]}),
                              ("chunk", 2, "new0"), ("end", 2, None)]
    assert events[-2].segment == "answer#2.1"
    after_gap = _read(topics, run.run_id, from_offset=events[3].offset + 1)  # lookback restores the fence
    assert _texts(after_gap) == [("chunk", 2, "new0"), ("end", 2, None)]


@pytest.mark.crash
def test_agent_sigkilled_mid_stream_new_owner_continues_the_same_stream(topics: Settings,
                                                                          service_env: dict[str, str]) -> None:
    run_id = f"skill-{uuid.uuid4().hex[:8]}"
    child = subprocess.Popen([sys.executable, "-m", "tests.support.stream_child", run_id,
                              f"sc-{uuid.uuid4().hex[:6]}", "5", "0.05"], env=service_env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = child.stdout.readline() if child.stdout else ""
    assert json.loads(line or "{}").get("ready") == run_id, child.stderr.read()[-3000:] if child.stderr else ""
    time.sleep(0.5)  # a few more tokens, some perhaps unacknowledged when it dies
    child.send_signal(signal.SIGKILL)
    child.wait(60)
    assert child.returncode == -signal.SIGKILL
    before = _read(topics, run_id)
    assert [e.kind for e in before] == ["chunk"] * len(before) and len(before) >= 5
    r = redis_client.client(topics)
    deadline = time.monotonic() + 15  # the dead instance's lease (1.5 s) expires
    while list(r.scan_iter(match=RedisKeys(topics.topic_prefix).instance_glob("lease"), count=500)):
        assert time.monotonic() < deadline, "the dead instance's lease never expired"
        time.sleep(0.2)
    with Journal(topics, producer_id=f"live-{uuid.uuid4().hex[:6]}") as live:
        resumed = take_over(live, topics, run_id)
        with resumed.stream("answer") as s:
            s.write("continued")
        resumed.succeed()
        live.streams.flush(10)
    after = _read(topics, run_id)
    assert after[: len(before)] == before  # the dead owner's tokens, once each
    gap, *rest = after[len(before):]
    assert (gap.kind, gap.epoch, gap.data["dead_epoch"]) == ("gap", 2, 1)
    assert gap.data["segments"][0]["last_n"] == before[-1].n
    assert _texts(rest) == [("chunk", 2, "continued"), ("end", 2, None)]
    assert [e.data for e in before] == [f"tok-{i} " for i in range(1, len(before) + 1)]  # no duplicate, no hole

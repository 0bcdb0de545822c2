"""A fence falling while other threads of the instance keep writing: nothing lands behind it."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import TopicPartition

from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.producers import Journal, ProducerFencedError, fence_producer
from runjournal.schemas import EventType, codec_from_settings

pytestmark = pytest.mark.integration


class Counting:
    name = "charge"
    side_effect = True
    timeout_ms = 1000

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, args: dict, idempotency_key: str) -> dict:
        self.runs += 1
        return {"ok": True}


def _high_watermarks(settings: Settings) -> dict[int, int]:
    c = kafka.consumer(settings, **{"group.id": f"hw-{uuid.uuid4()}",
                  "isolation.level": "read_uncommitted"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(settings.events_topic, p), timeout=10, cached=False)[1]
                for p in range(settings.partitions)}
    finally:
        c.close()


def _committed_after(settings: Settings, marks: dict[int, int]) -> list[tuple[int, int, str]]:
    codec = codec_from_settings(settings)
    c = kafka.consumer(settings, **{"group.id": f"rd-{uuid.uuid4()}",
                  "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(settings.events_topic, p, off) for p, off in marks.items()])
    out = []
    for _ in range(8):
        for m in c.consume(500, timeout=0.5):
            if not m.error() and m.value():
                e = codec.decode(m.value())
                out.append((m.partition(), m.offset(), str(e.type)))
    c.close()
    return out


def test_no_write_of_a_fenced_instance_lands_after_the_fence(topics: Settings) -> None:
    pid = f"racer-{uuid.uuid4().hex[:6]}"
    journal = Journal(topics, producer_id=pid, max_txn_age_ms=200)
    tool = Counting()
    stop = threading.Event()
    errors: list[BaseException] = []

    def caller() -> None:
        run = journal.start_run("t", "a", {})
        try:
            while not stop.is_set():
                with run.node("step"):
                    run.call(tool, {"n": 1})
        except ProducerFencedError as exc:
            errors.append(exc)

    def chatter() -> None:
        run = journal.start_run("t", "a", {})
        try:
            while not stop.is_set():
                run.message("assistant", "still talking")
                run.emit(EventType.APPROVAL_REQUESTED, {"call_id": str(uuid.uuid4()), "reason": "r"})
        except ProducerFencedError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=caller), threading.Thread(target=chatter)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    fence_producer(topics, pid)  # what the recovery job does
    marks = _high_watermarks(topics)  # ... and then it reads
    runs_at_fence = tool.runs
    time.sleep(1.5)
    stop.set()
    for t in threads:
        t.join(30)
    try:
        journal.close()
    except ProducerFencedError:
        pass
    assert len(errors) == 2, "both threads must be stopped by the fence"
    assert _committed_after(topics, marks) == []  # nothing of the zombie behind the recovery job's view
    assert tool.runs <= runs_at_fence + 1  # at most the call whose intent was acknowledged before the fence

"""Read a journal topic back the way consumers do: a plain Consumer, ``isolation.level=read_committed``."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Message, TopicPartition

from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.schemas import Event, EventType, codec_from_settings


@dataclass(frozen=True)
class Record:
    """One committed record of the events topic, decoded."""

    partition: int
    offset: int
    key: str
    headers: dict[str, bytes]
    event: Event


def read_committed(settings: Settings, *, timeout_s: float = 20.0) -> list[Record]:
    """Every committed event of ``settings.events_topic`` (tombstones skipped), in (partition, offset) order.

    Reads each partition from the beginning up to its high watermark as seen at the start (a
    read_committed consumer stops at the last stable offset, so abort or commit open
    transactions — e.g. by fencing — before calling this).
    """
    codec = codec_from_settings(settings)
    consumer = kafka.consumer(settings, **{"group.id": f"read-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        meta = consumer.list_topics(settings.events_topic, timeout=10)
        parts = sorted(meta.topics[settings.events_topic].partitions)
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(settings.events_topic, p), timeout=10)[1]
            for p in parts
        }
        consumer.assign([TopicPartition(settings.events_topic, p, 0) for p in parts if ends[p] > 0])
        out: list[Record] = []
        deadline = time.monotonic() + timeout_s
        pending = {p for p in parts if ends[p] > 0}
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.2):
                if msg.error() is not None or msg.value() is None:  # a tombstone (erase, archive) has no event
                    continue
                event = codec.decode(
                    msg.value(), topic=msg.topic(), partition=msg.partition(), offset=msg.offset()
                )
                out.append(
                    Record(
                        msg.partition(), msg.offset(), msg.key().decode(), dict(msg.headers() or []), event
                    )
                )
            positions = consumer.position([TopicPartition(settings.events_topic, p) for p in pending])
            pending = {tp.partition for tp in positions if tp.offset < ends[tp.partition]}
        assert not pending, (
            f"partitions {pending} not read to their end within {timeout_s}s (open transaction?)"
        )
        return sorted(out, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def events_of(records: list[Record], run_id: str) -> list[Event]:
    """The events of one run, in topic order."""
    return [r.event for r in records if r.event.run_id == run_id]


def wait_first_call(settings: Settings, run_id: str, *, timeout_s: float = 60.0, child=None) -> None:
    """Block until ``run_id`` has a TOOL_CALL_COMMITTED in the journal (an agent child is past its start).

    An operator's command sent before the run exists is refused ("not in the projection and never started"), so a
    test that starts an agent process and then acts on its run waits here first. ``child`` (a ``Popen``): fail at
    once if it exited. Raises ``AssertionError`` after ``timeout_s`` (s).
    """
    deadline = time.monotonic() + timeout_s
    while not any(e.type is EventType.TOOL_CALL_COMMITTED for e in events_of(read_committed(settings), run_id)):
        assert child is None or child.poll() is None, f"the agent exited ({child.returncode}) before its first call"
        assert time.monotonic() < deadline, f"run {run_id} made no call within {timeout_s} s"
        time.sleep(0.2)


def take_over(journal, settings: Settings, run_id: str, *, timeout_s: float = 20.0):
    """One ``recover --stale`` pass (a fresh RecoveryJob, closed after), then ``journal`` claims ``run_id`` and
    resumes it: the handle of the run a dead instance left. Raises ``AssertionError`` when it was not handed over."""
    from runjournal.consumers.recovery.job import RecoveryJob

    job = RecoveryJob(settings)
    try:
        job.recover(stale=True)
    finally:
        job.close()
    assert journal.claim_assignment(timeout_s=timeout_s) == run_id
    return journal.resume(run_id)


def topic_messages(settings: Settings, topic: str, *, committed: bool = True) -> list[Message]:
    """Every record of ``topic`` with a value, partition by partition from its low to its high watermark, undecoded
    (tombstones and errors left out); ``committed``: ``isolation.level=read_committed``."""
    props: dict[str, object] = {"group.id": f"raw-{uuid.uuid4()}", "enable.auto.commit": False}
    if committed:
        props["isolation.level"] = "read_committed"
    consumer = kafka.consumer(settings, **props)
    out: list[Message] = []
    try:
        for p in sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions):
            tp = TopicPartition(topic, p)
            end = consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1]
            if end == 0:
                continue
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING)])
            while consumer.position([tp])[0].offset < end:
                out += [m for m in consumer.consume(1000, timeout=1) if not m.error() and m.value()]
    finally:
        consumer.close()
    return out

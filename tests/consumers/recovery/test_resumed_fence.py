"""Two recovery actors' RUN_RESUMED producers (one transactional id) on the real broker: the one fenced reports
``superseded`` — it never raises out of the pass.

The CI rehearsal of 2026-12-03 saw ``recover --stale`` exit 1 with a raw ``KafkaException(_FENCED)`` when two ran at
once: the publisher's fence handler dropped the fenced producer with ``flush()``, and librdkafka's ``flush`` raises a
fatal producer's error, which escaped the very handler that reports the fence.
"""

from __future__ import annotations

import pytest

from runjournal.consumers.recovery.resumed import SUPERSEDED, ResumedPublisher
from runjournal.core.settings import Settings
from runjournal.schemas import Event, EventCodec, EventType, new_event_id, utcnow

pytestmark = pytest.mark.integration


def _resumed(run_id: str) -> Event:
    return Event(event_id=new_event_id(), run_id=run_id, tenant_id="t", seq=2, epoch=2, producer_id="recovery",
                 type=EventType.RUN_RESUMED, occurred_at=utcnow(),
                 payload={"previous_epoch": 1, "recovered_by": "test", "plan_json": "{}", "assigned_to": "x"})


def test_the_actor_fenced_by_another_reports_superseded_and_stays_usable(topics: Settings) -> None:
    codec = EventCodec()
    first = ResumedPublisher(topics, codec, lambda _run: 0)
    second = ResumedPublisher(topics, codec, lambda _run: 0)
    try:
        first.ready()
        second.ready()  # the later init fences the first actor's producer
        outcome = first.publish([_resumed("r-1")])
        assert outcome is not None and outcome.startswith(SUPERSEDED), outcome
        assert second.publish([_resumed("r-2")]) is None  # the later actor commits
        assert first.publish([_resumed("r-3")]) is None  # the next pass of the first builds a new producer
    finally:
        first.close()
        second.close()


def test_dropping_a_producer_fenced_mid_transaction_never_raises(topics: Settings) -> None:
    """The mechanism itself: a producer whose records were sent before another actor's init fenced it is in
    librdkafka's fatal state, and its ``flush`` raises that error — ``drop`` (the fence handler's cleanup) and
    ``close`` must not."""
    codec = EventCodec()
    first = ResumedPublisher(topics, codec, lambda _run: 0)
    second = ResumedPublisher(topics, codec, lambda _run: 0)
    try:
        producer = first._ready()  # noqa: SLF001 - the publisher's own producer, driven step by step
        producer.begin_transaction()
        event = _resumed("r-4")
        producer.produce(topics.events_topic, key=event.key.encode(), value=codec.encode(event), partition=0)
        producer.poll(0.5)  # the records leave before the fence
        second.ready()
        with pytest.raises(Exception):  # noqa: B017, PT011 - librdkafka's fenced error, whatever its code
            producer.commit_transaction(30)
        first.drop()  # raised KafkaException(_FENCED) from flush() before the fix
        assert first.publish([_resumed("r-5")]) is None  # usable again: a new producer (it fences the second)
    finally:
        first.close()
        second.close()

"""Deferred = immediate (issue 28 cases 4, 5): a deferred or batched path keeps the guarantees of the immediate one.

4. In group mode, a commit that stays retriable through ``commit_retries`` (the coordinator times out) dropped the
   held-back TOOL_CALL_COMMITTED and broke the handle: the caller had the value, the call stayed INTENDED, and nobody
   recovered the run while its instance held its lease. Strict mode re-sent the same event and went on; now both do.

5. A producer rebuild deferred to the next publish (the rebuild after a fatal error failed) must check the lease
   before ``init_transactions``: re-initialising the transactional id of a fenced instance bumps its producer epoch
   past the recovery job's fence, and the zombie writes behind the job's read.
"""

from __future__ import annotations

import uuid

import pytest
import redis
from confluent_kafka import KafkaError, KafkaException

import runjournal.producers._txn as txn_module
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.model.reducer import RunStatus, fold
from runjournal.producers import DeliveryError, Journal, LeaseLapsedError, ProducerFencedError, fence_producer
from runjournal.schemas import EventType
from tests.support.ledger import Ledger, LedgerTool
from tests.support.readback import events_of, read_committed

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("rebuild", ["deferred", "immediate"])
def test_a_rebuild_never_reinitialises_a_fenced_instance(topics: Settings, monkeypatch: pytest.MonkeyPatch,
                                                         rebuild: str) -> None:
    r = redis.Redis.from_url(topics.redis_url)
    inits: list[str] = []
    real = txn_module.init_transactions
    failing = {"left": 0}

    def counted(producer: object, timeout_s: float) -> None:
        inits.append("init")
        if failing["left"]:
            failing["left"] -= 1
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "coordinator away"))  # noqa: SLF001
        real(producer, timeout_s)

    monkeypatch.setattr(txn_module, "init_transactions", counted)
    run_id = f"zombie-{uuid.uuid4().hex[:8]}"
    # a long lease: the heartbeat does not notice the lapse during the test, the publish path must
    with Journal(topics, producer_id=f"rebuilder-{uuid.uuid4().hex[:6]}", lease_ttl_ms=60_000) as journal:
        run = journal.start_run("t", "agent", {}, run_id=run_id)
        run.message("assistant", "before")
        journal.flush()
        publisher = journal._txn  # noqa: SLF001 - the rebuild a fatal error starts, driven directly
        if rebuild == "deferred":
            failing["left"] = 1
            publisher._rebuild()  # noqa: SLF001 - fails: the next publish builds the producer
            assert publisher._producer is None  # noqa: SLF001
        # meanwhile the instance was declared dead: its lease is gone and a recovery job fenced it
        r.delete(RedisKeys(topics.topic_prefix).lease(journal.producer_id))
        fence_producer(topics, journal.producer_id)
        before = len(inits)
        if rebuild == "immediate":
            with publisher._lock:  # noqa: SLF001 - as _fail_open_txn does after a fatal error
                publisher._rebuild()  # noqa: SLF001
        with pytest.raises((ProducerFencedError, LeaseLapsedError, DeliveryError)):
            run.message("assistant", "behind the fence")
            journal.flush()
        assert len(inits) == before, "the fenced transactional id was initialised again"
    texts = [e.payload.get("content") for e in events_of(read_committed(topics), run_id)]
    assert "behind the fence" not in texts


class _TimingOut:
    """The real producer, whose ``commit_transaction`` times out (retriable) ``times`` times. ``landed``: the first
    of them did commit at the broker and only its answer was lost — the producer then has no transaction, so the
    abort is refused and the journal must rebuild the producer and send the same events again."""

    def __init__(self, producer: object, times: int, *, landed: bool = False) -> None:
        self._producer, self.left, self.landed = producer, times, landed

    def commit_transaction(self, *args: object) -> None:
        if self.left:
            if self.landed and self.left == 3:
                self._producer.commit_transaction(*args)  # type: ignore[attr-defined]
            self.left -= 1
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "coordinator timed out",  # noqa: SLF001
                                            retriable=True))
        self._producer.commit_transaction(*args)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._producer, name)


@pytest.mark.parametrize("landed", [False, True], ids=["not-committed", "committed-answer-lost"])
@pytest.mark.parametrize("mode", ["group", "strict"])
def test_an_outcome_whose_commit_timed_out_is_sent_again_and_the_run_goes_on(topics: Settings, mode: str,
                                                                            landed: bool) -> None:
    ledger = Ledger(redis.Redis.from_url(topics.redis_url), topics.topic_prefix)
    pay = LedgerTool(ledger, name="pay", result={"paid": 1})
    run_id = f"ambiguous-{mode}-{uuid.uuid4().hex[:6]}"
    with Journal(topics, producer_id=f"slowcoord-{uuid.uuid4().hex[:6]}", outcome_commit=mode) as journal:
        run = journal.start_run("t", "agent", {}, run_id=run_id)
        publisher = journal._txn  # noqa: SLF001 - the coordinator's timeouts, injected at the client call
        with publisher._lock:  # noqa: SLF001
            publisher._producer = _TimingOut(publisher._producer, times=3,  # noqa: SLF001 - commit_retries + 1
                                             landed=landed)
        with run.node("pay"):
            assert run.call(pay, {"logical": "pay"}) == {"paid": 1}
        run.message("assistant", "paid")
        run.succeed()
        assert (publisher.rebuilds > 0) == landed  # a refused abort: a new producer sent the events again
    assert ledger.executions() == 1
    read = events_of(read_committed(topics), run_id)
    events = list({e.event_id: e for e in read}.values())  # an event sent again after a lost answer: one record more
    assert len({e.seq for e in events}) == len(events), "two different events under one seq"
    assert len({e.key for e in read}) == len(events), "a duplicate under another key"
    state = fold((e, 0, i) for i, e in enumerate(read))
    assert state is not None and state.status is RunStatus.SUCCEEDED
    types = [e.type for e in events]
    assert types.count(EventType.TOOL_CALL_COMMITTED) == 1 and types[-1] is EventType.RUN_SUCCEEDED

"""Recovery reads to the high watermark, not the last stable offset a read_committed reader is shown."""

from __future__ import annotations

import logging

import pytest
import redis

from runjournal.consumers.projector.store import ProjectionStore
from runjournal.consumers.recovery.tail import end_offsets, fold_tails
from runjournal.consumers.runtime.failures import FailurePolicy
from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.schemas import codec_from_settings
from runjournal.schemas.keys import partition_for
from tests.support.workload import publish, run_events

pytestmark = pytest.mark.integration


def test_a_record_committed_beyond_an_open_transaction_is_waited_for_not_missed(topics: Settings) -> None:
    run = run_events("tail-run", finish=False)
    p = partition_for("tail-run", topics.partitions)
    publish(topics, run[:3])
    # Another instance opens a transaction in the same partition and keeps it open: the LSO stops there.
    holder = kafka.producer(topics, **{"transactional.id": f"{topics.topic_prefix}.holder"})
    holder.init_transactions(30)
    holder.begin_transaction()
    holder.produce(topics.events_topic, key=b"other:1:1", value=b"\xc3\x01x", partition=p)
    holder.flush(10)
    publish(topics, run[3:5])  # committed, but beyond the open transaction
    ends = end_offsets(topics, [p])
    assert ends[p] == (0, 6)  # the high watermark, not the LSO (3)
    store = ProjectionStore(redis.Redis.from_url(topics.redis_url), topics.topic_prefix)
    codec = codec_from_settings(topics)
    policy = FailurePolicy("recovery", logging.getLogger("test"), max_wait_s=2)
    _states, reads = fold_tails(topics, store, codec, {p: {"tail-run"}}, ends, policy=policy, timeout_s=2)
    assert not reads[0].complete and "still undecided" in (reads[0].reason or "")  # nothing decided from it
    holder.abort_transaction(30)
    states, reads = fold_tails(topics, store, codec, {p: {"tail-run"}}, ends, policy=policy, timeout_s=20)
    assert reads[0].complete
    assert states["tail-run"].last_seq == 5  # seq 4 and 5 were beyond the LSO when the end offset was read
    assert reads[0].end == 6 and reads[0].folded == 5

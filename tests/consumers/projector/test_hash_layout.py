"""The projection's hash per run (issue 29): a batch writes what it changed, an old-layout Redis is read and upgraded,
and a 20,000-event run projects to its fold and is read back by recovery."""

from __future__ import annotations

import logging

import pytest
import redis

from runjournal.consumers.projector import ProjectionStore, Projector
from runjournal.consumers.projector.index import read_index
from runjournal.consumers.recovery.plan import classify
from runjournal.consumers.recovery.tail import end_offsets, fold_tails
from runjournal.consumers.runtime.failures import FailurePolicy
from runjournal.core import redis_client
from runjournal.core.settings import Settings
from runjournal.model.reducer import RunState, fold, state_digest
from runjournal.model.stored import LARGE_FIELDS
from runjournal.producers.plan import CallVerdict as Plan
from runjournal.schemas import codec_from_settings
from runjournal.schemas.keys import partition_for
from tests.consumers.projector.test_projector import topic_fold_digests
from tests.support.workload import publish, run_events


def _folded(run_id: str, calls: int, partition: int = 0) -> tuple[RunState, list]:
    events = run_events(run_id, calls=calls, finish=False)
    items = [(e, partition, i) for i, e in enumerate(events)]
    state = fold(items[:-3])  # the last three events (the last commit, a message, NODE_SUCCEEDED) come after
    assert state is not None
    return state, items[-3:]


def _one_event_bytes(calls: int) -> tuple[int, str]:
    store = ProjectionStore(redis.Redis(), "unused")  # prepare_batch needs no server
    before, rest = _folded("r-bytes", calls)
    after = fold(rest[:1], before)
    assert after is not None
    prepared = store.prepare_batch(0, expected_offset=0, new_offset=1, states={"r-bytes": after},
                                   before={"r-bytes": before})
    size = sum(len(a) if isinstance(a, (bytes, str)) else 8 for a in prepared.args)
    return size, prepared.args[4]


def test_one_event_of_a_long_run_writes_what_one_event_of_a_short_run_writes() -> None:
    small, mode = _one_event_bytes(40)  # > 64 events: both states carry a full duplicate window
    big, big_mode = _one_event_bytes(5_000)
    assert (mode, big_mode) == ("D", "D")
    assert big <= small + 64, (small, big)  # the scalar field and one record: not the run's 5,000 records
    assert big < 6_000


def test_an_old_layout_run_is_read_and_its_next_batch_writes_the_whole_hash(settings: Settings) -> None:
    client = redis_client.client(settings)
    store = ProjectionStore(client, settings.topic_prefix)
    run_id = "old:run"  # an id with the field-name separator in it
    p = partition_for(run_id, settings.partitions)
    before, rest = _folded(run_id, 5, p)
    # the layout before issue 29: the whole state as one JSON string
    client.set(store.run_key(p, run_id), before.to_json_bytes())
    client.sadd(store.runs_key(p), run_id)
    client.set(store.offset_key(p), before.applied_offset)
    assert store.get(p, run_id) == before
    (applied, states), = store.snapshot({p: [run_id]}).values()
    assert applied == before.applied_offset and states[run_id] == before
    loaded = store.load(p, [run_id])[run_id]
    after = fold(rest, loaded)
    assert after is not None
    prepared = store.prepare_batch(p, expected_offset=before.applied_offset, new_offset=after.applied_offset,
                                   states={run_id: after}, before={run_id: loaded})
    assert prepared.args[4] == "F"  # loaded from a string: the whole hash, never a diff onto it
    assert store.run_batch(prepared).status == "applied"
    assert client.type(store.run_key(p, run_id)) == b"hash"
    assert state_digest(store.get(p, run_id)) == state_digest(after)
    assert client.hlen(store.run_key(p, run_id)) == 1 + len(LARGE_FIELDS) + len(after.records) + len(after.nodes)
    assert [s.calls for s in read_index(client, store, [p])] == [5]
    # the next batch, folded from the state Redis now holds, writes a diff
    message = run_events(run_id, calls=6, finish=False)[14]  # seq 15
    nxt = fold([(message, p, after.applied_offset + 1)], after)
    assert nxt is not None and nxt.last_seq == 15
    again = store.prepare_batch(p, expected_offset=after.applied_offset, new_offset=nxt.applied_offset,
                                states={run_id: nxt}, before={run_id: store.get(p, run_id)})
    assert again.args[4] == "D"
    assert store.run_batch(again).status == "applied"
    assert state_digest(store.get(p, run_id)) == state_digest(nxt)


@pytest.mark.integration
def test_a_projector_upgrades_an_old_layout_projection(topics: Settings) -> None:
    run = run_events("upgraded", calls=3, finish=False)
    publish(topics, run[:4])
    projector = Projector(topics)
    projector.run(until_caught_up=True, idle_timeout_s=60)
    client = redis_client.client(topics)
    store = projector.store
    p = partition_for("upgraded", topics.partitions)
    state = store.get(p, "upgraded")
    client.delete(store.run_key(p, "upgraded"))
    client.set(store.run_key(p, "upgraded"), state.to_json_bytes())  # as an older projector left it
    publish(topics, run[4:])
    Projector(topics).run(until_caught_up=True, idle_timeout_s=60)
    assert client.type(store.run_key(p, "upgraded")) == b"hash"
    assert state_digest(store.get(p, "upgraded")) == topic_fold_digests(topics, ["upgraded"])["upgraded"]


@pytest.mark.integration
def test_a_20000_event_run_projects_to_its_fold_and_recovery_reads_it(topics: Settings) -> None:
    run_id = "long-run"
    events = run_events(run_id, calls=9_998, finish=False)  # 20,000 events: INTENDED / COMMITTED pairs
    assert len(events) == 20_000
    publish(topics, events)
    projector = Projector(topics, batch_size=2_000)  # ten polls at least
    projector.run(until_caught_up=True, idle_timeout_s=120)
    assert projector.stats.events == 20_000
    p = partition_for(run_id, topics.partitions)
    store = projector.store
    assert {run_id: state_digest(store.get(p, run_id))} == topic_fold_digests(topics, [run_id])
    fields = 1 + len(LARGE_FIELDS) + 9_998 + 1  # s, the large values, the records, the node
    assert redis_client.client(topics).hlen(store.run_key(p, run_id)) == fields
    # a tail the projector has not seen: recovery folds it onto the hash it reads
    # (seq 20,001: the INTENDED of call c9999 in the same generator's longer run: same event ids by seq)
    publish(topics, [e for e in run_events(run_id, calls=10_001, finish=False) if e.seq == 20_001])
    ends = end_offsets(topics, [p])
    policy = FailurePolicy("recovery", logging.getLogger("test"), max_wait_s=5)
    states, reads = fold_tails(topics, store, codec_from_settings(topics), {p: {run_id}}, ends, policy=policy)
    assert reads[0].complete
    state = states[run_id]
    assert state is not None and state.last_seq == 20_001
    classified = classify(state)
    assert classified.counts == {Plan.COMMITTED.value: 9_998, Plan.OUTCOME_UNKNOWN.value: 1}


def test_a_diff_onto_a_run_that_is_not_a_hash_is_a_conflict_and_writes_nothing(settings: Settings) -> None:
    client = redis_client.client(settings)
    store = ProjectionStore(client, settings.topic_prefix)
    p, run_id = 0, "erased-meanwhile"
    before, rest = _folded(run_id, 3, p)
    other, _ = _folded("other-run", 2, p)
    assert store.apply_batch(p, expected_offset=-1, new_offset=before.applied_offset,
                             states={run_id: before}).status == "applied"
    client.delete(store.run_key(p, run_id))  # as an erase would, behind the projector's cache
    after = fold(rest, before)
    result = store.apply_batch(p, expected_offset=before.applied_offset, new_offset=after.applied_offset,
                               states={"other-run": other, run_id: after}, before={run_id: before})
    assert (result.status, result.stored_offset) == ("conflict", before.applied_offset)
    assert not client.exists(store.run_key(p, run_id)) and not client.exists(store.run_key(p, "other-run"))

"""Batched single-slot reads and writes for the recovery pass (issue 20)."""

from __future__ import annotations

import pytest

from runjournal.consumers.projector.store import ProjectionStore
from runjournal.consumers.recovery.instances import Instances
from runjournal.core import redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.model.reducer import apply
from runjournal.producers.partitioner import partition_for
from runjournal.producers.plan import PlanStore, RecoveryPlan
from tests.support.faults import live
from tests.support.workload import run_events

pytestmark = pytest.mark.integration


def test_batched_reads_and_writes_keep_the_single_run_contracts(topics: Settings) -> None:
    """``PlanStore.assign_many`` is check-and-set per run (a run owned already, or named twice, gets no second list
    entry); ``put_many`` stores every plan; ``Instances.alive_many`` / ``runs_started_by`` answer as the single
    reads do; ``ProjectionStore.snapshot`` gives each partition's applied offset and the states after it."""
    client = redis_client.client(topics)
    keys = RedisKeys(topics.topic_prefix)
    plans = PlanStore(client, topics.topic_prefix)
    assert plans.put_many([RecoveryPlan(r, "t", "a", 2, 9, assigned_to="i") for r in ("p1", "p2")]) == {}
    assert [plans.get(r).last_seq for r in ("p1", "p2")] == [9, 9]  # type: ignore[union-attr]
    assert plans.assign("p0", "i") and not plans.assign("p0", "i")
    assert plans.assign_many("i", ["p1", "p0", "p2", "p1"]) == [True, False, True, False]
    assert client.lrange(keys.assign("i"), 0, -1) == [b"p0", b"p1", b"p2"]
    assert plans.assign_many("i", []) == []
    instances = Instances(client, topics.topic_prefix)
    live(topics, "up")
    assert instances.alive_many(["up", "down", "up"]) == {"up": True, "down": False}
    client.set(keys.claim("c1"), "agent-9")
    assert instances.runs_started_by(["c1", "c2"]) == {"c1": "agent-9", "c2": None}
    store = ProjectionStore(client, topics.topic_prefix)
    events = run_events("snap-run", finish=False)
    p = partition_for("snap-run", topics.partitions)
    state = None
    for offset, event in enumerate(events):
        state = apply(state, event, partition=p, offset=offset)
    assert state is not None
    store.apply_batch(p, expected_offset=-1, new_offset=len(events) - 1, states={"snap-run": state})
    other = (p + 1) % topics.partitions
    snap = store.snapshot({p: ["snap-run", "absent"], other: ["nothing"]})
    assert snap == {p: (len(events) - 1, {"snap-run": state}), other: (-1, {})}
    assert store.snapshot({}) == {}

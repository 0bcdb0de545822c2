"""The batched hand-over (issue 20): batches of single-slot writes; a failure or a crash between them loses no run.

A pass hands its runs over in batches (``runjournal.consumers.recovery.handover``): the plans (one SET per run,
pipelined), then the assignments (one check-and-set script per assignee), then the removals from the dead owner's
owned set. These tests break it between its writes, or fail one run's write, on the real broker and Redis, and
check that every run ends resumed exactly once, assigned once and owned by the live instance only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import pytest
import redis

from runjournal.consumers.ops.inspect import read_all_events
from runjournal.consumers.projector.store import ProjectionStore
from runjournal.consumers.recovery import handover
from runjournal.consumers.recovery.instances import Instances
from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.consumers.runtime.failures import DependencyUnavailableError, FatalDependencyError
from runjournal.core import redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.model.reducer import apply
from runjournal.producers.plan import PlanStore, RecoveryPlan
from runjournal.schemas import EventType
from runjournal.schemas.keys import partition_for
from tests.support.faults import assigned, live, owned, owns
from tests.support.workload import publish, run_events

pytestmark = pytest.mark.integration


def _crashed_runs(topics: Settings, n: int, tag: str) -> list[str]:
    """``n`` in-flight runs owned by the dead ``agent-1``; ``taker`` is alive."""
    runs = [f"{tag}-{i}" for i in range(n)]
    publish(topics, [e for run in runs for e in run_events(run, finish=False)])
    owns(topics, "agent-1", *runs)
    live(topics, "taker")
    return runs


def _settled(topics: Settings, runs: list[str]) -> None:
    """Every run resumed exactly once (epoch 2), its plan stored, handed to ``taker`` once, ``agent-1`` owns none."""
    resumed = Counter(ev.run_id for evs in read_all_events(topics).values() for ev, _p, _o in evs
                      if ev.type is EventType.RUN_RESUMED)
    assert resumed == dict.fromkeys(runs, 1), resumed
    assert sorted(assigned(topics, "taker")) == sorted(runs)
    assert owned(topics, "taker") == set(runs) and owned(topics, "agent-1") == set()
    plans = PlanStore(redis_client.client(topics), topics.topic_prefix)
    for run in runs:
        plan = plans.get(run)
        assert plan is not None and plan.epoch == 2 and plan.assigned_to == "taker", run


def _recover(topics: Settings) -> Any:
    job = RecoveryJob(topics)
    try:
        return job.recover(stale=True)
    finally:
        job.close()


def _failing_plans(monkeypatch: pytest.MonkeyPatch,
                   fail: Callable[[str, int], BaseException | None]) -> list[list[str]]:
    """``PlanStore.put_many`` with ``fail(run_id, call number)`` deciding a run's error (its plan is then not
    stored), as Redis reports a command's error inside a pipeline. Returns the calls made (their run ids)."""
    real = PlanStore.put_many
    calls: list[list[str]] = []

    def put_many(self: PlanStore, plans: Iterable[RecoveryPlan]) -> dict[str, Exception]:
        todo = list(plans)
        calls.append([p.run_id for p in todo])
        errors = {p.run_id: e for p in todo if (e := fail(p.run_id, len(calls))) is not None}
        stored = real(self, [p for p in todo if p.run_id not in errors])
        return {**stored, **errors}  # type: ignore[dict-item]

    monkeypatch.setattr(PlanStore, "put_many", put_many)
    return calls


def test_one_runs_failed_write_does_not_lose_the_others_and_the_next_pass_completes_it(
        topics: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _crashed_runs(topics, 3, "batch")
    bad = runs[1]
    _failing_plans(monkeypatch, lambda run, _n: redis.ResponseError("WRONGTYPE injected") if run == bad else None)
    with pytest.raises(FatalDependencyError, match="WRONGTYPE"):
        _recover(topics)  # the pass says so (the service stops loudly) — after handing the other runs over
    assert sorted(assigned(topics, "taker")) == sorted(set(runs) - {bad})
    assert owned(topics, "agent-1") == {bad}  # not disowned: its assignment never happened
    assert PlanStore(redis_client.client(topics), topics.topic_prefix).get(bad) is None
    monkeypatch.undo()  # Redis takes the write again
    report = _recover(topics)
    assert [(r.run_id, r.action, r.epoch) for r in report.runs] == [(bad, "handed_over", 2)], report.as_dict()
    _settled(topics, runs)


def test_a_transient_failure_of_one_runs_write_is_tried_again_within_the_pass(
        topics: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _crashed_runs(topics, 3, "blip")
    calls = _failing_plans(monkeypatch, lambda run, n: redis.ConnectionError("reset") if run == runs[0] and n <= 2
                           else None)
    job = RecoveryJob(topics)
    report = job.recover(stale=True)
    job.close()
    assert [r.action for r in report.runs] == ["resumed"] * 3, report.as_dict()
    # the failed run alone is written again at once, then after a wait (the policy's backoff) — within the pass
    assert len(calls) == 3 and job.policy.retries == 1
    _settled(topics, runs)


def test_an_outage_of_one_runs_write_is_waited_out_once_not_once_per_batch(
        topics: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """One run's plan write keeps failing transiently: the first batch waits the policy's outage time, then gives
    that run up; the later batches are written at once (no second wait); the pass raises the outage."""
    runs = _crashed_runs(topics, 5, "outage")
    monkeypatch.setattr(handover, "HANDOVER_BATCH", 2)
    calls = _failing_plans(monkeypatch, lambda run, _n: redis.ConnectionError("refused") if run == runs[0]
                           else None)
    job = RecoveryJob(topics, outage_wait_s=1.5)
    with pytest.raises(DependencyUnavailableError, match="redis"):
        job.recover(stale=True)
    job.close()
    assert sorted(assigned(topics, "taker")) == sorted(runs[1:]) and owned(topics, "agent-1") == {runs[0]}
    first_batch = [c for c in calls if runs[0] in c]
    assert len(first_batch) > 2 and all(c == [runs[0]] for c in first_batch[1:])  # the failed run alone, waited
    later = calls[max(i for i, c in enumerate(calls) if runs[0] in c) + 1:]
    assert len(later) == 2 and runs[0] not in sorted(r for c in later for r in c)  # batches 2, 3: once each
    monkeypatch.undo()
    assert [r.action for r in _recover(topics).runs] == ["handed_over"]
    _settled(topics, runs)


@pytest.mark.parametrize("dies_in", ["assign_many", "disown"])
def test_a_pass_killed_between_two_batches_is_completed_by_the_next_pass(
        topics: Settings, monkeypatch: pytest.MonkeyPatch, dies_in: str) -> None:
    """Batches of 2 runs; the pass dies in the second batch, after its plans are stored (in its assignment, or
    after it, in the removal from the dead owner's set). Batch 1 is done, batch 3 never started."""
    runs = _crashed_runs(topics, 5, f"kill-{dies_in}")
    monkeypatch.setattr(handover, "HANDOVER_BATCH", 2)
    target = PlanStore if dies_in == "assign_many" else handover.HandOvers
    name = "assign_many" if dies_in == "assign_many" else "_disown"
    real = getattr(target, name)
    seen: list[int] = []

    def dying(*args: Any, **kwargs: Any) -> Any:
        seen.append(1)
        if len(seen) == 2:
            raise SystemExit("killed inside the hand-over")
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, dying)
    with pytest.raises(SystemExit):
        RecoveryJob(topics).recover(stale=True)
    monkeypatch.undo()
    assert len(assigned(topics, "taker")) == (2 if dies_in == "assign_many" else 4)
    assert len(owned(topics, "agent-1")) == 3
    report = _recover(topics)
    assert sorted(r.action for r in report.runs) == ["handed_over"] * 3, report.as_dict()
    assert all(r.epoch == 2 and r.assigned_to == "taker" for r in report.runs)
    _settled(topics, runs)
    assert _recover(topics).runs == []  # nothing left


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

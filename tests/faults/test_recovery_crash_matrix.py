"""Issue 14 (b), case 2: the recovery job SIGKILLed at each of its steps, then a normal pass.

``runjournal recover --stale --json`` runs as a real subprocess with ``RJ_FAILPOINTS`` armed at one step; it
dies by SIGKILL there. A normal pass (the same command) must then leave every run resumed exactly once under
a higher epoch and handed to a live instance (in its assignment list once, in its owned set), with no GAP.
On the old code a pass killed after the RUN_RESUMED commit stranded its runs: the fold made the assignee the
owner, every later pass answered ``owner_alive``, and the assignee never received them.

Also here: the steady-load check (4 writers committing continuously; ``recover --stale`` finishes in time).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from runjournal.consumers.ops.inspect import read_all_events
from runjournal.consumers.recovery.handover import HANDOVER_BATCH
from runjournal.core import redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.model.reducer import RunStatus
from runjournal.producers.plan import PlanStore
from runjournal.schemas import EventType
from tests.support.faults import assigned, live, owned, owns, steady_writers
from tests.support.provider import project
from tests.support.workload import publish, run_events

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.slow]

STEPS = {  # failpoint -> hit at which the job dies
    "recovery.after_fence": 1,
    "recovery.after_read": 1,
    "recovery.after_commit": 1,
    "recovery.inside_handover": 2,  # hit before each batch of runs: 2 = the first batch handed over, the next not
    "recovery.handover.after_plan": 1,  # the hand-over's three writes (three Redis Cluster slots): between them
    "recovery.handover.after_assign": 1,
}
RUNS = {"recovery.inside_handover": HANDOVER_BATCH + 2}  # runs per case (2 unless named): two batches here


def _recover(env: dict[str, str], failpoint: str = "") -> subprocess.CompletedProcess[str]:
    env = {**env, "RJ_FAILPOINTS": failpoint} if failpoint else env
    return subprocess.run([sys.executable, "-m", "runjournal", "recover", "--stale", "--json"], env=env,
                          capture_output=True, text=True, timeout=180, check=False)


@pytest.mark.parametrize("step", list(STEPS))
def test_sigkill_at_each_recovery_step_then_a_normal_pass_resumes_every_run_exactly_once(
        topics: Settings, service_env: dict[str, str], step: str) -> None:
    runs = [f"cm-{step.rsplit('.', 1)[1]}-{i}" for i in range(RUNS.get(step, 2))]
    publish(topics, [e for run in runs for e in run_events(run, finish=False)])
    owns(topics, "agent-1", *runs)
    live(topics, "taker")
    killed = _recover(service_env, f"{step}={STEPS[step]}")
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-2000:])
    if step == "recovery.inside_handover":  # the kill fell between two batches: the first handed over, the next not
        assert len(assigned(topics, "taker")) == HANDOVER_BATCH and len(owned(topics, "agent-1")) == 2
    normal = _recover(service_env)
    assert normal.returncode == 0, normal.stderr[-2000:]
    report = json.loads(normal.stdout)
    assert report["actions"].get("owner_alive", 0) == 0, report["runs"]
    again = json.loads(_recover(service_env).stdout)  # a third pass finds nothing left to do
    assert again["runs"] == [], again
    resumed = Counter(ev.run_id for evs in read_all_events(topics).values() for ev, _p, _o in evs
                      if ev.type is EventType.RUN_RESUMED)
    assert resumed == dict.fromkeys(runs, 1), f"each run resumed exactly once: {resumed}"
    assert sorted(assigned(topics, "taker")) == sorted(runs), "each run handed to the live instance once"
    assert owned(topics, "taker") == set(runs) and owned(topics, "agent-1") == set()
    store = project(topics)
    plans = PlanStore(store.client, topics.topic_prefix)
    for run in runs:
        state = next(iter(store.load(_p(topics, run), [run]).values()))
        assert state.epoch == 2 and state.owner == "taker" and state.status is not RunStatus.GAP, state
        plan = plans.get(run)
        assert plan is not None and plan.epoch == 2 and plan.assigned_to == "taker"
    assert {PlanStore(store.client, topics.topic_prefix).claim_assignment("taker", 1) for _ in runs} == set(runs)


def _p(settings: Settings, run: str) -> int:
    from runjournal.schemas.keys import partition_for

    return partition_for(run, settings.partitions)


def test_recover_stale_under_steady_load(topics: Settings, service_env: dict[str, str]) -> None:
    """4 writers commit a transaction to every partition every 50 ms; ``runjournal recover --stale`` (a real
    subprocess, interpreter start included) must finish. The issue's target is 5 s; the assertion keeps a wide
    margin for a loaded 2-core machine, and the measured time is printed (``-s``) for the report."""
    runs = [f"load-{i}" for i in range(5)]
    for run in runs:
        publish(topics, run_events(run, finish=False))
    owns(topics, "agent-1", *runs)
    live(topics, "taker")
    project(topics)
    with steady_writers(topics, writers=4, interval_s=0.05):
        started = time.monotonic()
        done = _recover(service_env)
        elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["runs_recovered"] == len(runs), report
    print(f"\nrecover --stale under steady load: {elapsed:.2f} s wall (process), "
          f"{report['recovery_ms']} ms in the pass")
    assert elapsed < 30


def test_case2_a_pass_that_died_after_the_commit_is_completed_not_stranded(topics: Settings) -> None:
    """Case 2 without failpoints (so it runs on the old code too): the hand-over of a pass that committed
    RUN_RESUMED never happens (the pass dies right there). Old: every later pass answered ``owner_alive`` (the fold
    made the assignee the owner) and the assignee never received the run."""
    from runjournal.consumers.recovery.job import RecoveryJob

    run = "stranded-run"
    publish(topics, run_events(run, finish=False))
    owns(topics, "agent-1", run)
    live(topics, "taker")
    dying = RecoveryJob(topics)

    def die(*_a: object, **_k: object) -> None:
        raise SystemExit("killed between the RUN_RESUMED commit and the hand-over")

    dying._hand_over = die  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        dying.recover(stale=True)
    dying.close()
    job = RecoveryJob(topics)
    report = job.recover(stale=True)
    job.close()
    assert [r.action for r in report.runs] == ["handed_over"], report.as_dict()
    assert assigned(topics, "taker") == [run] and owned(topics, "taker") == {run}
    assert owned(topics, "agent-1") == set()


def test_killed_after_commit_and_the_assignee_died_too_resumes_under_a_newer_epoch(
        topics: Settings, service_env: dict[str, str]) -> None:
    """The other branch of (b): the pass dies after committing RUN_RESUMED (epoch 2 to ``taker``), and ``taker``
    dies before anyone completed the hand-over. The next pass fences ``taker`` (the owner the tail names) and
    resumes the run under epoch 3 on another live instance."""
    run = "twice-dead"
    publish(topics, run_events(run, finish=False))
    owns(topics, "agent-1", run)
    live(topics, "taker")
    killed = _recover(service_env, "recovery.after_commit=1")
    assert killed.returncode == -signal.SIGKILL
    redis_client.client(topics).delete(RedisKeys(topics.topic_prefix).lease("taker"))
    live(topics, "taker-2")
    report = json.loads(_recover(service_env).stdout)
    assert [(r["action"], r["epoch"], r["assigned_to"]) for r in report["runs"]] == [("resumed", 3, "taker-2")]
    assert "taker" in report["fenced"]
    assert assigned(topics, "taker-2") == [run] and assigned(topics, "taker") == []

"""Generated from the entry-point registry (tests/faults/entrypoints.py): every writer with a matrix scenario is
SIGKILLed at each of its failpoints, then TWO recovery actors act on its runs at the same time (two
``recover --stale`` processes, as two recovery services do), then the work is finished by a live instance.

Invariants, whatever the kill point and whichever actor wins: each run has at most one RUN_RESUMED per epoch and
no two events share a key; it ends handed to the live instance (or, when nothing durable happened, untouched);
each email the agent sends is executed by the provider exactly once; a third pass finds nothing left to do.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import uuid
from collections import Counter
from pathlib import Path

import pytest

from runjournal.consumers.ops.inspect import read_all_events
from runjournal.core.settings import Settings
from runjournal.model.reducer import RunStatus
from runjournal.producers import Journal
from runjournal.schemas import EventType
from tests.faults.entrypoints import WRITERS
from tests.support.faults import assigned, live, owned, owns
from tests.support.provider import Provider, child, project, running_provider, wait_lease, wait_lease_gone
from tests.support.workload import publish, run_events

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.slow]

HITS = {"recovery.inside_handover": 1}
"""Failpoint → the hit to die at (1 unless named)."""

CASES = sorted({(w.matrix, fp) for w in WRITERS.values() if w.matrix for fp in w.failpoints})


def _recover(env: dict[str, str], failpoint: str = "") -> subprocess.Popen[str]:
    env = {**env, "RJ_FAILPOINTS": failpoint} if failpoint else env
    return subprocess.Popen([sys.executable, "-m", "runjournal", "recover", "--stale", "--json"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _two_at_once(env: dict[str, str]) -> list[dict]:
    """Two ``recover --stale`` processes started together; both must exit 0 (a lost race is a refusal)."""
    procs = [_recover(env), _recover(env)]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-3000:]
        reports.append(json.loads(out))
    return reports


def _events(settings: Settings) -> list:
    return [ev for evs in read_all_events(settings).values() for ev, _p, _o in evs]


def _check_journal(settings: Settings, runs: list[str]) -> Counter[str]:
    events = [e for e in _events(settings) if e.run_id in runs]
    keys = Counter(e.key for e in events)
    assert max(keys.values(), default=1) == 1, "two events under one key"
    per_epoch = Counter((e.run_id, e.epoch) for e in events if e.type is EventType.RUN_RESUMED)
    assert max(per_epoch.values(), default=1) == 1, f"two RUN_RESUMED at one epoch: {per_epoch}"
    return Counter(e.run_id for e in events if e.type is EventType.RUN_RESUMED)


@pytest.fixture
def provider(tmp_path: Path, service_env: dict[str, str]) -> object:
    with running_provider(tmp_path, service_env) as running:
        yield running


def _scenario_recover(topics: Settings, env: dict[str, str], failpoint: str) -> None:
    runs = [f"mx-{uuid.uuid4().hex[:6]}-{i}" for i in range(3)]
    publish(topics, [e for run in runs for e in run_events(run, finish=False)])
    owns(topics, "dead-1", *runs)
    live(topics, "taker")
    killed = _recover(env, f"{failpoint}={HITS.get(failpoint, 1)}")
    killed.communicate(timeout=180)
    assert killed.returncode == -signal.SIGKILL, killed.returncode
    _two_at_once(env)
    third = _recover(env)
    out, err = third.communicate(timeout=180)
    assert third.returncode == 0 and json.loads(out)["runs"] == [], out
    assert _check_journal(topics, runs) == dict.fromkeys(runs, 1), "each run resumed exactly once"
    assert sorted(assigned(topics, "taker")) == sorted(runs) and owned(topics, "taker") == set(runs)
    assert owned(topics, "dead-1") == set()


_CONTINUE = textwrap.dedent("""
    import sys
    from runjournal import Journal, Settings, continue_run
    with Journal(Settings.load(), producer_id=sys.argv[2], lease_ttl_ms=1500) as journal:
        continue_run(journal, sys.argv[1])
    """)


def _scenario_continue_run(topics: Settings, env: dict[str, str], failpoint: str) -> None:
    run_id = f"mx-{uuid.uuid4().hex[:8]}"
    with Journal(topics, producer_id=f"first-{run_id[-6:]}") as first:
        run = first.start_run("t", "a", {}, run_id=run_id)
        run.fail("the payment provider was down")
    armed = {**env, "RJ_FAILPOINTS": f"{failpoint}={HITS.get(failpoint, 1)}"}
    continuer = f"cont-{run_id[-6:]}"
    done = subprocess.run([sys.executable, "-c", _CONTINUE, run_id, continuer], env=armed, timeout=120,
                          capture_output=True, text=True, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    wait_lease_gone(topics, continuer)
    project(topics)
    live(topics, "taker")
    _two_at_once(env)
    resumed = _check_journal(topics, [run_id])
    state = project(topics).get(_partition(topics, run_id), run_id)
    if failpoint in ("recovery.after_fence", "recovery.after_read"):  # nothing committed: still FAILED, not taken
        assert resumed == {} and state.status is RunStatus.FAILED
        return
    assert resumed == {run_id: 2}, "the dead continuer's epoch, then the sweep's — once each"
    assert state.epoch == 3 and state.owner == "taker" and assigned(topics, "taker") == [run_id]


def _scenario_call(topics: Settings, env: dict[str, str], failpoint: str, provider: Provider) -> None:
    run_id = f"mx-{uuid.uuid4().hex[:8]}"
    agent = f"agent-{run_id[-6:]}"
    crashed = child(env, run_id, agent, provider, failpoint=f"{failpoint}=1", sends=2)
    assert crashed.wait(60) == -signal.SIGKILL, crashed.stderr.read()[-3000:] if crashed.stderr else ""
    wait_lease_gone(topics, agent)
    taker = child(env, run_id, "taker-agent", provider, resume=True, sends=2)
    wait_lease(topics, "taker-agent")
    reports = _two_at_once(env)
    actions = sorted(o["action"] for r in reports for o in r["runs"] if o["run_id"] == run_id)
    if "no_facts" in actions:  # nothing of the run was acknowledged: a caller starts it again
        taker.terminate()
        taker.wait(30)
        taker = child(env, run_id, "fresh-agent", provider, sends=2)
    else:
        assert actions.count("resumed") == 1, actions
    assert taker.wait(90) == 0, taker.stderr.read()[-3000:] if taker.stderr else ""
    _check_journal(topics, [run_id])
    assert provider.executions() == 2, "each of the two emails exactly once"


def _partition(settings: Settings, run_id: str) -> int:
    from runjournal.schemas.keys import partition_for

    return partition_for(run_id, settings.partitions)


@pytest.mark.parametrize(("scenario", "failpoint"), CASES, ids=[f"{s}-{f}" for s, f in CASES])
def test_killed_at_each_failpoint_with_two_recovery_actors_at_once(topics: Settings, service_env: dict[str, str],
                                                                   provider: Provider, scenario: str,
                                                                   failpoint: str) -> None:
    env = {**service_env, "PYTHONPATH": str(Path.cwd())}
    if scenario == "recover":
        _scenario_recover(topics, env, failpoint)
    elif scenario == "continue_run":
        _scenario_continue_run(topics, env, failpoint)
    elif scenario == "call":
        _scenario_call(topics, {**env, "RUNJOURNAL_OUTCOME_COMMIT": "group"}, failpoint, provider)
    else:  # pragma: no cover - a new scenario in the registry needs its driver here
        pytest.fail(f"no driver for matrix scenario {scenario!r}")

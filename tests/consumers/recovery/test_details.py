"""Every run a recovery pass does not resume says why, in words a person can act on (issue 35: ``no_live_instance``
carried no detail at all; ``parked`` gave the reason but not what to do about it). ``runjournal recover`` run as a
user runs it, on the real broker and Redis."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from runjournal.core.settings import Settings
from tests.support.faults import owns
from tests.support.workload import publish, run_events

pytestmark = pytest.mark.integration


def recover(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "runjournal", "recover", *args], env={**env, "COLUMNS": "400"},
                          capture_output=True, text=True, timeout=180, check=False, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_runs_left_without_a_live_instance_or_parked_say_what_to_do(topics: Settings,
                                                                    service_env: dict[str, str]) -> None:
    publish(topics, run_events("idle-a", finish=False) + [e for e in run_events("gap-b", finish=False) if e.seq != 3])
    owns(topics, "dead-1", "idle-a", "gap-b")  # a dead instance's runs, and no instance alive to take them

    runs = {r["run_id"]: r for r in json.loads(recover(service_env, "--instance", "dead-1", "--json").stdout)["runs"]}
    assert runs["idle-a"]["action"] == "no_live_instance", runs
    assert "no instance holds a live lease" in runs["idle-a"]["detail"]
    assert "start an agent (a Journal)" in runs["idle-a"]["detail"]
    assert runs["gap-b"]["action"] == "parked" and "`runjournal projector --rebuild`" in runs["gap-b"]["detail"], runs

    table = recover(service_env, "--instance", "dead-1").stdout  # the run is still waiting: the table says why too
    assert "no_live_instance" in table and "start an agent (a Journal)" in table, table

"""Operator controls as the least-privilege operator on the 3-broker SASL_SSL stack (issue 31).

The operator's Kafka user has no transactional id (``runjournal.deploy.acls``): it may not run a recovery pass, so a
pause or a resume it asks for is left to the recovery service running as the recovery user
(``runjournal.consumers.ops.control``, module docstring). The agent owning the run (tests/support/control_child.py)
gives it up at its next step; ``recover --stale`` as the recovery user holds it, then hands it back after the
operator's resume; every charge runs once (the child's ledger) and the run's events say who asked.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runjournal.schemas import EventType
from tests.cluster.conftest import Tenant, cli
from tests.support.readback import events_of, read_committed

pytestmark = [pytest.mark.cluster, pytest.mark.integration]


def _json(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


STEPS = 120


def test_pause_and_resume_as_the_operator_user_are_carried_out_by_the_recovery_user(tenant: Tenant,
                                                                                      tmp_path: Path) -> None:
    run_id, admin = "secure-ctl-1", tenant.settings()
    # 120 steps (~50 ms each): the run must still be going when the operator's CLI, started after its first call,
    # connects over SASL_SSL (seconds on a loaded host: with 30 steps the run once ended first, 2026-12-04)
    agent = subprocess.Popen([sys.executable, "-m", "tests.support.control_child", run_id, "agent-ctl", str(tmp_path),
                              str(STEPS)], env=tenant.env("agent"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        deadline = time.monotonic() + 120
        while not any(e.type is EventType.TOOL_CALL_COMMITTED for e in events_of(read_committed(admin), run_id)):
            assert time.monotonic() < deadline and agent.poll() is None, "the agent made no call"
            time.sleep(0.5)
        (paused,) = _json(cli(tenant.env("operator"), "pause", run_id, "--by", "ops@test", "--wait", "5",
                              "--json"))["results"]
        assert paused["outcome"] == "requested" and "recovery service" in paused["detail"], paused
        assert json.loads(agent.stdout.readline())["stopped"] == "pause"
        swept = _json(cli(tenant.env("recovery"), "recover", "--stale", "--json"))
        assert [r["action"] for r in swept["runs"] if r["run_id"] == run_id] == ["paused"], swept
        (resumed,) = _json(cli(tenant.env("operator"), "resume", run_id, "--by", "lead@test", "--wait", "2",
                               "--json"))["results"]
        assert resumed["outcome"] == "requested" and resumed["request"]["action"] == "resume", resumed
        _json(cli(tenant.env("recovery"), "recover", "--stale", "--json"))  # the sweep, then its wake pass
        out, err = agent.communicate(timeout=180)
        assert agent.returncode == 0, err[-3000:]
        assert json.loads(out.splitlines()[-1]) == {"done": True}
    finally:
        agent.kill()
    ran = {p.name: len(p.read_text().splitlines()) for p in tmp_path.iterdir()}
    assert len(ran) == STEPS and set(ran.values()) == {1}, ran
    events = events_of(read_committed(admin), run_id)
    held = [e.payload for e in events if e.type is EventType.RUN_RESUMED]
    assert [(bool(p.get("paused")), p.get("requested_by")) for p in held] == [(True, "ops@test"),
                                                                            (False, "lead@test")]
    assert events[-1].type is EventType.RUN_SUCCEEDED

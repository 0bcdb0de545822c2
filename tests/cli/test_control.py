"""``runjournal cancel`` / ``pause`` / ``resume`` as a user runs them (subprocesses, real stack; issue 31).

The run is owned by a live agent process (tests/support/control_child.py) charging in a loop; its ledger (one file
per idempotency key, one line per execution) is the witness that nothing ran twice and nothing was dropped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from runjournal.core.settings import Settings
from runjournal.schemas import EventType
from tests.cli.test_paths import json_error, rj
from tests.support.readback import events_of, read_committed, wait_first_call

pytestmark = pytest.mark.integration


def _agent(env: dict[str, str], run_id: str, ledger: Path, steps: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.support.control_child", run_id, f"ag-{uuid.uuid4().hex[:6]}",
                             str(ledger), str(steps)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _executions(ledger: Path) -> dict[str, int]:
    return {p.name: len(p.read_text().splitlines()) for p in ledger.iterdir()}


def test_cancel_a_live_agents_run_from_the_command_line(topics: Settings, service_env: dict[str, str],
                                                        tmp_path: Path) -> None:
    run_id = f"cli-cancel-{uuid.uuid4().hex[:6]}"
    agent = _agent(service_env, run_id, tmp_path, steps=10_000)
    try:
        wait_first_call(topics, run_id, child=agent)
        proc, _ = rj(service_env, "cancel", run_id, "--reason", "runaway loop", "--by", "ops@test", "--json",
                     timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (result,) = json.loads(proc.stdout)["results"]
        assert result["outcome"] == "cancelled" and result["seen"] is True, result
        out, err = agent.communicate(timeout=60)
        assert agent.returncode == 0, err[-3000:]
        assert json.loads(out.splitlines()[-1]) == {"stopped": "cancel", "by": "ops@test"}
    finally:
        agent.kill()
    events = events_of(read_committed(topics), run_id)
    assert events[-1].type is EventType.RUN_CANCELLED and events[-1].payload["requested_by"] == "ops@test"
    assert all(n == 1 for n in _executions(tmp_path).values())
    committed = {e.payload["call_id"] for e in events if e.type is EventType.TOOL_CALL_COMMITTED}
    assert committed == set(_executions(tmp_path)), "every charge that ran is recorded, none recorded that did not run"
    again, _ = rj(service_env, "cancel", run_id, "--json", timeout=60)
    assert again.returncode == 1 and "already ended" in json_error(again)["message"]


def test_pause_then_resume_from_the_command_line_runs_every_step_once(topics: Settings, service_env: dict[str, str],
                                                                      tmp_path: Path) -> None:
    run_id = f"cli-pause-{uuid.uuid4().hex[:6]}"
    agent = _agent(service_env, run_id, tmp_path, steps=40)
    try:
        wait_first_call(topics, run_id, child=agent)
        proc, _ = rj(service_env, "pause", run_id, "--reason", "budget review", "--json", timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (paused,) = json.loads(proc.stdout)["results"]
        assert paused["outcome"] == "paused" and paused["status"] == "PAUSED", paused
        first = agent.stdout.readline()
        assert json.loads(first)["stopped"] == "pause"
        done_before = len(_executions(tmp_path))
        time.sleep(1.0)
        assert len(_executions(tmp_path)) == done_before, "nothing runs while the run is paused"
        twice, _ = rj(service_env, "pause", run_id, "--json", timeout=60)
        assert twice.returncode == 1 and "paused already" in json_error(twice)["message"]
        resumed, _ = rj(service_env, "resume", run_id, "--reason", "approved", "--json", timeout=120)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        (result,) = json.loads(resumed.stdout)["results"]
        assert result["outcome"] == "resumed", result
        out, err = agent.communicate(timeout=120)
        assert agent.returncode == 0, err[-3000:]
        assert json.loads(out.splitlines()[-1]) == {"done": True}
    finally:
        agent.kill()
    runs = _executions(tmp_path)
    assert len(runs) == 40 and all(n == 1 for n in runs.values()), runs
    events = events_of(read_committed(topics), run_id)
    assert events[-1].type is EventType.RUN_SUCCEEDED
    held = [e for e in events if e.type is EventType.RUN_RESUMED and e.payload.get("paused")]
    assert len(held) == 1 and held[0].payload["request_reason"] == "budget review"


def test_bulk_dry_run_lists_and_changes_nothing_and_usage_errors_are_named(topics: Settings,
                                                                           service_env: dict[str, str],
                                                                           tmp_path: Path) -> None:
    proc, _ = rj(service_env, "cancel", "--json", timeout=60)
    assert proc.returncode == 2 and json_error(proc)["error"] == "UsageError"
    proc, _ = rj(service_env, "cancel", "r1", "--tenant", "t", "--json", timeout=60)
    assert proc.returncode == 2
    proc, _ = rj(service_env, "pause", "--older-than", "soon", "--json", timeout=60)
    assert proc.returncode == 2 and "duration" in proc.stderr
    proc, _ = rj(service_env, "resume", "r1", "--wait", "-1", timeout=60)
    assert proc.returncode == 2
    proc, _ = rj(service_env, "cancel", f"nobody-{uuid.uuid4().hex[:6]}", "--json", timeout=60)
    assert proc.returncode == 1 and "never started" in json_error(proc)["message"]
    run_id = f"cli-bulk-{uuid.uuid4().hex[:6]}"
    agent = _agent(service_env, run_id, tmp_path, steps=10_000)
    try:
        wait_first_call(topics, run_id, child=agent)
        # the filters read the runs index: a projector keeps it (the agent writes all the time: run it beside)
        projector = subprocess.Popen([sys.executable, "-m", "runjournal", "projector"], env=service_env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline, doc = time.monotonic() + 60, {"results": []}
        while not doc["results"] and time.monotonic() < deadline:
            proc, _ = rj(service_env, "cancel", "--agent", "charger", "--status", "running", "--dry-run", "--json",
                         timeout=60)
            assert proc.returncode == 0, proc.stderr[-2000:]
            doc = json.loads(proc.stdout)
        assert doc["dry_run"] is True and [r["run_id"] for r in doc["results"]] == [run_id]
        assert doc["results"][0]["outcome"] == "would_cancel"
        # every filter and option of the three commands, as dry runs (the runs index decides; nothing changes)
        proc, _ = rj(service_env, "pause", "--tenant", "t", "--older-than", "1s", "--limit", "5", "--by", "ops@test",
                     "--reason", "r", "--wait", "1", "--dry-run", "--json", timeout=60)
        assert [r["outcome"] for r in json.loads(proc.stdout)["results"]] == ["would_pause"], proc.stderr[-2000:]
        proc, _ = rj(service_env, "resume", "--agent", "charger", "--status", "PAUSED", "--tenant", "t",
                     "--older-than", "1s", "--limit", "5", "--by", "ops@test", "--reason", "r", "--wait", "1",
                     "--dry-run", "--json", timeout=60)
        assert json.loads(proc.stdout)["results"] == [], "nothing is paused"
        proc, _ = rj(service_env, "cancel", "--tenant", "t", "--older-than", "1s", "--limit", "1", "--dry-run",
                     timeout=60)
        assert proc.returncode == 0 and "1 run(s) match" in proc.stderr and "would_cancel" in proc.stderr
        assert agent.poll() is None, "a dry run changes nothing: the agent goes on"
        proc, _ = rj(service_env, "cancel", "--agent", "charger", "--wait", "30", timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert f"{run_id}: cancelled" in proc.stderr
        agent.communicate(timeout=60)
    finally:
        agent.kill()
        if "projector" in locals():
            projector.terminate()
            projector.wait(30)


def test_inspect_says_what_operators_and_waits_did() -> None:
    """``runjournal inspect``'s lines for a paused, a waiting, a sleeping, a cancelled and a forked run."""
    from runjournal.cli.projector import _control_lines

    assert _control_lines("r", {"status": "PAUSED", "requested_by": "ops", "request_reason": "budget"}) == [
        "paused by ops: budget (runjournal resume r)"]
    assert _control_lines("r", {"status": "PAUSED", "waiting_for": "approved"}) == [
        "waiting for signal 'approved' (runjournal signal r approved)"]
    assert "sleeping until 5" in _control_lines("r", {"status": "PAUSED", "resume_at_ms": 5})[0]
    assert _control_lines("r", {"status": "CANCELLED", "requested_by": "ops"}) == ["cancelled by ops"]
    assert _control_lines("f", {"status": "RUNNING", "forked_from": "s", "forked_at_seq": 4,
                                "requested_by": "ops"})[-1] == "forked from s at seq 4"


def test_bad_values_are_refused_before_anything_changes(topics: Settings, service_env: dict[str, str]) -> None:
    """Found by a user trying to break the commands: a --status typo selected nothing with exit 0; a fork's dry run
    said would_fork for an id that exists (the source's own) and for an instance that does not exist (the real fork
    then handed the run to nobody); an id with a newline or ESC reached the terminal raw, over two lines."""
    from runjournal.producers import Journal

    proc, _ = rj(service_env, "cancel", "--status", "BOGUS", "--dry-run", "--json", timeout=60)
    assert proc.returncode == 2 and "not a run status" in json_error(proc)["message"]
    proc, _ = rj(service_env, "cancel", "--status", "running", "--dry-run", "--json", timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]  # any case
    proc, _ = rj(service_env, "cancel", "a\nb\x1b[31m", timeout=60)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "a\\nb\\x1b[31m" in proc.stderr and "\x1b" not in proc.stderr
    source = f"cli-src-{uuid.uuid4().hex[:6]}"
    with Journal(topics, producer_id=f"ag-{uuid.uuid4().hex[:6]}") as journal:
        journal.start_run("t", "a", {}, run_id=source).succeed("done")
    for args, said in ((["--run-id", source], "exists"), (["--assign-to", "nobody-here"], "no live instance")):
        proc, _ = rj(service_env, "fork", source, *args, "--dry-run", "--json", timeout=60)
        assert proc.returncode == 1 and said in json_error(proc)["message"], proc.stderr[-2000:]

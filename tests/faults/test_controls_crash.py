"""Operator controls against real crashes (issue 31): a cancel while the owner is SIGKILLed between a side effect's
intent and its request, and while the owner is a SIGSTOPped zombie. The call in flight is reconciled by the next owner
(not executed), the run ends RUN_CANCELLED, and the zombie, woken, sends nothing. The ledger (one file per idempotency
key, one line per execution) is the witness."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from runjournal.core.settings import Settings
from runjournal.schemas import EventType
from tests.cli.test_paths import rj
from tests.support.readback import events_of, read_committed

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.slow]


def _child(env: dict[str, str], run_id: str, ledger: Path, *extra: str, failpoint: str = "") -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.support.control_child", run_id, f"c-{uuid.uuid4().hex[:6]}",
                             str(ledger), "50", *extra], env={**env, **({"RJ_FAILPOINTS": failpoint} if failpoint
                                                                      else {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ran(ledger: Path) -> dict[str, int]:
    return {p.name: len(p.read_text().splitlines()) for p in ledger.iterdir()}


@pytest.mark.parametrize("how", ["sigkill", "zombie"])
def test_a_cancel_while_the_owner_is_killed_or_paused_mid_call(topics: Settings, service_env: dict[str, str],
                                                                tmp_path: Path, how: str) -> None:
    run_id = f"cx-{how}-{uuid.uuid4().hex[:6]}"
    # a zombie stops after its intent, before its lease check (past the check only the provider's fencing token can
    # stop a paused request: tests/consumers/recovery/test_recovery.py); a kill lands after the check, before the send
    point = "producers.call.after_intent=3:stop" if how == "zombie" else "producers.call.before_send=3"
    owner = _child(service_env, run_id, tmp_path, failpoint=point)
    taker = _child(service_env, run_id, tmp_path, "take")
    try:
        if how == "sigkill":
            assert owner.wait(60) == -signal.SIGKILL, owner.stderr.read()[-2000:]
        else:
            deadline = time.monotonic() + 60
            while len(_ran(tmp_path)) < 2:  # two charges done, the third intended: the owner stops itself there
                assert time.monotonic() < deadline and owner.poll() is None
                time.sleep(0.1)
            time.sleep(2.0)  # past its 1.2 s lease: presumed dead
        assert json.loads(taker.stdout.readline())["ready"]
        proc, _ = rj(service_env, "cancel", run_id, "--reason", f"stop it ({how})", "--json", timeout=180)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out, err = taker.communicate(timeout=120)
        assert taker.returncode == 0, err[-3000:]
        assert json.loads(out.splitlines()[-1])["stopped"] == "cancel"
        if how == "zombie":
            owner.send_signal(signal.SIGCONT)
            assert owner.wait(60) != 0  # fenced: it sends nothing
    finally:
        for p in (owner, taker):
            if p.poll() is None:
                p.kill()
    ran = _ran(tmp_path)
    assert len(ran) == 2 and all(n == 1 for n in ran.values()), ran  # the third charge never ran, the others once
    events = events_of(read_committed(topics), run_id)
    assert events[-1].type is EventType.RUN_CANCELLED
    reconciled = [e for e in events if e.type is EventType.TOOL_CALL_RECONCILED]
    assert [e.payload["outcome"] for e in reconciled] == ["NOT_EXECUTED"]  # asked, never run blind
    last_cancel = max(i for i, e in enumerate(events) if e.type is EventType.RUN_CANCELLED)
    assert not any(e.type is EventType.TOOL_CALL_INTENDED for e in events[last_cancel:])


def test_a_pause_while_the_owner_is_killed_mid_call_then_a_resume_runs_every_step_once(
        topics: Settings, service_env: dict[str, str], tmp_path: Path) -> None:
    run_id = f"px-{uuid.uuid4().hex[:6]}"
    owner = _child(service_env, run_id, tmp_path, failpoint="producers.call.before_send=3")
    taker = _child(service_env, run_id, tmp_path, "take")
    try:
        assert owner.wait(60) == -signal.SIGKILL, owner.stderr.read()[-2000:]
        assert json.loads(taker.stdout.readline())["ready"]
        paused, _ = rj(service_env, "pause", run_id, "--reason", "hold it", "--json", timeout=180)
        assert paused.returncode == 0 and json.loads(paused.stdout)["results"][0]["outcome"] == "paused", \
            paused.stderr[-3000:]
        time.sleep(1.0)
        assert len(_ran(tmp_path)) == 2, "held for nobody: nothing runs"
        resumed, _ = rj(service_env, "resume", run_id, "--json", timeout=180)
        assert resumed.returncode == 0 and json.loads(resumed.stdout)["results"][0]["outcome"] == "resumed", \
            resumed.stderr[-3000:]
        out, err = taker.communicate(timeout=180)
        assert taker.returncode == 0 and json.loads(out.splitlines()[-1]) == {"done": True}, err[-3000:]
    finally:
        for p in (owner, taker):
            if p.poll() is None:
                p.kill()
    ran = _ran(tmp_path)
    assert len(ran) == 50 and all(n == 1 for n in ran.values()), ran

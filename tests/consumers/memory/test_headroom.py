"""Issue 20 (memory isolated): the extractor waits for idle CPU before each batch of a backlog.

Priority alone (nice 19 + ``SCHED_IDLE``) left a projector rebuild at 0.86-0.90 of its speed beside a busy
extractor on 2 cores (bench pair 5): the extractor filled the gaps the projector, broker and Redis leave, and
shared caches slowed the projector's own work. ``CpuHeadroom`` makes it yield work, not just priority: while the
rest of the host leaves fewer than ``RUNJOURNAL_MEMORY_HEADROOM_CORES`` cores idle it waits, at most
``RUNJOURNAL_MEMORY_HEADROOM_WAIT_MS`` per batch, so memory lags and never stops. Burners here are real
processes spinning on every core; the command runs in a subprocess on the real stack.
"""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runjournal.consumers.memory import headroom as _headroom
from runjournal.consumers.memory.headroom import CpuHeadroom
from runjournal.core.settings import Settings
from tests.support.workload import publish, run_events

BIN = str(Path(sys.executable).with_name("runjournal"))


def _spin(stop_at: float, spinning: Any) -> None:
    spinning.set()
    while time.monotonic() < stop_at:
        pass


@pytest.fixture
def burners() -> Iterator[None]:
    """One CPU-bound process per core for the test's duration (normal priority: 'the rest of the host')."""
    ctx = multiprocessing.get_context("spawn")
    flags = [ctx.Event() for _ in range(multiprocessing.cpu_count())]
    procs = [ctx.Process(target=_spin, args=(time.monotonic() + 600, flag), daemon=True) for flag in flags]
    for p in procs:
        p.start()
    for flag in flags:  # a spawned child imports this module first: on a loaded host that takes seconds
        assert flag.wait(60), "a burner never started"
    time.sleep(0.5)  # spinning, and seen spinning by the host's CPU times
    try:
        yield
    finally:
        for p in procs:
            p.terminate()
            p.join(10)


def test_a_busy_host_makes_the_gate_wait_its_bound_and_a_stop_ends_the_wait(burners: None) -> None:
    gate = CpuHeadroom(1.0, 1.0)
    time.sleep(0.3)
    waited = gate.wait()
    assert 0.9 <= waited < 3.0 and gate.waits == 1 and gate.waited_s == pytest.approx(waited)
    stop = threading.Event()
    stop.set()
    started = time.monotonic()
    gate.wait(stop)
    assert time.monotonic() - started < 0.5


def test_the_gate_is_off_at_zero_cores_or_zero_wait(burners: None) -> None:
    for gate in (CpuHeadroom(0, 1.0), CpuHeadroom(1.0, 0)):
        assert not gate.enabled and gate.wait() == 0.0 and gate.waits == 0


def test_idle_cores_leave_out_the_process_own_cpu_and_the_cap_keeps_one_core_hosts_moving(
        monkeypatch: pytest.MonkeyPatch) -> None:
    samples = iter([_headroom._Sample(0.0, 0.0, 0.0),  # constructed
                    _headroom._Sample(1.0, 1.5, 1.0),  # host busy 1.5 core-s, of which this process 1.0
                    _headroom._Sample(2.0, 3.5, 1.0)])  # others used 2 cores of 2
    monkeypatch.setattr(_headroom, "_sample", lambda: next(samples))
    monkeypatch.setattr(_headroom.psutil, "cpu_count", lambda: 2)
    gate = CpuHeadroom(1.0, 1.0)
    assert gate.idle_cores() == pytest.approx(1.5)
    assert gate.idle_cores() == pytest.approx(0.0)
    monkeypatch.setattr(_headroom.psutil, "cpu_count", lambda: 1)
    monkeypatch.setattr(_headroom, "_sample", lambda: _headroom._Sample(0.0, 0.0, 0.0))
    assert CpuHeadroom(1.0, 1.0).cores == 0.5


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="cores and max_wait_s must be >= 0"):
        CpuHeadroom(-1, 1.0)


def _extract(env: dict[str, str]) -> dict:
    # time-sharing at nice 0: the gate does not depend on priority, and under SCHED_IDLE beside a burner per core
    # the extractor would get no CPU to start with
    env = {**env, "RUNJOURNAL_MEMORY_SCHED": "other", "RUNJOURNAL_MEMORY_NICE": "0"}
    out = subprocess.run([BIN, "memory-extractor", "--until-caught-up", "--batch-size", "10", "--json"], env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.integration
def test_the_extractor_waits_for_headroom_on_a_busy_host_and_still_catches_up(
        topics: Settings, service_env: dict[str, str], burners: None) -> None:
    publish(topics, [e for i in range(4) for e in run_events(f"headroom-{i}")])
    stats = _extract({**service_env, "RUNJOURNAL_MEMORY_HEADROOM_WAIT_MS": "500"})
    assert stats["events"] >= 4 * len(run_events("headroom-0")) and stats["batches"] >= 2
    assert stats["headroom_wait_s"] >= 0.4, stats  # at least one batch waited about its bound


@pytest.mark.integration
def test_zero_headroom_cores_turns_the_gate_off(topics: Settings, service_env: dict[str, str], burners: None) -> None:
    publish(topics, [e for i in range(4) for e in run_events(f"headroom-off-{i}")])
    stats = _extract({**service_env, "RUNJOURNAL_MEMORY_HEADROOM_CORES": "0"})
    assert stats["batches"] >= 2 and stats["headroom_wait_s"] == 0.0

"""Crash tests with real processes: SIGKILLed projectors, a second group member, a restarted Redis.

``tests/cluster/test_redis_cluster.py`` runs these same tests against a 3-master Redis Cluster (it overrides the
``settings`` and ``private_redis`` fixtures): there the restarted Redis is one master of a private cluster.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from runjournal.consumers.projector import Projector
from runjournal.core import redis_client
from runjournal.core.settings import Settings
from runjournal.deploy.procs import Proc, free_port, spawn
from tests.consumers.projector.test_projector import redis_digests, topic_fold_digests
from tests.support.workload import interleave, publish, run_events

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.slow]


def projector_proc(env: dict[str, str], *args: str, failpoints: str = "") -> subprocess.Popen[str]:
    env = {**env, "RJ_FAILPOINTS": failpoints} if failpoints else env
    return subprocess.Popen([sys.executable, "-m", "runjournal", "projector", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def workload(settings: Settings, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    runs = [run_events(f"s{seed}-{i}", calls=rng.randint(0, 4), finish=rng.random() < 0.8) for i in range(n)]
    publish(settings, interleave(runs, rng))
    return [r[0].run_id for r in runs]


@pytest.mark.parametrize("point", ["projector.before_write", "projector.after_write", "projector.write_in_flight"])
def test_sigkill_mid_batch_then_restart_equals_uninterrupted(topics: Settings, service_env: dict[str, str],
                                                             point: str) -> None:
    ids = workload(topics, 60, seed=11)
    crashed = projector_proc(service_env, "--until-caught-up", "--batch-size", "25", failpoints=f"{point}=3")
    assert crashed.wait(120) == -signal.SIGKILL, crashed.stderr.read()[-2000:]
    partial = redis_digests(topics, ids)
    assert set(partial.values()) != {None} or point.endswith("before_write")
    again = projector_proc(service_env, "--until-caught-up", "--json")
    out, err = again.communicate(timeout=180)
    assert again.returncode == 0, err[-2000:]
    assert redis_digests(topics, ids) == topic_fold_digests(topics, ids)
    assert json.loads(out.splitlines()[-1])["conflicts"] == 0


def _assigned(stderr_lines: list[str]) -> set[int]:
    """Partitions this member holds, from its 'assigned' / 'revoked' JSON log lines."""
    held: set[int] = set()
    for line in stderr_lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("msg") == "assigned":
            held |= {int(p) for p in rec["partitions"]}
        elif rec.get("msg") in {"revoked", "partitions lost"}:
            held -= set(rec["partitions"])
    return held


def _drain(proc: subprocess.Popen[str], sink: list[str]) -> threading.Thread:
    t = threading.Thread(target=lambda: sink.extend(iter(proc.stderr.readline, "")), daemon=True)
    t.start()
    return t


def test_two_members_split_partitions_and_survive_a_kill(topics: Settings, service_env: dict[str, str]) -> None:
    logs_a: list[str] = []
    logs_b: list[str] = []
    a = projector_proc(service_env)
    b = projector_proc(service_env)
    _drain(a, logs_a), _drain(b, logs_b)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (_assigned(logs_a) and _assigned(logs_b)):
            time.sleep(0.2)
        held_a, held_b = _assigned(logs_a), _assigned(logs_b)
        assert held_a and held_b and not held_a & held_b and held_a | held_b == set(range(topics.partitions))
        ids = workload(topics, 40, seed=21)
        time.sleep(1.0)
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        ids += workload(topics, 40, seed=22)
        deadline = time.monotonic() + 120  # the group notices the dead member after session.timeout.ms (45 s)
        while time.monotonic() < deadline and _assigned(logs_b) != set(range(topics.partitions)):
            time.sleep(0.5)
        assert _assigned(logs_b) == set(range(topics.partitions))
        expected = topic_fold_digests(topics, ids)
        while time.monotonic() < deadline and redis_digests(topics, ids) != expected:
            time.sleep(0.5)
        assert redis_digests(topics, ids) == expected
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.terminate()
                p.wait(30)


@dataclass
class PrivateRedis:
    """A redis-server of the test's own (AOF, ``appendfsync everysec``) that the test restarts."""

    tmp: Path
    port: int
    proc: Proc | None = None

    @property
    def url(self) -> str:
        """``RUNJOURNAL_REDIS_URL`` for it."""
        return f"redis://127.0.0.1:{self.port}/0"

    def overrides(self) -> dict[str, object]:
        """Settings that point at it (no user, no TLS)."""
        return {"redis_url": self.url, "redis_username": None, "redis_password": None, "redis_ssl_ca_location": None}

    def start(self) -> None:
        """Start it (on its AOF) and wait until it answers."""
        argv = ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.tmp),
                "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--daemonize", "no"]
        self.proc = spawn(argv, log_path=self.tmp / "redis.log", cwd=self.tmp)
        client = redis_client.client(None, url=self.url)
        for _ in range(100):
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise AssertionError("private redis did not start")

    def go_away(self, how: str) -> None:
        """``restart``: SHUTDOWN (flushes the AOF; scripts are forgotten); ``sigkill``: SIGKILL (the last second of
        writes may be lost)."""
        assert self.proc is not None
        if how == "restart":
            redis_client.client(None, url=self.url).shutdown()
        else:
            os.kill(self.proc.pid, signal.SIGKILL)

    def stop(self) -> None:
        """Stop it for good."""
        if self.proc is not None:
            self.proc.stop(grace_s=5)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A private Redis, started (``tests/cluster`` overrides it with a private 3-master Redis Cluster)."""
    private = PrivateRedis(tmp_path, free_port())
    private.start()
    try:
        yield private
    finally:
        private.stop()


@pytest.mark.parametrize("how", ["restart", "sigkill"])
def test_redis_restart_midstream_no_loss_no_double_apply(topics: Settings, private_redis: PrivateRedis,
                                                        how: str) -> None:
    """Redis restarted under a running projector: NOSCRIPT reload, or (SIGKILL) a lost last second → re-seek."""
    settings = topics.model_copy(update=private_redis.overrides())
    ids = workload(settings, 30, seed=31)
    projector = Projector(settings, batch_size=50)
    stop = threading.Event()
    worker = threading.Thread(target=projector.run, kwargs={"stop": stop})
    worker.start()
    try:
        expected = topic_fold_digests(settings, ids)
        deadline = time.monotonic() + 60
        while redis_digests(settings, ids) != expected and time.monotonic() < deadline:
            time.sleep(0.2)
        private_redis.go_away(how)
        time.sleep(0.5)
        private_redis.start()
        ids += workload(settings, 30, seed=32)
        expected = topic_fold_digests(settings, ids)
        deadline = time.monotonic() + 90
        while redis_digests(settings, ids) != expected and time.monotonic() < deadline:
            time.sleep(0.3)
        assert redis_digests(settings, ids) == expected
        assert worker.is_alive(), "the projector must ride out a Redis restart"
    finally:
        stop.set()
        worker.join(60)

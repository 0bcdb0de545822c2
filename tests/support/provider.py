"""The demo provider as a test witness, and agent child processes (shared by recovery, replay and approval tests).

The provider's SQLite ledger (idempotency OFF, so a repeat would show) is the independent witness
of how many times an effect really ran. ``child`` starts ``tests.support.agent_child``.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from runjournal.consumers.projector import ProjectionStore, Projector
from runjournal.core import redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.demo.provider import ledger_stats
from runjournal.deploy.procs import free_port


@dataclass
class Provider:
    """A running ``runjournal.demo.provider`` process."""

    url: str
    db: Path
    proc: subprocess.Popen

    def executions(self, tool: str = "send_email") -> int:
        """Rows in the ledger for ``tool``: how many times it really ran."""
        db = sqlite3.connect(str(self.db))
        try:
            return ledger_stats(db)["per_tool"].get(tool, 0)
        finally:
            db.close()


@contextmanager
def running_provider(tmp_path: Path, env: dict[str, str]) -> Iterator[Provider]:
    """Start the provider on a free port (idempotency off, 20 ms latency); terminate it on exit."""
    import httpx

    port = free_port()
    db = tmp_path / "ledger.db"
    proc = subprocess.Popen([sys.executable, "-m", "runjournal.demo.provider", "--db", str(db), "--port", str(port),
                             "--idempotency", "off", "--latency-ms", "20"], env=env)
    for _ in range(100):
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    try:
        yield Provider(f"http://127.0.0.1:{port}", db, proc)
    finally:
        proc.terminate()
        proc.wait(10)


def child(env: dict[str, str], run_id: str, producer_id: str, provider: Provider, *, resume: bool = False,
          failpoint: str = "", sends: int = 1, approval: bool = False) -> subprocess.Popen:
    """Start ``tests.support.agent_child`` (``approval``: the send waits for a human through the inbox)."""
    env = {**env, "RJ_FAILPOINTS": failpoint} if failpoint else env
    argv = [sys.executable, "-m", "tests.support.agent_child", run_id, producer_id, provider.url,
            "resume" if resume else "start", str(sends), *(["approval"] if approval else [])]
    return subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)


def wait_lease_gone(settings: Settings, producer_id: str, timeout_s: float = 10) -> None:
    """Wait until ``producer_id``'s lease key has expired (at most ``timeout_s`` seconds)."""
    r, key = redis_client.client(settings), RedisKeys(settings.topic_prefix).lease(producer_id)
    deadline = time.monotonic() + timeout_s
    while r.exists(key) and time.monotonic() < deadline:
        time.sleep(0.1)


def wait_lease(settings: Settings, producer_id: str, timeout_s: float = 30) -> None:
    """Wait until ``producer_id`` holds a lease (its Journal started); assert it does."""
    r, key = redis_client.client(settings), RedisKeys(settings.topic_prefix).lease(producer_id)
    deadline = time.monotonic() + timeout_s
    while not r.exists(key) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert r.exists(key)


def project(settings: Settings) -> ProjectionStore:
    """Run a projector until it has caught up; return its store."""
    projector = Projector(settings)
    projector.run(until_caught_up=True, idle_timeout_s=60)
    return projector.store

"""The production shape, for real: three KRaft brokers on loopback, SASL_SSL + SCRAM, the roles' ACLs.

One session stack, started the way a user starts it — ``runjournal stack up --brokers 3 --secure`` in a
temp directory on free ports — and stopped with ``runjournal stack down`` at the end (no process left).
``RJ_TEST_CLUSTER_STACK_DIR`` names an already running secure 3-broker stack instead (kept running).

Every test gets a fresh topic prefix: the administrator grants each role its ACLs for that prefix
(``runjournal.deploy.acls``), the *operator* creates the topics, and each service runs with its role's
credentials as ``runjournal stack env --role ROLE`` prints them. The test's own oracle (fresh reads,
Redis checks) uses the administrator.

Every module here sets ``pytestmark = [pytest.mark.cluster, …]``: ``make test`` leaves them out,
``make test-cluster`` runs them.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runjournal.core.settings import Settings
from runjournal.deploy import acls
from runjournal.deploy.kafka_cluster import admin_settings
from runjournal.deploy.procs import free_port


def base_env() -> dict[str, str]:
    """This process's environment without any ``RUNJOURNAL_*`` variable."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RUNJOURNAL_")}


RUNJOURNAL = str(Path(sys.executable).with_name("runjournal"))
"""The installed console script (not ``python -m`` from the checkout: nothing of the checkout is importable)."""


def cli(env: dict[str, str], *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """``runjournal ARGS`` with ``env``, from a directory outside the checkout — the way a user runs it."""
    return subprocess.run([RUNJOURNAL, *args], env=env, capture_output=True, text=True, timeout=timeout_s,
                          check=False, cwd=tempfile.gettempdir())


def free_port_block(count: int) -> int:
    """A base port with ``count`` consecutive free ports on 127.0.0.1 (node i uses base + 2i, base + 2i + 1).

    Chosen below the kernel's ephemeral range (``ip_local_port_range``): a port in it may be taken by any
    outgoing connection between this check and the broker's bind (seen: "Address already in use")."""
    try:
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    for _ in range(200):
        base = random.randint(10000, max(10001, ephemeral_low - count - 1))
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                s.bind(("127.0.0.1", port))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no block of free ports found")


@dataclass
class Cluster:
    """The running secure 3-broker stack."""

    stack_dir: Path
    """Its ``RUNJOURNAL_STACK_DIR``."""

    def state(self) -> dict[str, Any]:
        """``stack.json``."""
        return json.loads((self.stack_dir / "stack.json").read_text())

    def env(self, role: str | None = None, **extra: str) -> dict[str, str]:
        """Environment of a process: the stack dir, plus ``role``'s settings as ``stack env --role`` prints them."""
        env = {**base_env(), "RUNJOURNAL_STACK_DIR": str(self.stack_dir)}
        if role is not None:
            out = cli(env, "stack", "env", "--role", role, "--json")
            assert out.returncode == 0, out.stderr
            env.update(json.loads(out.stdout))
        env.update(extra)
        return env

    def admin(self) -> Settings:
        """The stack's administrator (a super user): the tests' oracle."""
        settings = admin_settings(self.state()["kafka"])
        assert settings is not None
        return settings


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The session's secure 3-broker stack (see the module docstring)."""
    given = os.environ.get("RJ_TEST_CLUSTER_STACK_DIR")
    if given:
        yield Cluster(Path(given))
        return
    stack_dir = tmp_path_factory.mktemp("cluster")
    env = {**base_env(), "RUNJOURNAL_STACK_DIR": str(stack_dir)}
    base = free_port_block(6)
    up = cli(env, "stack", "up", "--brokers", "3", "--secure", "--json", "--kafka-port", str(base),
             "--controller-port", str(base + 1), "--redis-port", str(free_port()), timeout_s=600)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield Cluster(stack_dir)
    finally:
        down = cli(env, "stack", "down", "--json")
        assert down.returncode == 0, down.stderr


@dataclass
class Tenant:
    """One test's slice of the cluster: a topic prefix with every role's ACLs, its topics created."""

    cluster: Cluster
    """The stack."""
    prefix: str
    """Topic prefix (Redis keys, groups and transactional ids derive from it)."""
    work: Path
    """The test's temp dir (Qdrant path)."""
    partitions: int = 3
    """Events topic partitions."""

    def env(self, role: str | None) -> dict[str, str]:
        """A ``role`` process's environment for this prefix."""
        return self.cluster.env(role, RUNJOURNAL_TOPIC_PREFIX=self.prefix, RUNJOURNAL_PARTITIONS=str(self.partitions),
                                RUNJOURNAL_REDIS_URL=self.cluster.state()["redis"]["url"],
                                RUNJOURNAL_QDRANT_PATH=str(self.work / "qdrant"))

    def settings(self, role: str | None = None) -> Settings:
        """Settings of ``role`` (None: the administrator) for this prefix, built like ``Settings.load`` in a child."""
        if role is None:
            admin = self.cluster.admin()
            return admin.model_copy(update={"topic_prefix": self.prefix, "partitions": self.partitions,
                                            "replication_factor": 3, "stack_dir": self.cluster.stack_dir,
                                            "redis_url": self.cluster.state()["redis"]["url"],
                                            "qdrant_path": self.work / "qdrant"})
        env = self.env(role)
        fields = {k[len("RUNJOURNAL_"):].lower(): v for k, v in env.items() if k.startswith("RUNJOURNAL_")}
        return Settings.load(**fields)


def new_tenant(cluster: Cluster, work: Path) -> Tenant:
    """A fresh prefix with the roles' ACLs granted by the administrator (no topics yet)."""
    t = Tenant(cluster, f"c{uuid.uuid4().hex[:10]}", work)
    acls.create_acls(cluster.admin(), {r: f"User:{r}" for r in acls.ROLES}, prefix=t.prefix)
    return t


def operator_creates_topics(t: Tenant) -> list[dict[str, Any]]:
    """``runjournal topics create --json`` as the operator; returns its report."""
    created = cli(t.env("operator"), "topics", "create", "--json")
    assert created.returncode == 0, created.stderr
    report: list[dict[str, Any]] = json.loads(created.stdout)
    return report


@pytest.fixture
def tenant(cluster: Cluster, tmp_path: Path) -> Tenant:
    """A fresh prefix: the roles' ACLs granted by the administrator, the topics created by the operator."""
    t = new_tenant(cluster, tmp_path)
    operator_creates_topics(t)
    return t

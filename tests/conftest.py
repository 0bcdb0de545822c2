"""Session fixtures: the real Kafka broker and Redis, and per-test isolation.

* ``RUNJOURNAL_BOOTSTRAP`` and ``RUNJOURNAL_REDIS_URL`` set → use those services.
* ``RJ_TEST_DOCKER=1`` and a Docker engine → testcontainers (optional, never required).
* otherwise → start a private stack with ``runjournal.deploy.stack.Stack`` (the launcher behind
  ``runjournal stack up``) in a temp directory on free ports, and stop it at session end.

Topics are created at replication 1 (``RUNJOURNAL_REPLICATION_FACTOR`` for given services). The
3-broker and secure tests (marker ``cluster``, ``make test-cluster``) start their own stack:
``tests/cluster/conftest.py``.

Each test gets uuid-named topics (a fresh ``topic_prefix``), so tests never see each
other's data; consumer groups and Redis keys derive from the same prefix.

The longest tests (measured with ``--durations``) carry the marker ``slow`` in their own module (``@pytest.mark.slow``
or ``pytestmark``): ``make test`` leaves them out to stay near ten minutes, ``make test-slow`` runs them, and
``.ci/run`` runs both.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from runjournal.core.settings import Settings, default_cache_dir
from runjournal.deploy.procs import Proc, free_port
from runjournal.deploy.registry import RegistryNode, ensure_registry_app
from runjournal.deploy.stack import Stack, StackPorts


@dataclass(frozen=True)
class Endpoints:
    """Where the session's real services listen."""

    bootstrap: str
    redis_url: str
    stack_dir: Path
    replication_factor: int = 1


def _docker_endpoints() -> tuple[Endpoints, list[object]] | None:
    if os.environ.get("RJ_TEST_DOCKER") != "1":
        return None
    from testcontainers.kafka import KafkaContainer
    from testcontainers.redis import RedisContainer

    kafka = KafkaContainer("apache/kafka:4.2.0").with_kraft()
    redis_c = RedisContainer("redis:7")
    kafka.start()
    redis_c.start()
    url = f"redis://{redis_c.get_container_host_ip()}:{redis_c.get_exposed_port(6379)}/0"
    return Endpoints(kafka.get_bootstrap_server(), url, Path("/tmp")), [kafka, redis_c]


@pytest.fixture(scope="session")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    """The real broker and Redis for this test session (see module docstring)."""
    given_bs, given_redis = os.environ.get("RUNJOURNAL_BOOTSTRAP"), os.environ.get("RUNJOURNAL_REDIS_URL")
    if given_bs and given_redis:
        rf = int(os.environ.get("RUNJOURNAL_REPLICATION_FACTOR", "1"))
        yield Endpoints(given_bs, given_redis, tmp_path_factory.mktemp("stack"), rf)
        return
    docker = _docker_endpoints()
    if docker:
        eps, containers = docker
        yield eps
        for c in containers:
            c.stop()
        return
    stack_dir = tmp_path_factory.mktemp("stack")
    cache = Path(os.environ.get("RUNJOURNAL_CACHE_DIR") or default_cache_dir())
    stack = Stack(stack_dir, cache, ports=StackPorts(free_port(), free_port(), free_port()))
    try:
        stack.up()
        state = stack.read_state()
        yield Endpoints(state["kafka"]["bootstrap"], state["redis"]["url"], stack_dir)
    finally:
        stack.down()


@pytest.fixture
def settings(endpoints: Endpoints, tmp_path: Path) -> Settings:
    """Settings pointing at the session's services with a fresh uuid topic prefix (3 partitions)."""
    return Settings.load(
        bootstrap=endpoints.bootstrap,
        redis_url=endpoints.redis_url,
        topic_prefix=f"t{uuid.uuid4().hex[:12]}",
        stack_dir=tmp_path / "stack",
        qdrant_path=tmp_path / "qdrant",
        partitions=3,
        replication_factor=endpoints.replication_factor,
    )


@pytest.fixture
def topics(settings: Settings) -> Settings:
    """``settings`` with its events topic and DLQs created."""
    from runjournal.deploy.topics import create_topics

    create_topics(settings)
    return settings


@pytest.fixture
def service_env(settings: Settings) -> dict[str, str]:
    """Environment for a subprocess that must reach the same services and topics as the test."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNJOURNAL_")}
    env.update(settings.as_env())
    return env


# --------------------------------------------------------------------------- schema registry


@dataclass
class LocalRegistry:
    """A real schema registry process (Apicurio, the same launcher as ``stack up --registry``).

    ``stop()`` / ``start()`` take it away and bring it back on the same port with the same H2 file,
    so its subjects and ids survive (an outage, not a reset).
    """

    node: RegistryNode
    app: Path
    proc: Proc | None = None

    @property
    def url(self) -> str:
        """``RUNJOURNAL_SCHEMA_REGISTRY_URL`` for this registry."""
        return self.node.url

    def start(self) -> None:
        """Start (or restart) the process and wait until it answers."""
        self.proc = self.node.start(self.app)
        self.node.wait_ready(self.proc, timeout_s=180)

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 20 s); the port stops answering."""
        if self.proc is not None:
            self.proc.stop(grace_s=20)


def _start_registry(directory: Path) -> LocalRegistry:
    cache = Path(os.environ.get("RUNJOURNAL_CACHE_DIR") or default_cache_dir())
    app, _ = ensure_registry_app(cache)
    registry = LocalRegistry(RegistryNode(directory, port=free_port()), app)
    registry.start()
    return registry


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    """The session's real schema registry (started on first use, stopped at session end)."""
    local = _start_registry(tmp_path_factory.mktemp("registry"))
    try:
        yield local
    finally:
        local.stop()


@pytest.fixture
def own_registry(tmp_path: Path) -> Iterator[LocalRegistry]:
    """A registry process of this test's own (for tests that stop it)."""
    local = _start_registry(tmp_path / "registry")
    try:
        yield local
    finally:
        local.stop()


@pytest.fixture
def registry_topics(topics: Settings, registry: LocalRegistry) -> Settings:
    """``topics`` with the session registry configured and the published versions registered
    under ``{prefix}.events-value`` (what ``runjournal schemas publish --registry`` does)."""
    from runjournal.schemas.registration import register_versions

    register_versions(registry.url, f"{topics.events_topic}-value")
    return topics.model_copy(update={"schema_registry_url": registry.url})

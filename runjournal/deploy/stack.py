"""The local stack: Apache Kafka (KRaft, from Maven Central), Redis (Debian's redis-server), Qdrant (embedded),
and on request a schema registry (Apicurio, from Maven Central: ``runjournal.deploy.registry``) and an S3 object store
(S3Proxy, from Maven Central: ``runjournal.deploy.object_store``; without it the archive is a local folder).

Kafka is one node by default, or the production shape — N nodes, SASL_SSL, SCRAM users and the
roles' ACLs — with ``brokers`` / ``secure`` (``runjournal.deploy.kafka_cluster``). Redis is one server by
default, or a 3-master Redis Cluster (``redis_cluster``), with TLS and ACL users per role when ``secure``
(``runjournal.deploy.redis_stack``).

``Stack(stack_dir, cache_dir).up()`` is idempotent: components whose recorded process is
still alive and healthy are left alone. ``down()`` stops only processes ``up()`` started,
identified by pid *and* start time, SIGTERM first, SIGKILL after a grace period.
The state file ``<stack_dir>/stack.json`` records endpoints and processes; ``Settings.load``
reads it so other commands find the stack without environment variables.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runjournal.deploy import kafka_cluster, redis_stack
from runjournal.deploy.object_store import object_store_health, up_object_store
from runjournal.deploy.procs import Proc
from runjournal.deploy.registry import registry_health, up_registry

__all__ = ["Stack", "StackPorts"]

STATE_FILE = "stack.json"


@dataclass(frozen=True)
class StackPorts:
    """TCP ports on 127.0.0.1 used by the stack."""

    kafka: int = 9092
    """Kafka client listener (of node 1; node i adds 2i)."""
    controller: int = 9093
    """KRaft controller listener (of node 1; node i adds 2i)."""
    redis: int = 6379
    """Redis (a cluster: node i on + i, its bus on + 3 + i)."""
    registry: int = 8081
    """Schema registry HTTP (only with ``up(registry=True)``)."""
    object_store: int = 9000
    """S3 API HTTP of the object store (only with ``up(object_store=True)``)."""


@dataclass
class Stack:
    """Launcher for one local stack rooted at ``stack_dir``; jars cached under ``cache_dir``."""

    stack_dir: Path
    """Data, logs and ``stack.json``."""
    cache_dir: Path
    """Maven-resolved broker jars (shared by all stacks of this user)."""
    ports: StackPorts = field(default_factory=StackPorts)
    """Ports to use when starting; a running stack keeps the ports in its state file."""
    qdrant_url: str | None = None
    """A Qdrant server URL; when None Qdrant runs embedded under ``<stack_dir>/qdrant``."""
    brokers: int | None = None
    """Kafka nodes (``--brokers``); None: the stack's recorded count, or 1 for a new stack."""
    secure: bool | None = None
    """Kafka SASL_SSL + SCRAM + ACLs and Redis TLS + ACL users (``--secure``); None: as recorded, or plain."""
    redis_cluster: bool | None = None
    """A 3-master Redis Cluster (``--redis-cluster``); None: as recorded, or one server for a new stack."""
    topic_prefix: str = "runjournal"
    """The topic prefix a secure stack grants the roles' ACLs (Kafka and Redis) for."""

    # -- state file -------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        """``<stack_dir>/stack.json``."""
        return self.stack_dir / STATE_FILE

    def read_state(self) -> dict[str, Any]:
        """The state file's content, ``{}`` when there is none."""
        try:
            return json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return {}

    def _write_state(self, state: dict[str, Any]) -> None:
        self.stack_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
        tmp.chmod(0o600)  # it holds the object store's secret key
        tmp.replace(self.state_path)

    # -- up ---------------------------------------------------------------------------
    def up(self, *, timeout_s: float = 120.0, registry: bool = False, object_store: bool = False) -> dict[str, Any]:
        """Start what is not running; return a report with timings in seconds.

        Args:
            timeout_s: readiness timeout per component, seconds.
            registry: also start the schema registry (``runjournal.deploy.registry``).
            object_store: also start the S3 object store (``runjournal.deploy.object_store``).

        Returns:
            ``{"kafka": {...}, "redis": {...}, "qdrant": {...}, "elapsed_s": float}`` (+ ``"registry"``,
            ``"object_store"``).

        Raises:
            MissingToolError: java, mvn or redis-server missing (message names the package).
            StackError: a port is taken by another program, or a component failed to start
                (the message carries its log tail).
        """
        started = time.monotonic()
        state = self.read_state()
        report: dict[str, Any] = {}
        report["kafka"] = self._up_kafka(state, timeout_s)
        self._write_state(state)
        report["redis"] = self._up_redis(state, timeout_s)
        self._write_state(state)
        report["qdrant"] = self._up_qdrant(state)
        self._write_state(state)
        if registry:
            try:
                report["registry"] = up_registry(state, self.stack_dir, self.cache_dir, self.ports.registry, timeout_s)
            finally:
                self._write_state(state)
        if object_store:
            try:
                report["object_store"] = up_object_store(state, self.stack_dir, self.cache_dir,
                                                         self.ports.object_store, timeout_s)
            finally:
                self._write_state(state)
        report["elapsed_s"] = round(time.monotonic() - started, 2)
        return report

    def _up_kafka(self, state: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        def save(entry: dict[str, Any]) -> None:
            state["kafka"] = entry
            self._write_state(state)

        entry, directory = state.get("kafka", {}), self.stack_dir / "kafka"
        shape = kafka_cluster.resolve_shape(entry, self.brokers, self.secure, directory)
        ports = kafka_cluster.node_ports(self.ports.kafka, self.ports.controller, shape.brokers)
        return kafka_cluster.up_kafka(directory, self.cache_dir, entry, shape=shape, ports=ports,
                                      prefix=self.topic_prefix, save=save, timeout_s=timeout_s)

    def _up_redis(self, state: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        def save(entry: dict[str, Any]) -> None:
            state["redis"] = entry
            self._write_state(state)

        entry, directory = state.get("redis", {}), self.stack_dir / "redis"
        shape = redis_stack.resolve_shape(entry, self.redis_cluster, self.secure, directory)
        return redis_stack.up_redis(directory, entry, shape=shape, redis_port=self.ports.redis,
                                    prefix=self.topic_prefix, save=save, timeout_s=timeout_s)

    def _up_qdrant(self, state: dict[str, Any]) -> dict[str, Any]:
        if self.qdrant_url:
            state["qdrant"] = {"mode": "server", "url": self.qdrant_url}
            return {"action": "server", "url": self.qdrant_url}
        path = self.stack_dir / "qdrant"
        path.mkdir(parents=True, exist_ok=True)
        state["qdrant"] = {"mode": "local", "path": str(path)}
        return {"action": "local", "path": str(path)}

    # -- down -------------------------------------------------------------------------
    def down(self, *, grace_s: float = 30.0, only: Collection[str] | None = None) -> dict[str, str]:
        """Stop the processes ``up`` started (object store, registry, Redis, then Kafka). Harmless when nothing runs.

        Args:
            grace_s: SIGTERM → SIGKILL grace per process, seconds.
            only: stop just these components (``kafka``, ``redis``, ``registry``, ``object_store``); None: all.

        Returns:
            ``{"kafka": "stopped" | "killed" | "not running", "redis": ...}`` (+ ``"registry"``, ``"object_store"``
            if it was started), for the components stopped.
        """
        state = self.read_state()
        result: dict[str, str] = {}
        for name in ("object_store", "registry", "redis", "kafka"):
            if (name in ("registry", "object_store") and name not in state) or (only is not None and name not in only):
                continue
            entry = state.get(name, {})
            if name == "kafka":
                result[name] = kafka_cluster.stop_kafka(entry, grace_s=grace_s)
                continue
            if name == "redis":
                result[name] = redis_stack.stop_redis(entry, grace_s=grace_s)
                continue
            proc = Proc.from_json(entry.get("process"))
            result[name] = proc.stop(grace_s=grace_s) if proc else "not running"
            if entry:
                entry.pop("process", None)
        if state:
            self._write_state(state)
        return result

    def role_env(self, role: str) -> dict[str, str]:
        """The ``RUNJOURNAL_*`` settings that run a service as ``role`` on this secure stack: its Kafka SCRAM user
        and, when Redis is secure, its Redis ACL user (``runjournal stack env --role``).

        Raises:
            StackError: the stack is not secure, or an unknown role.
        """
        state = self.read_state()
        return {**kafka_cluster.role_env(state.get("kafka", {}), role),
                **redis_stack.role_env(state.get("redis", {}), role)}

    def running(self) -> set[str]:
        """The components whose recorded processes are alive (``kafka``, ``redis``, ``registry``, ``object_store``):
        a pid check, no
        probe — what a Ctrl-C of ``stack up`` must leave alone because it ran before."""
        state = self.read_state()
        alive = set()
        for name in ("kafka", "redis", "registry", "object_store"):
            if any(proc.alive() for proc in _procs(state.get(name, {}))):
                alive.add(name)
        return alive

    # -- status -----------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """Health of each component: ``{"kafka": {"healthy": bool, ...}, "redis": {...}, "qdrant": {...}}``."""
        state = self.read_state()
        report = {
            "kafka": kafka_cluster.health(state.get("kafka", {})),
            "redis": redis_stack.health(state.get("redis", {})),
            "qdrant": _qdrant_health(state.get("qdrant", {}), self.qdrant_url),
        }
        if state.get("registry", {}).get("process"):
            report["registry"] = registry_health(state["registry"])
        if state.get("object_store", {}).get("process"):
            report["object_store"] = object_store_health(state["object_store"])
        return report


def _qdrant_health(entry: dict[str, Any], url: str | None) -> dict[str, Any]:
    if url or entry.get("mode") == "server":
        target = url or entry.get("url")
        try:
            from qdrant_client import QdrantClient

            QdrantClient(url=target, timeout=3).get_collections()
            return {"healthy": True, "mode": "server", "url": target}
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            return {"healthy": False, "mode": "server", "url": target, "detail": str(exc)}
    path = Path(entry["path"]) if entry.get("path") else None
    if path is None:
        return {"healthy": False, "mode": "local", "detail": "not set up by this stack"}
    ok = path.is_dir() and _writable(path)
    return {"healthy": ok, "mode": "local", "path": str(path),
            **({} if ok else {"detail": "path missing or not writable"})}


def _writable(path: Path) -> bool:
    probe = path / ".probe"
    try:
        probe.write_text("ok")
        probe.unlink()
        return True
    except OSError:
        return False



def _procs(entry: Any) -> list[Proc]:
    """Every process recorded anywhere in a component's state entry (``{"pid", "start_ticks"}`` objects: one per
    node of a cluster), as :class:`Proc` (its start time guards against a reused pid)."""
    if isinstance(entry, dict):
        if "pid" in entry and "start_ticks" in entry:
            proc = Proc.from_json(entry)
            return [proc] if proc is not None else []
        return [p for value in entry.values() for p in _procs(value)]
    if isinstance(entry, list):
        return [p for value in entry for p in _procs(value)]
    return []

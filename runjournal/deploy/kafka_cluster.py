"""The local stack's Kafka: one node, or N combined KRaft nodes on loopback with a static quorum, plain or secure.

``runjournal stack up [--brokers N] [--secure]`` (``runjournal.deploy.stack``) calls :func:`up_kafka`. Shapes:

* ``--brokers 1`` (default): one node, PLAINTEXT, replication 1 — the development stack.
* ``--brokers 3``: three nodes (``node-1`` … under ``<stack>/kafka``), static ``controller.quorum.voters``,
  every internal topic at replication 3 / ``min.insync.replicas`` 2 (offsets, transaction state log), new
  topics RF 3, a dead node fenced after 3 s (``../shared/notes/kafka-cluster-and-security.md``).
* ``--secure``: SASL_SSL (SCRAM-SHA-512) client and inter-broker listener, mutual-TLS controller listener,
  the standard authorizer, a SCRAM user per role and the roles' ACLs for the topic prefix
  (``runjournal.deploy.security``, ``runjournal.deploy.acls``).

Node i (0-based) listens on ``kafka_port + 2i`` (clients) and ``controller_port + 2i`` (controller): the
defaults 9092/9093 give 9092…9097 for three nodes. Nodes start together (each waits for a quorum, so
one by one would hang) and ``up`` returns when every node answers a metadata request. ``up`` again
restarts only nodes that are not running — e.g. one a test SIGKILLed — on their existing data.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.deploy import acls, security
from runjournal.deploy.errors import StackError
from runjournal.deploy.kafka_node import KafkaNode, ensure_jars, kafka_version, new_cluster_id, require_tool
from runjournal.deploy.procs import Proc, port_in_use

__all__ = ["KafkaShape", "admin_settings", "health", "node_ports", "resolve_shape", "role_env", "stop_kafka",
           "up_kafka", "wait_isr"]

MAX_BROKERS = 5
DEFAULT_USER = "operator"
"""Whose credentials ``Settings.load`` takes from a secure stack's state when none are given."""


@dataclass(frozen=True)
class KafkaShape:
    """What ``stack up`` starts: how many nodes, and whether secured."""

    brokers: int = 1
    """Combined broker+controller nodes (1 … 5)."""
    secure: bool = False
    """SASL_SSL + SCRAM users + ACLs (else PLAINTEXT)."""

    @property
    def replication(self) -> int:
        """Replication factor of topics on this cluster: ``min(3, brokers)``."""
        return min(3, self.brokers)


def node_ports(kafka_port: int, controller_port: int, brokers: int) -> list[tuple[int, int]]:
    """``[(client port, controller port)]`` per node: ``kafka_port + 2i``, ``controller_port + 2i``.

    Raises:
        StackError: the ports overlap (pass a controller port that differs from the Kafka port by an odd number).
    """
    if not 1 <= brokers <= MAX_BROKERS:
        raise StackError(f"--brokers must be between 1 and {MAX_BROKERS}, not {brokers}")
    pairs = [(kafka_port + 2 * i, controller_port + 2 * i) for i in range(brokers)]
    flat = [p for pair in pairs for p in pair]
    if len(set(flat)) != len(flat) or max(flat) > 65535:
        raise StackError(f"Kafka ports {flat} overlap or overflow: node i uses --kafka-port + 2i and "
                         "--controller-port + 2i, so the two must differ by an odd number")
    return pairs


def _nodes(directory: Path, shape: KafkaShape, ports: list[tuple[int, int]], users: dict[str, str],
           pki: security.Pki | None) -> list[KafkaNode]:
    if shape.brokers == 1 and not shape.secure:  # the development stack's layout, unchanged
        return [KafkaNode(directory, port=ports[0][0], controller_port=ports[0][1])]
    voters = ",".join(f"{i + 1}@127.0.0.1:{c}" for i, (_p, c) in enumerate(ports)) if shape.brokers > 1 else None
    out = []
    for i, (port, controller) in enumerate(ports):
        sec = security.broker_properties(pki, users[security.ADMIN_USER], port=port, controller_port=controller) \
            if pki else {}
        out.append(KafkaNode(directory / f"node-{i + 1}", port=port, controller_port=controller, node_id=i + 1,
                             voters=voters, replication=shape.replication, security=tuple(sec.items()),
                             format_args=tuple(security.scram_format_args(users)) if pki else ()))
    return out


def admin_settings(entry: dict[str, Any]) -> Settings | None:
    """Settings of the stack's administrator (``admin`` on a secure stack; None — a plaintext probe — otherwise).

    Built without reading the environment, so a user's ``RUNJOURNAL_KAFKA_*`` never leaks into it.
    """
    sec = entry.get("security")
    if not sec:
        return None
    users = json.loads(Path(sec["users_file"]).read_text())
    return Settings.model_construct(
        bootstrap=entry["bootstrap"], kafka_security_protocol=sec["kafka_security_protocol"],
        kafka_sasl_mechanism=sec["kafka_sasl_mechanism"], kafka_sasl_username=security.ADMIN_USER,
        kafka_sasl_password=SecretStr(users[security.ADMIN_USER]),
        kafka_ssl_ca_location=Path(sec["kafka_ssl_ca_location"]), kafka_properties={})


def role_env(entry: dict[str, Any], role: str) -> dict[str, str]:
    """The ``RUNJOURNAL_*`` variables that run a service as ``role``'s SCRAM user on this secure stack
    (``admin``: the stack's administrator — ``runjournal acls create`` for another prefix, the demo).

    Raises:
        StackError: the stack is not secure (or not started), or ``role`` is neither ``admin`` nor one of
            ``acls.ROLES``.
    """
    sec = entry.get("security")
    if not sec:
        raise StackError("the local stack is not secure: start it with `runjournal stack up --secure`")
    if role not in (*acls.ROLES, security.ADMIN_USER):
        raise StackError(f"unknown role {role!r}; roles: {', '.join(acls.ROLES)}, {security.ADMIN_USER}")
    users = json.loads(Path(sec["users_file"]).read_text())
    return {"RUNJOURNAL_BOOTSTRAP": entry["bootstrap"],
            "RUNJOURNAL_REPLICATION_FACTOR": str(min(3, int(entry.get("brokers", 1)))),
            "RUNJOURNAL_KAFKA_SECURITY_PROTOCOL": sec["kafka_security_protocol"],
            "RUNJOURNAL_KAFKA_SASL_MECHANISM": sec["kafka_sasl_mechanism"],
            "RUNJOURNAL_KAFKA_SASL_USERNAME": role, "RUNJOURNAL_KAFKA_SASL_PASSWORD": users[role],
            "RUNJOURNAL_KAFKA_SSL_CA_LOCATION": sec["kafka_ssl_ca_location"]}


def resolve_shape(entry: dict[str, Any], brokers: int | None, secure: bool | None, directory: Path) -> KafkaShape:
    """The shape to start: what was asked, the rest from the stack's recorded shape (or 1 plain broker).

    Raises:
        StackError: the directory holds a Kafka of another shape than the one asked for.
    """
    had = KafkaShape(int(entry.get("brokers", 1)), bool(entry.get("security"))) \
        if entry.get("bootstrap") and directory.exists() else None
    base = had or KafkaShape()
    shape = KafkaShape(base.brokers if brokers is None else brokers, base.secure if secure is None else secure)
    if had is not None and had != shape:
        raise StackError(f"this stack directory holds a {had.brokers}-broker{' secure' if had.secure else ''} Kafka; "
                         f"`runjournal stack down`, remove {directory}, or use another RUNJOURNAL_STACK_DIR")
    return shape


def up_kafka(directory: Path, cache_dir: Path, entry: dict[str, Any], *, shape: KafkaShape,
             ports: list[tuple[int, int]], prefix: str, save: Callable[[dict[str, Any]], None],
             timeout_s: float) -> dict[str, Any]:
    """Start the nodes of ``shape`` that are not running; return the report (timings in seconds).

    Args:
        directory: ``<stack>/kafka``.
        cache_dir: Maven-resolved jars.
        entry: the state file's ``kafka`` entry (``{}`` when new); ports and cluster id are reused from it.
        shape: nodes and security (:func:`resolve_shape`).
        ports: ``node_ports(...)`` for a new stack.
        prefix: the topic prefix the secure stack grants the roles' ACLs for.
        save: persists the new entry before waiting (so ``stack down`` can stop a node that never got ready).
        timeout_s: readiness timeout, seconds.

    Raises:
        StackError: a port taken, a node that exits or never answers.
        MissingToolError: java, keytool or mvn missing.
    """
    procs = _node_procs(entry)
    if procs and all(p.alive() for p in procs):
        return {"action": "already running", "bootstrap": entry["bootstrap"], "pid": procs[0].pid,
                "brokers": len(procs)}
    require_tool("java")
    if entry.get("nodes"):
        ports = [(n["port"], n["controller_port"]) for n in entry["nodes"]]
    elif entry.get("ports"):  # a state file written before multi-node stacks
        ports = [(entry["ports"]["kafka"], entry["ports"]["controller"])]
    lib, resolve_s = ensure_jars(cache_dir)
    users, pki = ({}, None)
    if shape.secure:
        pki = security.make_pki(directory / "pki", require_tool("keytool"))
        users = security.make_users(directory / "users.json", list(acls.ROLES))
    nodes = _nodes(directory, shape, ports, users, pki)
    cluster_id = entry.get("cluster_id") or new_cluster_id()
    dead = [i for i in range(len(nodes)) if not (i < len(procs) and procs[i].alive())]
    for i in dead:
        for port in ports[i]:
            if port_in_use(port):
                raise StackError(f"port {port} on 127.0.0.1 is in use by another program; stop it or pick other ports")
        nodes[i].prepare(lib, cluster_id)
    started = {i: nodes[i].start(lib) for i in dead}
    all_procs = [started[i] if i in started else procs[i] for i in range(len(nodes))]
    new_entry = _entry(nodes, all_procs, cluster_id, lib, pki, directory)
    save(new_entry)
    admin = admin_settings(new_entry)
    ready_s = max(nodes[i].wait_ready(started[i], timeout_s=timeout_s, client=admin) for i in dead)
    granted = acls.create_acls(admin, {r: f"User:{r}" for r in acls.ROLES}, prefix=prefix) if admin else 0
    return {"action": "started" if len(dead) == len(nodes) else f"restarted node(s) {[i + 1 for i in dead]}",
            "bootstrap": new_entry["bootstrap"], "pid": all_procs[0].pid, "brokers": len(nodes),
            "secure": shape.secure, "acls": granted, "resolve_s": round(resolve_s, 2), "ready_s": round(ready_s, 2)}


def _entry(nodes: list[KafkaNode], procs: list[Proc], cluster_id: str, lib: Path,
           pki: security.Pki | None, directory: Path) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "bootstrap": ",".join(n.bootstrap for n in nodes),
        "version": kafka_version(),
        "brokers": len(nodes),
        "cluster_id": cluster_id,
        "process": procs[0].to_json(),  # node 1: what a 1-node stack always recorded
        "ports": {"kafka": nodes[0].port, "controller": nodes[0].controller_port},
        "nodes": [{"node_id": n.node_id, "port": n.port, "controller_port": n.controller_port,
                   "process": p.to_json(), "log": str(n.log_path)} for n, p in zip(nodes, procs, strict=True)],
        "log": str(nodes[0].log_path),
        "lib": str(lib),
    }
    if pki is not None:
        entry["security"] = {
            "kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": security.MECHANISM,
            "kafka_ssl_ca_location": str(pki.ca_pem), "users_file": str(directory / "users.json"),
            "default_user": DEFAULT_USER, "ca_store": str(pki.ca_store),
            "pki_secrets": str(pki.directory / "secrets.json"),
        }
    return entry


def _node_procs(entry: dict[str, Any]) -> list[Proc]:
    nodes = entry.get("nodes") or [{"process": entry.get("process")}]
    return [p for p in (Proc.from_json(n.get("process")) for n in nodes) if p is not None]


def stop_kafka(entry: dict[str, Any], *, grace_s: float) -> str:
    """SIGTERM every node at once (one by one, the last ones wait for a quorum that is leaving), then wait.

    Returns:
        ``"stopped"``, ``"killed"`` (some needed SIGKILL) or ``"not running"``.
    """
    procs = [p for p in _node_procs(entry) if p.alive()]
    for proc in procs:
        try:
            os.kill(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    results = [proc.stop(grace_s=grace_s) for proc in procs]
    for node in entry.get("nodes", []):
        node.pop("process", None)
    entry.pop("process", None)
    if not procs:
        return "not running"
    return "killed" if "killed" in results else "stopped"


def health(entry: dict[str, Any]) -> dict[str, Any]:
    """``{"healthy", "bootstrap", "brokers", "nodes": [...], "under_replicated_partitions", …}`` of the stack's Kafka.

    Healthy when every node runs and the metadata lists them all; ``under_replicated_partitions`` counts
    partitions whose ISR is smaller than their replica set (a restarted node that has not caught up yet).
    """
    if not entry:
        return {"healthy": False, "detail": "not started by this stack"}
    procs = _node_procs(entry)
    nodes = [{"node_id": i + 1, "pid": p.pid, "running": p.alive()} for i, p in enumerate(procs)]
    out: dict[str, Any] = {"bootstrap": entry.get("bootstrap"), "version": entry.get("version"),
                           "pid": procs[0].pid if procs else None,
                           "running": bool(procs) and all(n["running"] for n in nodes),
                           "secure": bool(entry.get("security")), "nodes": nodes}
    if not any(n["running"] for n in nodes):
        return {**out, "healthy": False, "detail": "process not running"}
    try:
        meta = kafka.admin_client(admin_settings(entry), bootstrap=entry["bootstrap"]).list_topics(timeout=5)
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return {**out, "healthy": False, "detail": f"metadata request failed: {exc}"}
    under = sum(1 for t in meta.topics.values() for p in t.partitions.values() if len(p.isrs) < len(p.replicas))
    expected = int(entry.get("brokers", 1))
    healthy = out["running"] and len(meta.brokers) == expected
    return {**out, "healthy": healthy, "brokers": len(meta.brokers), "topics": len(meta.topics),
            "under_replicated_partitions": under, "rss_bytes": _rss_bytes(procs[0].pid),
            **({} if healthy else {"detail": f"{len(meta.brokers)} of {expected} brokers answer"})}


def _rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def wait_isr(settings: Settings, topic: str, *, timeout_s: float = 60.0) -> float:
    """Block until every partition of ``topic`` has its full replica set in sync; return seconds waited.

    Raises:
        StackError: still under-replicated after ``timeout_s`` (the partitions are named).
    """
    started = time.monotonic()
    admin = kafka.admin_client(settings)
    while True:
        meta = admin.list_topics(topic, timeout=10)
        short = {p.id: (sorted(p.isrs), sorted(p.replicas)) for p in meta.topics[topic].partitions.values()
                 if len(p.isrs) < len(p.replicas)}
        if not short:
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            raise StackError(f"{topic}: partitions {short} (isr, replicas) still under-replicated after {timeout_s} s")
        time.sleep(0.5)

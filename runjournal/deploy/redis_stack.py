"""The local stack's Redis: one server, or a 3-master Redis Cluster; plain, or secure (TLS and ACL users).

``runjournal stack up [--redis-cluster] [--secure]`` (``runjournal.deploy.stack``) calls :func:`up_redis`.
Debian's ``redis-server`` (7.0) is used as is: it links OpenSSL, so TLS needs no other build
(``../shared/notes/redis-cluster-tls-acl.md``). Shapes:

* default: one server on ``--redis-port``, ``redis://127.0.0.1:<port>/0`` — the development stack, unchanged.
* ``--redis-cluster``: three ``redis-server --cluster-enabled yes`` under ``<stack>/redis/node-N`` on
  ``--redis-port`` + 0, 1, 2 (cluster bus ``--redis-port`` + 3, 4, 5), joined once by
  ``redis-cli --cluster create … --cluster-replicas 0``; ``redis+cluster://127.0.0.1:<p>,…``. Every node
  runs ``appendonly yes`` / ``appendfsync everysec``; a node started again rejoins from its ``nodes.conf``.
* ``--secure``: TLS only (``--port 0 --tls-port``; the cluster bus too, ``tls-cluster yes``), a CA and a server
  certificate (``DNS:localhost, IP:127.0.0.1``) made with ``openssl`` under ``<stack>/redis/pki``; an ACL file
  per node with ``default`` off, ``admin`` (every right) and one user per role with exactly its key families
  and commands for the topic prefix (``runjournal.deploy.redis_acls``); random passwords in
  ``<stack>/redis/users.json`` (mode 0600; the ACL file holds SHA-256 hashes). URLs ``rediss://`` /
  ``rediss+cluster://``. Commands then run as ``operator`` (``Settings.load`` reads the state file), and
  ``runjournal stack env --role ROLE`` prints another role's settings.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from runjournal.core import redis_client
from runjournal.core.settings import Settings, mask_url
from runjournal.deploy import redis_acls
from runjournal.deploy.errors import StackError
from runjournal.deploy.kafka_node import require_tool
from runjournal.deploy.procs import Proc, port_in_use, read_tail, spawn
from runjournal.deploy.security import make_users

__all__ = ["ADMIN_USER", "CLUSTER_NODES", "DEFAULT_USER", "RedisShape", "admin_settings", "health", "node_ports",
           "resolve_shape", "role_env", "stop_redis", "up_redis"]

CLUSTER_NODES = 3
ADMIN_USER = "admin"
DEFAULT_USER = "operator"
"""Whose credentials ``Settings.load`` takes from a secure stack's state when none are given."""


@dataclass(frozen=True)
class RedisShape:
    """What ``stack up`` starts for Redis."""

    cluster: bool = False
    """Three masters with ``cluster-enabled`` (else one server)."""
    secure: bool = False
    """TLS only, ACL users, ``default`` off."""


def resolve_shape(entry: dict[str, Any], cluster: bool | None, secure: bool | None, directory: Path) -> RedisShape:
    """What was asked; the rest from the stack's recorded Redis (or one plain server).

    Raises:
        StackError: the directory holds a Redis of another shape.
    """
    had = RedisShape(bool(entry.get("cluster")), bool(entry.get("security"))) \
        if entry.get("url") and directory.exists() else None
    base = had or RedisShape()
    shape = RedisShape(base.cluster if cluster is None else cluster, base.secure if secure is None else secure)
    if had is not None and had != shape:
        raise StackError(f"this stack directory holds a {'cluster ' if had.cluster else ''}"
                         f"{'secure ' if had.secure else ''}Redis; `runjournal stack down`, remove {directory}, "
                         "or use another RUNJOURNAL_STACK_DIR")
    return shape


def node_ports(redis_port: int, cluster: bool) -> list[tuple[int, int | None]]:
    """``[(client port, cluster bus port)]``: one node without a bus, or three on ``redis_port`` + 0…5.

    Raises:
        StackError: the block would pass port 65535.
    """
    if not cluster:
        return [(redis_port, None)]
    if redis_port + 2 * CLUSTER_NODES - 1 > 65535:
        raise StackError(f"--redis-port {redis_port}: a Redis Cluster uses it and the next "
                         f"{2 * CLUSTER_NODES - 1} ports")
    return [(redis_port + i, redis_port + CLUSTER_NODES + i) for i in range(CLUSTER_NODES)]


@dataclass(frozen=True)
class _Pki:
    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def cert(self) -> Path:
        return self.directory / "server.crt"

    @property
    def key(self) -> Path:
        return self.directory / "server.key"


def _make_pki(directory: Path) -> _Pki:
    """A CA and a server certificate for 127.0.0.1/localhost (once; reused when present)."""
    pki = _Pki(directory)
    if pki.ca.exists() and pki.cert.exists() and pki.key.exists():
        return pki
    openssl = require_tool("openssl")
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    ext = directory / "server.ext"
    ext.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                   "extendedKeyUsage=serverAuth,clientAuth\nsubjectKeyIdentifier=hash\n"
                   "authorityKeyIdentifier=keyid,issuer\nbasicConstraints=critical,CA:FALSE\n")
    steps = [
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "3650",
         "-subj", "/O=runjournal/CN=runjournal local Redis CA", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
         "-subj", "/CN=localhost"],
        ["x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", "server.crt", "-days", "3650", "-extfile", "server.ext"],
    ]
    for step in steps:
        proc = subprocess.run([openssl, *step], cwd=directory, capture_output=True, text=True, timeout=60,  # noqa: S603
                              check=False)
        if proc.returncode != 0:
            raise StackError(f"openssl {step[0]} failed (rc={proc.returncode}): {proc.stderr.strip()}")
    for name in ("ca.key", "server.key"):
        os.chmod(directory / name, 0o600)
    return pki


def _argv(server: str, node_dir: Path, port: int, bus: int | None, pki: _Pki | None) -> list[str]:
    argv = [server, "--bind", "127.0.0.1", "--dir", str(node_dir), "--appendonly", "yes", "--appendfsync", "everysec",
            "--save", "", "--daemonize", "no", "--protected-mode", "yes", "--logfile", str(node_dir / "redis.log")]
    if pki is None:
        argv += ["--port", str(port)]
    else:
        argv += ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(pki.cert), "--tls-key-file",
                 str(pki.key), "--tls-ca-cert-file", str(pki.ca), "--tls-auth-clients", "optional",
                 "--aclfile", str(node_dir / "users.acl")]
    if bus is not None:
        argv += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
                 "--cluster-port", str(bus)]
        if pki is not None:
            argv += ["--tls-cluster", "yes", "--tls-replication", "yes"]
    return argv


def _url(ports: list[tuple[int, int | None]], shape: RedisShape) -> str:
    scheme = "rediss" if shape.secure else "redis"
    if shape.cluster:
        return f"{scheme}+cluster://" + ",".join(f"127.0.0.1:{p}" for p, _b in ports)
    return f"{scheme}://127.0.0.1:{ports[0][0]}/0"


def admin_settings(entry: dict[str, Any]) -> Settings:
    """Settings of the stack's Redis administrator (plain stacks: no user), built without reading the environment."""
    sec = entry.get("security") or {}
    if not sec:
        return Settings.model_construct(redis_url=entry["url"])
    users = json.loads(Path(sec["users_file"]).read_text())
    return Settings.model_construct(redis_url=entry["url"], redis_username=ADMIN_USER,
                                    redis_password=SecretStr(users[ADMIN_USER]), redis_ssl_ca_location=Path(sec["ca"]))


def _node_client(admin: Settings, port: int, secure: bool, timeout_s: float = 2.0) -> Any:
    url = f"{'rediss' if secure else 'redis'}://127.0.0.1:{port}/0"
    return redis_client.client(admin, url=url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)


def up_redis(directory: Path, entry: dict[str, Any], *, shape: RedisShape, redis_port: int, prefix: str,
             save: Callable[[dict[str, Any]], None], timeout_s: float) -> dict[str, Any]:
    """Start the nodes of ``shape`` that are not running (on their data), form the cluster once; return the report.

    Args:
        directory: ``<stack>/redis``.
        entry: the state file's ``redis`` entry (``{}`` when new); ports are reused from it.
        shape: :func:`resolve_shape`.
        redis_port: the first port of a new stack.
        prefix: the topic prefix the secure stack's role users get their key patterns for.
        save: persists the new entry before waiting (so ``stack down`` can stop a node that never got ready).
        timeout_s: readiness timeout, seconds.

    Raises:
        StackError: a port taken, a node that exits or never answers, a cluster that does not form.
        MissingToolError: redis-server, redis-cli or openssl missing.
    """
    procs = _procs(entry)
    if procs and all(p.alive() for p in procs) and len(procs) == (CLUSTER_NODES if shape.cluster else 1):
        return {"action": "already running", "url": entry["url"], "pid": procs[0].pid}
    server = require_tool("redis-server")
    ports = [(n["port"], n.get("bus_port")) for n in entry["nodes"]] if entry.get("nodes") else \
        node_ports(int(entry.get("port") or redis_port), shape.cluster)
    pki = _secure_files(directory, shape, prefix, len(ports))
    dirs = [directory / f"node-{i + 1}" for i in range(len(ports))] if shape.cluster or shape.secure else [directory]
    dead = [i for i in range(len(ports)) if not (i < len(procs) and procs[i].alive())]
    started: dict[int, Proc] = {}
    for i in dead:
        for port in (p for p in ports[i] if p is not None):
            if port_in_use(port):
                raise StackError(f"port {port} on 127.0.0.1 is in use by another program; stop it or pick another "
                                 "--redis-port")
        dirs[i].mkdir(parents=True, exist_ok=True)
        if pki is not None:
            (dirs[i] / "users.acl").write_text((directory / "users.acl").read_text())
            os.chmod(dirs[i] / "users.acl", 0o600)
        started[i] = spawn(_argv(server, dirs[i], ports[i][0], ports[i][1], pki), log_path=dirs[i] / "redis.stdout",
                           cwd=dirs[i])
    all_procs = [started.get(i) or procs[i] for i in range(len(ports))]
    new_entry = _entry(shape, ports, all_procs, dirs, directory, pki)
    save(new_entry)
    admin = admin_settings(new_entry)
    began = time.monotonic()
    for i in dead:
        _wait_node(admin, ports[i][0], shape.secure, all_procs[i], dirs[i] / "redis.log", timeout_s)
    if shape.cluster:
        _form_cluster(admin, ports, shape.secure, pki, dirs, timeout_s)
    return {"action": "started" if len(dead) == len(ports) else f"restarted node(s) {[i + 1 for i in dead]}",
            "url": new_entry["url"], "pid": all_procs[0].pid, "cluster": shape.cluster, "secure": shape.secure,
            "nodes": len(ports), "ready_s": round(time.monotonic() - began, 2)}


def _secure_files(directory: Path, shape: RedisShape, prefix: str, count: int) -> _Pki | None:
    """PKI, users.json and the ACL file of a secure stack (made once, kept across restarts)."""
    if not shape.secure:
        return None
    pki = _make_pki(directory / "pki")
    users = make_users(directory / "users.json", list(redis_acls.ROLES))
    acl = directory / "users.acl"
    if not acl.exists():
        acl.write_text(redis_acls.acl_file(users, prefix))
        os.chmod(acl, 0o600)
    return pki


def _entry(shape: RedisShape, ports: list[tuple[int, int | None]], procs: list[Proc], dirs: list[Path],
           directory: Path, pki: _Pki | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"url": _url(ports, shape), "port": ports[0][0], "process": procs[0].to_json(),
                             "log": str(dirs[0] / "redis.log")}
    if shape.cluster or shape.secure:
        entry["cluster"] = shape.cluster
        entry["nodes"] = [{"port": p, "bus_port": b, "process": proc.to_json(), "log": str(d / "redis.log")}
                          for (p, b), proc, d in zip(ports, procs, dirs, strict=True)]
    if pki is not None:
        entry["security"] = {"ca": str(pki.ca), "users_file": str(directory / "users.json"),
                             "default_user": DEFAULT_USER}
    return entry


def _wait_node(admin: Settings, port: int, secure: bool, proc: Proc, log: Path, timeout_s: float) -> None:
    import redis

    client = _node_client(admin, port, secure, timeout_s=1)
    deadline = time.monotonic() + timeout_s
    while True:
        if not proc.alive():
            raise StackError(f"redis-server exited during startup. Log tail ({log}):\n{read_tail(log)}")
        try:
            if client.ping():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise StackError(f"Redis on port {port} not ready after {timeout_s:.0f} s. Log tail ({log}):\n"
                             f"{read_tail(log)}")
        time.sleep(0.1)


def _cluster_info(client: Any) -> dict[str, str]:
    raw = client.execute_command("CLUSTER", "INFO")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return dict(line.split(":", 1) for line in text.strip().splitlines() if ":" in line)


def _form_cluster(admin: Settings, ports: list[tuple[int, int | None]], secure: bool, pki: _Pki | None,
                  dirs: list[Path], timeout_s: float) -> None:
    """``redis-cli --cluster create`` once (nodes that know each other are left alone); then wait for
    ``cluster_state:ok`` on every node."""
    first = _node_client(admin, ports[0][0], secure)
    if int(_cluster_info(first).get("cluster_slots_assigned", "0")) < 16384:
        argv = [require_tool("redis-cli"), "--cluster", "create", *(f"127.0.0.1:{p}" for p, _b in ports),
                "--cluster-replicas", "0", "--cluster-yes"]
        env = {k: v for k, v in os.environ.items() if k != "REDISCLI_AUTH"}
        if secure and pki is not None:
            argv += ["--tls", "--cacert", str(pki.ca), "--user", ADMIN_USER]
            assert admin.redis_password is not None
            env["REDISCLI_AUTH"] = admin.redis_password.get_secret_value()  # not on the command line
        made = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, env=env)  # noqa: S603
        if made.returncode != 0:
            raise StackError(f"redis-cli --cluster create failed (rc={made.returncode}): "
                             f"{(made.stdout + made.stderr)[-2000:]}")
    deadline = time.monotonic() + timeout_s
    for (port, _bus), node_dir in zip(ports, dirs, strict=True):
        client = _node_client(admin, port, secure)
        while _cluster_info(client).get("cluster_state") != "ok":
            if time.monotonic() > deadline:
                raise StackError(f"the Redis Cluster is not ok on port {port} after {timeout_s:.0f} s. Log tail:\n"
                                 f"{read_tail(node_dir / 'redis.log')}")
            time.sleep(0.2)


def _procs(entry: dict[str, Any]) -> list[Proc]:
    nodes = entry.get("nodes") or [{"process": entry.get("process")}]
    return [p for p in (Proc.from_json(n.get("process")) for n in nodes) if p is not None]


def stop_redis(entry: dict[str, Any], *, grace_s: float) -> str:
    """Stop every node (SIGTERM: each flushes its AOF), SIGKILL after ``grace_s``.

    Returns:
        ``"stopped"``, ``"killed"`` or ``"not running"``.
    """
    procs = [p for p in _procs(entry) if p.alive()]
    results = [p.stop(grace_s=grace_s) for p in procs]
    for node in entry.get("nodes", []):
        node.pop("process", None)
    entry.pop("process", None)
    if not procs:
        return "not running"
    return "killed" if "killed" in results else "stopped"


def health(entry: dict[str, Any]) -> dict[str, Any]:
    """``{"healthy", "url", "nodes": [...], "cluster_state", "aof_enabled", …}`` of the stack's Redis."""
    if not entry:
        return {"healthy": False, "detail": "not started by this stack"}
    import redis

    procs = _procs(entry)
    out: dict[str, Any] = {"url": mask_url(entry["url"]), "pid": procs[0].pid if procs else None,
                           "running": bool(procs) and all(p.alive() for p in procs),
                           "cluster": bool(entry.get("cluster")), "secure": bool(entry.get("security"))}
    if entry.get("nodes"):
        out["nodes"] = [{"port": n["port"], "pid": (n.get("process") or {}).get("pid"),
                         "running": bool(p and p.alive())}
                        for n, p in zip(entry["nodes"], [Proc.from_json(n.get("process")) for n in entry["nodes"]],
                                        strict=True)]
    admin = admin_settings(entry)
    try:
        client = _node_client(admin, int(entry["port"]), bool(entry.get("security")))
        info = client.info()
        if entry.get("cluster"):
            out["cluster_state"] = _cluster_info(client).get("cluster_state")
        healthy = out["running"] and out.get("cluster_state", "ok") == "ok"
        return {**out, "healthy": healthy, "version": info.get("redis_version"),
                "aof_enabled": bool(info.get("aof_enabled")), "used_memory_bytes": info.get("used_memory"),
                **({} if healthy else {"detail": f"cluster_state {out.get('cluster_state')}"})}
    except redis.RedisError as exc:
        return {**out, "healthy": False, "detail": str(exc)}


def role_env(entry: dict[str, Any], role: str) -> dict[str, str]:
    """The ``RUNJOURNAL_REDIS_*`` variables of ``role``'s Redis user on this secure stack (``admin``: the
    administrator); ``{}`` for a stack whose Redis is not secure (its URL needs no user).

    Raises:
        StackError: ``role`` is neither ``admin`` nor one of ``redis_acls.ROLES``.
    """
    if role not in (*redis_acls.ROLES, ADMIN_USER):
        raise StackError(f"unknown role {role!r}; roles: {', '.join(redis_acls.ROLES)}, {ADMIN_USER}")
    sec = entry.get("security")
    if not entry.get("url"):
        return {}
    env = {"RUNJOURNAL_REDIS_URL": entry["url"]}
    if sec:
        users = json.loads(Path(sec["users_file"]).read_text())
        env.update({"RUNJOURNAL_REDIS_USERNAME": role, "RUNJOURNAL_REDIS_PASSWORD": users[role],
                    "RUNJOURNAL_REDIS_SSL_CA_LOCATION": sec["ca"]})
    return env

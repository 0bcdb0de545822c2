"""A real schema registry for the local stack: Apicurio Registry from Maven Central, on 127.0.0.1.

Steps (``../shared/notes/schema-registry.md``, verified with 2.6.13.Final on Java 17):

1. ``mvn generate-resources`` on ``deploy/registry-pom.xml`` unpacks the ready Quarkus app
   (``apicurio-registry-app:<v>:all:tar.gz``) into ``<cache>/registry/<version>-<pom sha>/app`` —
   resolved once (~150 MB), reused by every stack, like the broker's jars.
2. ``java -jar apicurio-registry-app-<v>-runner.jar`` detached, configured by environment:
   HTTP on ``127.0.0.1:<port>``, storage in an H2 *file* under ``<stack>/registry/db`` (so
   schemas and ids survive a restart, like Kafka's and Redis's data), access log off.
3. Ready when ``GET <url>/subjects`` answers 200 (2–8 s here).

Clients use the Confluent-compatible API at ``http://127.0.0.1:<port>/apis/ccompat/v6``
(:func:`registry_url`); that is the ``RUNJOURNAL_SCHEMA_REGISTRY_URL`` a stack with a registry sets.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from runjournal.deploy.errors import StackError
from runjournal.deploy.kafka_node import require_tool
from runjournal.deploy.procs import Proc, port_in_use, read_tail, spawn

__all__ = ["RegistryNode", "ensure_registry_app", "registry_health", "registry_url", "registry_version", "up_registry"]

#: JVM options: small heap, serial GC, quick start (a local, low-traffic service on 2 cores).
JVM_OPTS = ["-Xms64m", "-Xmx192m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true"]
POM = "registry-pom.xml"


def _pom_text() -> str:
    return resources.files("runjournal.deploy").joinpath(POM).read_text()


def registry_version() -> str:
    """The Apicurio Registry version pinned in ``deploy/registry-pom.xml`` (e.g. ``"2.6.13.Final"``)."""
    match = re.search(r"<registry\.version>([^<]+)</registry\.version>", _pom_text())
    if not match:
        raise StackError(f"deploy/{POM} has no <registry.version> property")
    return match.group(1)


def registry_url(port: int) -> str:
    """The Confluent-compatible base URL of a local registry on ``port``."""
    return f"http://127.0.0.1:{port}/apis/ccompat/v6"


def ensure_registry_app(cache_dir: Path, *, timeout_s: float = 600.0) -> tuple[Path, float]:
    """Unpack the registry app once; return ``(app_dir, seconds_spent)`` (0 s when cached).

    Keyed by version and the pom's sha256; filled in a temp dir and renamed into place, so an
    interrupted download never leaves a half-filled cache.

    Raises:
        MissingToolError: no ``mvn``.
        StackError: Maven failed (its output tail is in the message).
    """
    pom = _pom_text()
    key = f"{registry_version()}-{hashlib.sha256(pom.encode()).hexdigest()[:10]}"
    app = cache_dir / "registry" / key / "app"
    if (app / ".complete").exists():
        return app, 0.0
    mvn = require_tool("mvn")
    started = time.monotonic()
    work = cache_dir / "registry" / f"{key}.tmp-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "pom.xml").write_text(pom)
    cmd = [mvn, "-B", "-q", "-f", str(work / "pom.xml"), "generate-resources"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)  # noqa: S603
    unpacked = work / "target" / "app"
    if proc.returncode != 0 or not _runner(unpacked):
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise StackError(f"Maven could not resolve the schema registry (rc={proc.returncode}):\n{tail}")
    (unpacked / ".complete").write_text(key)
    app.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(app, ignore_errors=True)
    unpacked.rename(app)
    shutil.rmtree(work, ignore_errors=True)
    return app, time.monotonic() - started


def _runner(app: Path) -> Path | None:
    """The runnable jar: ``apicurio-registry-app-<v>-runner.jar`` (2.x) or ``quarkus-run.jar`` (3.x)."""
    found = sorted(app.glob("apicurio-registry-app-*-runner.jar")) or sorted(app.glob("quarkus-run.jar"))
    return found[0] if found else None


@dataclass(frozen=True)
class RegistryNode:
    """One registry process; ``directory`` holds its H2 database (``db/``) and ``registry.log``."""

    directory: Path
    """Node directory (created on demand)."""
    port: int = 8081
    """HTTP port on 127.0.0.1."""

    @property
    def url(self) -> str:
        """The Confluent-compatible base URL (``RUNJOURNAL_SCHEMA_REGISTRY_URL``)."""
        return registry_url(self.port)

    @property
    def log_path(self) -> Path:
        """The process's stdout/stderr."""
        return self.directory / "registry.log"

    def environment(self) -> dict[str, str]:
        """The process environment: the caller's, plus the registry's own settings."""
        db = self.directory / "db" / "registry"
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith(("QUARKUS_", "REGISTRY_"))},
            "QUARKUS_HTTP_HOST": "127.0.0.1",
            "QUARKUS_HTTP_PORT": str(self.port),
            "QUARKUS_HTTP_ACCESS_LOG_ENABLED": "false",
            "REGISTRY_DATASOURCE_URL": f"jdbc:h2:file:{db}",
            "QUARKUS_LOG_LEVEL": "WARN",
        }

    def start(self, app: Path) -> Proc:
        """Start the registry detached (own session) and return its process handle (not yet ready).

        Raises:
            MissingToolError: no ``java``.
            StackError: the port is taken, or the app folder has no runner jar.
        """
        if port_in_use(self.port):
            raise StackError(f"port {self.port} on 127.0.0.1 is in use by another program; pick another "
                             "(--registry-port)")
        runner = _runner(app)
        if runner is None:
            raise StackError(f"no registry runner jar in {app}; delete that folder to resolve it again")
        (self.directory / "db").mkdir(parents=True, exist_ok=True)
        cmd = [require_tool("java"), *JVM_OPTS, "-jar", str(runner)]
        return spawn(cmd, log_path=self.log_path, cwd=app, env=self.environment())

    def wait_ready(self, proc: Proc, *, timeout_s: float = 120.0) -> float:
        """Block until ``GET <url>/subjects`` answers 200; return seconds waited.

        Raises:
            StackError: the process exited, or ``timeout_s`` passed; the log's tail is in the message.
        """
        started = time.monotonic()
        while True:
            if not proc.alive():
                raise StackError(f"the schema registry exited during startup. Log tail ({self.log_path}):\n"
                                 f"{read_tail(self.log_path)}")
            if _answers(self.url):
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise StackError(f"the schema registry was not ready after {timeout_s:.0f} s. Log tail "
                                 f"({self.log_path}):\n{read_tail(self.log_path)}")
            time.sleep(0.25)


def _answers(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/subjects", timeout=timeout_s) as response:  # noqa: S310 - our URL
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def registry_health(entry: dict[str, Any]) -> dict[str, Any]:
    """``{"healthy": bool, "url", "version", "pid", "running", ...}`` of a registry recorded in ``stack.json``."""
    proc = Proc.from_json(entry.get("process"))
    out = {"url": entry.get("url"), "version": entry.get("version"), "pid": proc.pid if proc else None,
           "running": bool(proc and proc.alive())}
    if not out["running"]:
        return {**out, "healthy": False, "detail": "process not running"}
    ok = _answers(str(entry.get("url")))
    return {**out, "healthy": ok, **({} if ok else {"detail": "GET /subjects did not answer 200"})}


def up_registry(state: dict[str, Any], stack_dir: Path, cache_dir: Path, port: int,
                timeout_s: float) -> dict[str, Any]:
    """Start the stack's registry unless its recorded process still runs; records it in ``state["registry"]``.

    Returns:
        ``{"action": "started" | "already running", "url", "pid", ...}`` (seconds for resolve and ready).

    Raises:
        MissingToolError: java or mvn missing.
        StackError: the port is taken, Maven failed, or the registry did not become ready.
    """
    entry = state.get("registry", {})
    proc = Proc.from_json(entry.get("process"))
    if proc and proc.alive():
        return {"action": "already running", "url": entry["url"], "pid": proc.pid}
    require_tool("java")
    port = int(entry.get("port") or port)
    app, resolve_s = ensure_registry_app(cache_dir)
    node = RegistryNode(stack_dir / "registry", port=port)
    proc = node.start(app)
    state["registry"] = {"url": node.url, "port": port, "version": registry_version(), "process": proc.to_json(),
                         "log": str(node.log_path), "app": str(app)}
    ready_s = node.wait_ready(proc, timeout_s=timeout_s)
    return {"action": "started", "url": node.url, "pid": proc.pid, "resolve_s": round(resolve_s, 2),
            "ready_s": round(ready_s, 2)}

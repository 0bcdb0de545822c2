"""A real object store for the local stack: S3Proxy from Maven Central, filesystem backend, on 127.0.0.1.

Steps (``../shared/notes/object-storage.md``, verified with 2.6.0 on Java 17):

1. ``mvn generate-resources`` on ``deploy/object-store-pom.xml`` copies the self-contained jar
   (``org.gaul:s3proxy:<v>:jar-with-dependencies``, ~41 MB) into ``<cache>/object-store/<version>-<pom sha>/app`` —
   resolved once, reused by every stack, like the broker's jars and the registry's app.
2. ``java -jar s3proxy.jar --properties <stack>/object-store/s3proxy.properties`` detached: S3 API on
   ``http://127.0.0.1:<port>``, signatures ``aws-v2-or-v4`` with an access key and secret made once per stack
   (kept in ``stack.json``, never printed), objects stored as files under ``<stack>/object-store/data``
   (``jclouds.provider=filesystem``: a bucket is a folder, an object a file).
3. Ready when the endpoint answers HTTP at all (any status: an unsigned request is refused with 403), ~10 s here.

The bucket :data:`ARCHIVE_BUCKET` exists from the start (a folder under the data directory); ``Settings.load``
points ``archive_url`` at ``s3://runjournal-archive/<topic prefix>`` while the stack's object store runs.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
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

__all__ = ["ARCHIVE_BUCKET", "ObjectStoreNode", "ensure_object_store_jar", "object_store_health",
           "object_store_version", "up_object_store"]

#: JVM options: small heap, serial GC, quick start (a local, low-traffic service on 2 cores).
JVM_OPTS = ["-Xms32m", "-Xmx192m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true"]
POM = "object-store-pom.xml"
JAR = "s3proxy.jar"
#: The bucket ``stack up --object-store`` creates; the archive of a stack lives under ``<bucket>/<topic prefix>``.
ARCHIVE_BUCKET = "runjournal-archive"


def _pom_text() -> str:
    return resources.files("runjournal.deploy").joinpath(POM).read_text()


def object_store_version() -> str:
    """The S3Proxy version pinned in ``deploy/object-store-pom.xml`` (e.g. ``"2.6.0"``)."""
    match = re.search(r"<s3proxy\.version>([^<]+)</s3proxy\.version>", _pom_text())
    if not match:
        raise StackError(f"deploy/{POM} has no <s3proxy.version> property")
    return match.group(1)


def ensure_object_store_jar(cache_dir: Path, *, timeout_s: float = 600.0) -> tuple[Path, float]:
    """Resolve the S3Proxy jar once; return ``(jar_path, seconds_spent)`` (0 s when cached).

    Keyed by version and the pom's sha256; filled in a temp dir and renamed into place, so an
    interrupted download never leaves a half-filled cache.

    Raises:
        MissingToolError: no ``mvn``.
        StackError: Maven failed (its output tail is in the message).
    """
    pom = _pom_text()
    key = f"{object_store_version()}-{hashlib.sha256(pom.encode()).hexdigest()[:10]}"
    app = cache_dir / "object-store" / key / "app"
    if (app / ".complete").exists() and (app / JAR).is_file():
        return app / JAR, 0.0
    mvn = require_tool("mvn")
    started = time.monotonic()
    work = cache_dir / "object-store" / f"{key}.tmp-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "pom.xml").write_text(pom)
    cmd = [mvn, "-B", "-q", "-f", str(work / "pom.xml"), "generate-resources"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)  # noqa: S603
    copied = work / "target" / "app"
    if proc.returncode != 0 or not (copied / JAR).is_file():
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise StackError(f"Maven could not resolve the object store (S3Proxy) (rc={proc.returncode}):\n{tail}")
    (copied / ".complete").write_text(key)
    app.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(app, ignore_errors=True)
    copied.rename(app)
    shutil.rmtree(work, ignore_errors=True)
    return app / JAR, time.monotonic() - started


def new_credentials() -> tuple[str, str]:
    """A fresh ``(access key, secret key)`` for one stack's object store (random, URL-safe)."""
    return f"rj{secrets.token_hex(8)}", secrets.token_urlsafe(30)


@dataclass(frozen=True)
class ObjectStoreNode:
    """One S3Proxy process; ``directory`` holds its objects (``data/``), ``s3proxy.properties`` and its log."""

    directory: Path
    """Node directory (created on demand)."""
    port: int = 9000
    """S3 API HTTP port on 127.0.0.1."""

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL (``RUNJOURNAL_OBJECT_STORE_ENDPOINT``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        """``jclouds.filesystem.basedir``: one folder per bucket, one file per object."""
        return self.directory / "data"

    @property
    def log_path(self) -> Path:
        """The process's stdout/stderr."""
        return self.directory / "object-store.log"

    @property
    def properties_path(self) -> Path:
        """S3Proxy's configuration (holds the secret key: mode 0600)."""
        return self.directory / "s3proxy.properties"

    def write_properties(self, identity: str, credential: str) -> Path:
        """Write ``s3proxy.properties`` (endpoint, ``aws-v2-or-v4`` with these keys, the filesystem backend)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        text = "\n".join([
            f"s3proxy.endpoint={self.endpoint}",
            "s3proxy.authorization=aws-v2-or-v4",
            # botocore >= 1.36 sends CRC32 checksum headers S3Proxy 2.6 does not know (DeleteObjects always)
            "s3proxy.ignore-unknown-headers=true",
            f"s3proxy.identity={identity}",
            f"s3proxy.credential={credential}",
            "jclouds.provider=filesystem",
            f"jclouds.filesystem.basedir={self.data_dir}",
            "",
        ])
        fd = os.open(self.properties_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        return self.properties_path

    def start(self, jar: Path, identity: str, credential: str, buckets: tuple[str, ...] = (ARCHIVE_BUCKET,)) -> Proc:
        """Start S3Proxy detached (own session) with ``buckets`` present; return its handle (not yet ready).

        Raises:
            MissingToolError: no ``java``.
            StackError: the port is taken (naming ``--object-store-port``).
        """
        if port_in_use(self.port):
            raise StackError(f"port {self.port} on 127.0.0.1 is in use by another program; pick another "
                             "(--object-store-port)")
        for bucket in buckets:  # the filesystem backend: a bucket is a folder under basedir
            (self.data_dir / bucket).mkdir(parents=True, exist_ok=True)
        properties = self.write_properties(identity, credential)
        cmd = [require_tool("java"), *JVM_OPTS, "-jar", str(jar), "--properties", str(properties)]
        return spawn(cmd, log_path=self.log_path, cwd=self.directory)

    def wait_ready(self, proc: Proc, *, timeout_s: float = 120.0) -> float:
        """Block until the endpoint answers HTTP (any status); return seconds waited.

        Raises:
            StackError: the process exited, or ``timeout_s`` passed; the log's tail is in the message.
        """
        started = time.monotonic()
        while True:
            if not proc.alive():
                raise StackError(f"the object store exited during startup. Log tail ({self.log_path}):\n"
                                 f"{read_tail(self.log_path)}")
            if _answers(self.endpoint):
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise StackError(f"the object store was not ready after {timeout_s:.0f} s. Log tail "
                                 f"({self.log_path}):\n{read_tail(self.log_path)}")
            time.sleep(0.25)


def _answers(url: str, timeout_s: float = 2.0) -> bool:
    """True when an HTTP server answers at ``url`` (an S3 error status counts: it is S3Proxy refusing us)."""
    try:
        with urllib.request.urlopen(f"{url}/", timeout=timeout_s) as response:  # noqa: S310 - our URL
            return bool(response.status)
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def object_store_health(entry: dict[str, Any]) -> dict[str, Any]:
    """``{"healthy": bool, "url", "version", "pid", "running", "data", ...}`` of the object store in ``stack.json``
    (never its keys)."""
    proc = Proc.from_json(entry.get("process"))
    out = {"url": entry.get("url"), "version": entry.get("version"), "pid": proc.pid if proc else None,
           "running": bool(proc and proc.alive()), "data": entry.get("data")}
    if not out["running"]:
        return {**out, "healthy": False, "detail": "process not running"}
    ok = _answers(str(entry.get("url")))
    return {**out, "healthy": ok, **({} if ok else {"detail": "the S3 endpoint did not answer HTTP"})}


def up_object_store(state: dict[str, Any], stack_dir: Path, cache_dir: Path, port: int,
                    timeout_s: float) -> dict[str, Any]:
    """Start the stack's object store unless its recorded process still runs; records it in
    ``state["object_store"]`` (its access key and secret are made on first start and kept there).

    Returns:
        ``{"action": "started" | "already running", "url", "pid", "bucket", ...}`` (seconds for resolve and
        ready) — never the keys.

    Raises:
        MissingToolError: java or mvn missing.
        StackError: the port is taken, Maven failed, or S3Proxy did not become ready.
    """
    entry = state.get("object_store", {})
    proc = Proc.from_json(entry.get("process"))
    if proc and proc.alive():
        return {"action": "already running", "url": entry["url"], "pid": proc.pid, "bucket": entry.get("bucket")}
    require_tool("java")
    port = int(entry.get("port") or port)
    identity, credential = entry.get("identity"), entry.get("credential")
    if not (identity and credential):
        identity, credential = new_credentials()
    jar, resolve_s = ensure_object_store_jar(cache_dir)
    node = ObjectStoreNode(stack_dir / "object-store", port=port)
    proc = node.start(jar, identity, credential)
    state["object_store"] = {"url": node.endpoint, "port": port, "version": object_store_version(),
                             "process": proc.to_json(), "log": str(node.log_path), "jar": str(jar),
                             "data": str(node.data_dir), "bucket": ARCHIVE_BUCKET, "identity": identity,
                             "credential": credential}
    ready_s = node.wait_ready(proc, timeout_s=timeout_s)
    return {"action": "started", "url": node.endpoint, "pid": proc.pid, "bucket": ARCHIVE_BUCKET,
            "data": str(node.data_dir), "resolve_s": round(resolve_s, 2), "ready_s": round(ready_s, 2)}

"""One Apache Kafka KRaft node (broker + controller) on 127.0.0.1, from Maven Central jars.

Steps (``../shared/notes/kafka-from-maven.md``, verified with Kafka 4.2.0 on Java 17):

1. ``mvn dependency:copy-dependencies -DincludeScope=runtime`` on ``deploy/pom.xml`` into
   ``<cache>/kafka/<version>-<pom sha>/lib`` — resolved once, reused by every stack.
2. Write ``server.properties`` and a quiet ``log4j2.properties`` into the node directory.
3. ``kafka.tools.StorageTool format`` once per data directory (static quorum, no flags).
4. ``java … kafka.Kafka server.properties`` detached; ready when a metadata request from
   confluent-kafka succeeds.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from runjournal.core import kafka
from runjournal.deploy.errors import MissingToolError, StackError
from runjournal.deploy.procs import Proc, port_in_use, read_tail, spawn

__all__ = ["KafkaNode", "ensure_jars", "kafka_version", "require_tool"]

TOOL_PACKAGES = {"java": "openjdk-17-jre-headless", "mvn": "maven", "redis-server": "redis-server"}

#: JVM options: small heap, serial GC (2 cores, one node), headless.
JVM_OPTS = ["-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-Djava.awt.headless=true"]

LOG4J2 = """\
status = error
name = runjournal-kafka
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = STDOUT
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = info
"""


def require_tool(name: str) -> str:
    """Path of executable ``name``.

    Raises:
        MissingToolError: not on PATH; the message names the Debian package (``make deps`` installs it).
    """
    path = shutil.which(name)
    if not path:
        pkg = TOOL_PACKAGES.get(name, name)
        raise MissingToolError(
            f"'{name}' not found on PATH. Install it: apt-get install -y {pkg} (or run 'make deps' as root)."
        )
    return path


def _pom_text() -> str:
    return resources.files("runjournal.deploy").joinpath("pom.xml").read_text()


def kafka_version() -> str:
    """The Kafka version pinned in ``deploy/pom.xml`` (e.g. ``"4.2.0"``)."""
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", _pom_text())
    if not match:
        raise StackError("deploy/pom.xml has no <kafka.version> property")
    return match.group(1)


def ensure_jars(cache_dir: Path, *, timeout_s: float = 600.0) -> tuple[Path, float]:
    """Resolve the broker's runtime jars once; return ``(lib_dir, seconds_spent)`` (0 s when cached).

    The directory is keyed by Kafka version and the pom's sha256, filled in a temp dir and
    renamed into place, so an interrupted download never leaves a half-filled cache.

    Raises:
        MissingToolError: no ``mvn``.
        StackError: Maven failed (its output tail is in the message).
    """
    pom = _pom_text()
    key = f"{kafka_version()}-{hashlib.sha256(pom.encode()).hexdigest()[:10]}"
    lib = cache_dir / "kafka" / key / "lib"
    if (lib / ".complete").exists():
        return lib, 0.0
    mvn = require_tool("mvn")
    started = time.monotonic()
    work = cache_dir / "kafka" / f"{key}.tmp-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "pom.xml").write_text(pom)
    cmd = [mvn, "-B", "-q", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
           "-DincludeScope=runtime", f"-DoutputDirectory={work / 'lib'}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)  # noqa: S603
    if proc.returncode != 0 or not any((work / "lib").glob("kafka_2.13-*.jar")):
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise StackError(f"Maven could not resolve the Kafka broker (rc={proc.returncode}):\n{tail}")
    (work / "lib" / ".complete").write_text(key)
    lib.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(lib, ignore_errors=True)
    (work / "lib").rename(lib)
    shutil.rmtree(work, ignore_errors=True)
    return lib, time.monotonic() - started


@dataclass(frozen=True)
class KafkaNode:
    """A single combined-mode KRaft node; ``directory`` holds config, data (``data/``) and ``broker.log``."""

    directory: Path
    """Node directory (created on demand)."""
    port: int = 9092
    """PLAINTEXT listener port on 127.0.0.1."""
    controller_port: int = 9093
    """CONTROLLER listener port on 127.0.0.1."""

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:<port>``."""
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        """The broker's stdout/stderr (quiet log4j2: WARN and the 'started' line)."""
        return self.directory / "broker.log"

    def properties(self) -> str:
        """``server.properties`` text for this node (values chosen for a 1-node local stack)."""
        data = self.directory / "data"
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(data),
            "num.partitions": "6",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "3",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # The cleaner's dedupe buffer is allocated on heap at start (default 128 MiB).
            "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
            "num.network.threads": "2",
            "num.io.threads": "4",
        }
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _java(self, lib: Path, *args: str, jvm: list[str] | None = None) -> list[str]:
        java = require_tool("java")
        log_cfg = self.directory / "log4j2.properties"
        return [java, *(jvm or []), "-cp", f"{lib}/*", f"-Dlog4j2.configurationFile={log_cfg}", *args]

    def prepare(self, lib: Path) -> None:
        """Write config files and format the storage directory once (``-g``: already formatted is fine).

        Raises:
            StackError: the storage tool failed (output in the message).
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "server.properties").write_text(self.properties())
        (self.directory / "log4j2.properties").write_text(LOG4J2)
        if (self.directory / "data" / "meta.properties").exists():
            return
        cluster_id = _cluster_id()
        cmd = self._java(lib, "kafka.tools.StorageTool", "format", "-t", cluster_id,
                         "-c", str(self.directory / "server.properties"), "-g")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)  # noqa: S603
        if proc.returncode != 0:
            raise StackError(f"Kafka storage format failed (rc={proc.returncode}):\n{proc.stdout}{proc.stderr}")

    def start(self, lib: Path) -> Proc:
        """Start ``kafka.Kafka`` detached (own session) and return its process handle (not yet ready)."""
        cmd = self._java(lib, "kafka.Kafka", str(self.directory / "server.properties"), jvm=JVM_OPTS)
        return spawn(cmd, log_path=self.log_path, cwd=self.directory)

    def wait_ready(self, proc: Proc, *, timeout_s: float = 120.0) -> float:
        """Block until a metadata request succeeds; return seconds waited.

        Raises:
            StackError: the process exited, or ``timeout_s`` passed; the broker log's tail is in the message.
        """

        started = time.monotonic()
        admin = None
        while True:
            if not proc.alive():
                tail = read_tail(self.log_path)
                raise StackError(f"Kafka exited during startup. Log tail ({self.log_path}):\n{tail}")
            # The listener socket opens only once the broker is unfenced and serving (notes G1),
            # so probe TCP first (quietly), then confirm with a real metadata request.
            if port_in_use(self.port):
                admin = admin or kafka.admin_client(None, bootstrap=self.bootstrap, log_level=3)
                try:
                    if admin.list_topics(timeout=5).brokers:
                        return time.monotonic() - started
                except Exception:  # noqa: BLE001 - KafkaException while the broker boots; keep polling
                    pass
            if time.monotonic() - started > timeout_s:
                raise StackError(
                    f"Kafka not ready after {timeout_s:.0f} s. Log tail ({self.log_path}):\n{read_tail(self.log_path)}"
                )
            time.sleep(0.5)


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, base64url without padding, not starting with '-'."""
    while True:
        cid = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid

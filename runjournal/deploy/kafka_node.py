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
from runjournal.core.settings import Settings
from runjournal.deploy.errors import MissingToolError, StackError
from runjournal.deploy.procs import Proc, port_in_use, read_tail, spawn

__all__ = ["KafkaNode", "ensure_jars", "kafka_version", "new_cluster_id", "require_tool"]

TOOL_PACKAGES = {"java": "openjdk-17-jre-headless", "keytool": "openjdk-17-jre-headless", "mvn": "maven",
                 "redis-server": "redis-server", "redis-cli": "redis-tools", "openssl": "openssl"}

#: JVM options: small heap, serial GC (2 cores, one node), headless.
JVM_OPTS = ["-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-Djava.awt.headless=true"]
#: Per node of a multi-node cluster (notes: kafka-cluster-and-security.md): a smaller heap, C1 only.
CLUSTER_JVM_OPTS = ["-Xms128m", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true"]

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
    """A combined-mode KRaft node (broker + controller); ``directory`` holds config, data (``data/``) and
    ``broker.log``. Alone by default; one of a static quorum with ``voters`` (``runjournal.deploy.kafka_cluster``)."""

    directory: Path
    """Node directory (created on demand)."""
    port: int = 9092
    """Client listener port on 127.0.0.1 (PLAINTEXT, or SASL_SSL with ``security``)."""
    controller_port: int = 9093
    """CONTROLLER listener port on 127.0.0.1."""
    node_id: int = 1
    """``node.id``."""
    voters: str | None = None
    """``controller.quorum.voters`` (``1@127.0.0.1:c1,2@…``); None: this node alone."""
    replication: int = 1
    """Replication factor of the internal topics (offsets, transaction state) and the default for new topics;
    ``min.insync.replicas`` is 2 when replicated."""
    security: tuple[tuple[str, str], ...] = ()
    """Security properties (``runjournal.deploy.security.broker_properties``) overriding the listeners."""
    format_args: tuple[str, ...] = ()
    """Extra ``StorageTool format`` arguments (``--add-scram …``)."""

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:<port>``."""
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        """The broker's stdout/stderr (quiet log4j2: WARN and the 'started' line)."""
        return self.directory / "broker.log"

    def properties(self) -> str:
        """``server.properties`` text for this node (values chosen for a small loopback cluster on 2 cores)."""
        data = self.directory / "data"
        rf, isr = str(self.replication), str(min(2, self.replication))
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.voters or f"{self.node_id}@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(data),
            "num.partitions": "6",
            "auto.create.topics.enable": "false",
            "default.replication.factor": rf,
            "min.insync.replicas": isr,
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": isr,
            "transaction.state.log.num.partitions": "3",
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": isr,
            "group.initial.rebalance.delay.ms": "0",
            # The cleaner's dedupe buffer is allocated on heap at start (default 128 MiB).
            "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
            "num.network.threads": "2",
            "num.io.threads": "4",
        }
        if self.voters:  # a dead node is fenced after 3 s, not 9 s: leadership moves in ~3 s (notes)
            props.update({"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500",
                          "num.io.threads": "2", "log.cleaner.dedupe.buffer.size": str(2 * 1024 * 1024),
                          # `stack down` stops every node at once. Controlled shutdown hands leadership to brokers
                          # that stay, and none stays: the last node to leave waited up to 5 min for a controller
                          # quorum that had already gone (and was SIGKILLed at the grace). The logs still close
                          # cleanly; the failover tests SIGKILL a node, which controlled shutdown never covered.
                          "controlled.shutdown.enable": "false"})
        props.update(dict(self.security))
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _java(self, lib: Path, *args: str, jvm: list[str] | None = None) -> list[str]:
        java = require_tool("java")
        log_cfg = self.directory / "log4j2.properties"
        return [java, *(jvm or []), "-cp", f"{lib}/*", f"-Dlog4j2.configurationFile={log_cfg}", *args]

    def prepare(self, lib: Path, cluster_id: str | None = None) -> None:
        """Write config files and format the storage directory once (``-g``: already formatted is fine).

        Args:
            lib: the broker's jars.
            cluster_id: the KRaft cluster id (the same on every node of a cluster); None: a new one.

        Raises:
            StackError: the storage tool failed (output in the message).
        """
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        config = self.directory / "server.properties"
        config.touch(mode=0o600)  # may hold the store passwords and the inter-broker credentials
        config.write_text(self.properties())
        (self.directory / "log4j2.properties").write_text(LOG4J2)
        if (self.directory / "data" / "meta.properties").exists():
            return
        cmd = self._java(lib, "kafka.tools.StorageTool", "format", "-t", cluster_id or new_cluster_id(),
                         "-c", str(config), "-g", *self.format_args)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)  # noqa: S603
        if proc.returncode != 0:
            raise StackError(f"Kafka storage format failed (rc={proc.returncode}):\n{proc.stdout}{proc.stderr}")

    def start(self, lib: Path) -> Proc:
        """Start ``kafka.Kafka`` detached (own session) and return its process handle (not yet ready)."""
        jvm = CLUSTER_JVM_OPTS if self.voters else JVM_OPTS
        cmd = self._java(lib, "kafka.Kafka", str(self.directory / "server.properties"), jvm=jvm)
        return spawn(cmd, log_path=self.log_path, cwd=self.directory)

    def wait_ready(self, proc: Proc, *, timeout_s: float = 120.0, client: Settings | None = None) -> float:
        """Block until a metadata request to this node succeeds; return seconds waited.

        Args:
            proc: the node's process (its exit fails the wait at once).
            timeout_s: seconds to wait.
            client: who asks (a secure node needs credentials); None: a plaintext probe.

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
                admin = admin or kafka.admin_client(client, bootstrap=self.bootstrap, log_level=3)
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


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, base64url without padding, not starting with '-'."""
    while True:
        cid = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid

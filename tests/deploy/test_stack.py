"""The foundation against the real broker and Redis: topics, compaction config, ordered round trip, launcher."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
import redis
from confluent_kafka.admin import ConfigResource, NewTopic, ResourceType

from runjournal.core import kafka
from runjournal.core.errors import ConfigError
from runjournal.core.settings import Settings, mask_url
from runjournal.deploy.errors import MissingToolError, TopicConfigError
from runjournal.deploy.kafka_node import require_tool
from runjournal.deploy.procs import free_port
from runjournal.deploy.topics import create_topics
from runjournal.schemas.versions import load_versions

pytestmark = pytest.mark.integration


def test_topics_create_is_compacted_and_idempotent(settings: Settings) -> None:
    first = create_topics(settings)
    assert {r.name: r.action for r in first} == {
        settings.events_topic: "created",
        settings.events_dlq_topic: "created",
        settings.memory_dlq_topic: "created",
        settings.schemas_topic: "created",
        settings.checkpoints_topic: "created",
        settings.payloads_topic: "created",
        settings.streams_topic: "created",
    }
    again = create_topics(settings)
    assert {r.action for r in again} == {"exists"}
    # Read the config back through AdminClient, not through our own report.
    admin = kafka.admin_client(settings)
    res = ConfigResource(ResourceType.TOPIC, settings.events_topic)
    cfg = admin.describe_configs([res])[res].result()
    assert cfg["cleanup.policy"].value == "compact"
    assert cfg["min.compaction.lag.ms"].value == "3600000"
    meta = admin.list_topics(timeout=10)
    assert len(meta.topics[settings.events_topic].partitions) == settings.partitions
    # the streams topic: deleted after its own retention, on the run's partition like the events (decision 0055)
    res = ConfigResource(ResourceType.TOPIC, settings.streams_topic)
    cfg = admin.describe_configs([res])[res].result()
    assert (cfg["cleanup.policy"].value, cfg["retention.ms"].value) == ("delete", str(settings.streams_retention_ms))
    assert len(meta.topics[settings.streams_topic].partitions) == settings.partitions


def test_topics_create_refuses_other_partition_count(settings: Settings) -> None:
    create_topics(settings)
    with pytest.raises(TopicConfigError, match=r"exists with 3 partitions, not 5"):
        create_topics(settings, partitions=5)


def test_topics_create_refuses_non_compacted_events_topic(settings: Settings) -> None:
    admin = kafka.admin_client(settings)
    topic = NewTopic(settings.events_topic, num_partitions=3, replication_factor=1, config={"cleanup.policy": "delete"})
    admin.create_topics([topic])[settings.events_topic].result()
    with pytest.raises(TopicConfigError, match="cleanup.policy=delete, not compact"):
        create_topics(settings)


def test_thousand_unique_keys_round_trip_in_order_per_partition(topics: Settings) -> None:
    producer = kafka.producer(topics, **{"acks": "all", "enable.idempotence": True,
                         "linger.ms": 5})
    sent: dict[int, list[str]] = defaultdict(list)
    for i in range(1000):
        key = f"run-{i % 37}:1:{i}"
        producer.produce(topics.events_topic, key=key, value=f"v{i}".encode(), partition=i % topics.partitions)
        sent[i % topics.partitions].append(key)
    assert producer.flush(30) == 0
    consumer = kafka.consumer(topics, **{"group.id": f"g-{uuid.uuid4()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    consumer.subscribe([topics.events_topic])
    got: dict[int, list[str]] = defaultdict(list)
    try:
        for _ in range(600):
            if sum(len(v) for v in got.values()) >= 1000:
                break
            for msg in consumer.consume(500, timeout=0.5):
                assert msg.error() is None, msg.error()
                got[msg.partition()].append(msg.key().decode())
    finally:
        consumer.close()
    assert dict(got) == dict(sent)


def test_redis_has_aof_on(endpoints) -> None:  # noqa: ANN001 - fixture
    info = redis.Redis.from_url(endpoints.redis_url).info("persistence")
    if os.environ.get("RUNJOURNAL_REDIS_URL"):
        pytest.skip("a Redis given by RUNJOURNAL_REDIS_URL is configured by its owner")
    assert info["aof_enabled"] == 1


def test_missing_tool_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(MissingToolError, match="apt-get install -y redis-server"):
        require_tool("redis-server")
    with pytest.raises(MissingToolError, match="apt-get install -y maven"):
        require_tool("mvn")


def test_settings_reject_unknown_variables_and_mask_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNJOURNAL_BOOTSTRAPP", "x:1")
    with pytest.raises(ConfigError, match="RUNJOURNAL_BOOTSTRAPP"):
        Settings.load()
    monkeypatch.delenv("RUNJOURNAL_BOOTSTRAPP")
    s = Settings.load(redis_url="redis://app:hunter2@db:6379/0", stack_dir=Path("/nonexistent"))
    assert "hunter2" not in repr(s) and "hunter2" not in json.dumps(s.masked())
    assert mask_url("redis://app:hunter2@db:6379/0") == "redis://app:***@db:6379/0"


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The installed ``runjournal`` console script, run outside the checkout (as ``make demo`` runs it): the
    checkout's top-level folders are not importable there (a ``resources.files("deploy")`` once broke it)."""
    script = Path(sys.executable).with_name("runjournal")
    return subprocess.run([str(script), *args], env=env, capture_output=True, text=True, timeout=300, check=False,
                          cwd=tempfile.gettempdir())


@pytest.mark.skipif(bool(os.environ.get("RUNJOURNAL_BOOTSTRAP")), reason="services are given; launcher not used")
@pytest.mark.registry
@pytest.mark.slow
def test_stack_cli_lifecycle(tmp_path: Path) -> None:
    """up --registry → up (idempotent) → status --json healthy → down → down (harmless); no process left."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNJOURNAL_")}
    env["RUNJOURNAL_STACK_DIR"] = str(tmp_path / "stack")
    ports = ["--kafka-port", str(free_port()), "--controller-port", str(free_port()), "--redis-port", str(free_port()),
             "--registry", "--registry-port", str(free_port())]
    try:
        up = _cli(env, "stack", "up", "--json", *ports)
        assert up.returncode == 0, up.stderr
        report = json.loads(up.stdout)
        assert report["kafka"]["action"] == "started" and report["redis"]["action"] == "started"
        assert report["registry"]["action"] == "started"
        registered = [v.label for v in load_versions() if v.version >= 2]  # every published version from v2
        assert [r["version"] for r in report["registry"]["subjects"]["runjournal.events-value"]] == registered
        again = json.loads(_cli(env, "stack", "up", "--json", *ports).stdout)
        assert again["kafka"]["action"] == "already running" and again["kafka"]["pid"] == report["kafka"]["pid"]
        assert again["registry"]["action"] == "already running"
        status = _cli(env, "stack", "status", "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        health = json.loads(status.stdout)
        assert health["healthy"] and all(health[c]["healthy"] for c in ("kafka", "redis", "qdrant", "registry"))
        settings = json.loads(_cli(env, "settings").stdout)  # commands now find the registry, like Kafka
        assert settings["schema_registry_url"] == report["registry"]["url"]
        from runjournal.schemas._confluent import registry_client

        assert registry_client(report["registry"]["url"]).get_compatibility("runjournal.events-value") == (
            "FULL_TRANSITIVE")
    finally:
        down = _cli(env, "stack", "down", "--json")
    assert json.loads(down.stdout) == {"registry": "stopped", "redis": "stopped", "kafka": "stopped"}
    assert json.loads(_cli(env, "stack", "down", "--json").stdout) == {
        "registry": "not running", "redis": "not running", "kafka": "not running"}
    assert json.loads(_cli(env, "settings").stdout)["schema_registry_url"] is None
    for pid in (report["kafka"]["pid"], report["redis"]["pid"], report["registry"]["pid"]):
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]
    status = _cli(env, "stack", "status", "--json")
    assert status.returncode == 1 and not json.loads(status.stdout)["healthy"]


@pytest.mark.skipif(bool(os.environ.get("RUNJOURNAL_BOOTSTRAP")), reason="services are given; launcher not used")
@pytest.mark.slow
def test_ctrl_c_of_stack_up_stops_what_it_started(tmp_path: Path) -> None:
    """Issue 35 case 8: a Ctrl-C while ``stack up`` waited for Kafka left Kafka running and printed nothing. Now
    it stops what that command started, says so in one line, and exits 130."""
    import signal
    import time

    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNJOURNAL_")}
    env["RUNJOURNAL_STACK_DIR"] = str(tmp_path / "stack")
    up = subprocess.Popen([sys.executable, "-m", "runjournal", "stack", "up", "--kafka-port", str(free_port()),
                           "--controller-port", str(free_port()), "--redis-port", str(free_port())], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                          # as a terminal starts it: a suite run from a background job inherits SIGINT ignored
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    state = tmp_path / "stack" / "stack.json"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until Kafka's process exists (its pid is in the state file)
            if state.exists() and '"pid"' in state.read_text():
                break
            assert up.poll() is None, up.stderr.read() if up.stderr else ""
            time.sleep(0.05)
        pids = [int(p) for p in re.findall(r'"pid":\s*(\d+)', state.read_text())]
        assert pids, state.read_text()
        os.killpg(up.pid, signal.SIGINT)  # a terminal's Ctrl-C
        _out, err = up.communicate(timeout=120)
        assert up.returncode == 130, err[-3000:]
        assert "interrupted: stopped what this `stack up` started" in err and "Traceback" not in err, err[-3000:]
        left = [pid for pid in pids if Path(f"/proc/{pid}").exists()
                and "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]]
        assert left == [], f"stack up's processes outlived its Ctrl-C: {left}"  # checked before any cleanup
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        _cli(env, "stack", "down")

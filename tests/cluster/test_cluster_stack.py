"""``runjournal stack up --brokers 3``: the production shape on loopback, run the way a user runs it.

Three KRaft nodes with a static quorum; the settings pick the replication factor up from the stack;
``topics create`` makes every topic RF 3 / ``min.insync.replicas`` 2 and refuses existing topics that could
drop acknowledged events; the transaction state log and the offsets topic are RF 3; ``stack up`` without
``--brokers`` keeps the stack's shape, with another shape it refuses; ``stack down`` stops all three nodes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka.admin import ConfigResource, NewTopic, ResourceType

from runjournal import Journal
from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.deploy.procs import Proc, free_port
from runjournal.deploy.topics import EVENTS_TOPIC_CONFIG
from tests.cluster.conftest import base_env, cli, free_port_block

pytestmark = [pytest.mark.cluster, pytest.mark.integration]


def _config(admin, topic: str, key: str) -> str:  # noqa: ANN001 - AdminClient
    res = ConfigResource(ResourceType.TOPIC, topic)
    return admin.describe_configs([res])[res].result(30)[key].value


def _replicas(admin, topic: str) -> set[int]:  # noqa: ANN001 - AdminClient
    meta = admin.list_topics(topic, timeout=10).topics[topic]
    return {len(p.replicas) for p in meta.partitions.values()}


def test_stack_up_brokers_3_is_the_production_shape(tmp_path: Path) -> None:
    env = {**base_env(), "RUNJOURNAL_STACK_DIR": str(tmp_path / "stack")}
    base = free_port_block(6)
    ports = ["--kafka-port", str(base), "--controller-port", str(base + 1), "--redis-port", str(free_port())]
    up = cli(env, "stack", "up", "--brokers", "3", "--json", *ports, timeout_s=600)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        report = json.loads(up.stdout)["kafka"]
        assert (report["action"], report["brokers"]) == ("started", 3)
        again = json.loads(cli(env, "stack", "up", "--json").stdout)["kafka"]  # no --brokers: the stack's own shape
        assert again["action"] == "already running"
        other = cli(env, "stack", "up", "--brokers", "1")
        assert other.returncode == 1 and "holds a 3-broker Kafka" in other.stderr
        health = json.loads(cli(env, "stack", "status", "--json").stdout)
        assert health["healthy"] and health["kafka"]["brokers"] == 3
        assert [n["running"] for n in health["kafka"]["nodes"]] == [True] * 3
        settings = Settings.load(stack_dir=tmp_path / "stack", topic_prefix="shape")
        assert settings.replication_factor == 3
        _topics_are_rf3_and_lossy_ones_refused(env, settings)
        _internal_topics_are_rf3(settings)
    finally:
        down = cli(env, "stack", "down", "--json")
    assert json.loads(down.stdout)["kafka"] == "stopped"
    state = json.loads((tmp_path / "stack" / "stack.json").read_text())
    pids = [n["pid"] for n in health["kafka"]["nodes"]]
    assert all("process" not in n for n in state["kafka"]["nodes"])
    assert not any(Path(f"/proc/{pid}").exists() and Proc(pid, -1).alive() for pid in pids)


def _topics_are_rf3_and_lossy_ones_refused(env: dict[str, str], settings: Settings) -> None:
    created = cli({**env, "RUNJOURNAL_TOPIC_PREFIX": "shape"}, "topics", "create", "--json")
    assert created.returncode == 0, created.stderr
    assert {(t["replication_factor"], t["config"]["min.insync.replicas"]) for t in json.loads(created.stdout)} \
        == {(3, "2")}
    admin = kafka.admin_client(settings)
    lossy = {"lossy": {"min.insync.replicas": "1"}, "unclean": {"unclean.leader.election.enable": "true"}}
    topics = [NewTopic(f"{p}.events", 3, 3, config={**EVENTS_TOPIC_CONFIG, "min.insync.replicas": "2", **cfg})
              for p, cfg in lossy.items()]
    for fut in admin.create_topics(topics).values():
        fut.result(30)
    for prefix, needle in (("lossy", "min.insync.replicas=1"), ("unclean", "unclean leader election")):
        refused = cli({**env, "RUNJOURNAL_TOPIC_PREFIX": prefix}, "topics", "create")
        assert refused.returncode == 1 and needle in refused.stderr.replace("\n", " "), refused.stderr


def _internal_topics_are_rf3(settings: Settings) -> None:
    """A journal run (transactions) and a projector pass (group offsets) create the internal topics."""
    with Journal(settings, producer_id="shape-agent") as journal:
        run = journal.start_run("acme", "shape", {"x": 1})
        run.succeed({"ok": True})
    from runjournal.consumers.projector import Projector

    Projector(settings).run(until_caught_up=True, idle_timeout_s=60)
    admin = kafka.admin_client(settings)
    assert _replicas(admin, "__transaction_state") == {3}
    assert _config(admin, "__transaction_state", "min.insync.replicas") == "2"
    assert _replicas(admin, "__consumer_offsets") == {3}

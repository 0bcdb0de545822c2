"""A run's durable stream while the broker leading its partition is SIGKILLed (three brokers, RF 3,
``min.insync.replicas`` 2; decision 0055): the agent (as the ``agent`` user) keeps writing through the failover, and
a reader sees every chunk exactly once, in order — the idempotent stream producer retried without duplicating."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import NewTopic

from runjournal.consumers.streams import read_stream
from runjournal.core import kafka
from runjournal.deploy.kafka_cluster import wait_isr
from runjournal.deploy.procs import Proc
from runjournal.deploy.topics import STREAMS_TOPIC_CONFIG
from tests.cluster.conftest import Cluster, Tenant, cli, new_tenant, operator_creates_topics

pytestmark = [pytest.mark.cluster, pytest.mark.integration, pytest.mark.crash]


def _leaders(tenant: Tenant) -> set[int]:
    topic = f"{tenant.prefix}.streams"
    meta = kafka.admin_client(tenant.settings()).list_topics(topic, timeout=10)
    return {p.leader for p in meta.topics[topic].partitions.values()}


def _tenant_streams_led_by_node_1(cluster: Cluster, work: Path) -> Tenant:
    t = new_tenant(cluster, work)
    assignment = [[1, 2, 3], [1, 3, 2], [1, 2, 3]][: t.partitions]
    topic = NewTopic(f"{t.prefix}.streams", num_partitions=len(assignment), replica_assignment=assignment,
                     config={**STREAMS_TOPIC_CONFIG, "retention.ms": "86400000", "min.insync.replicas": "2"})
    admin = kafka.admin_client(t.settings())
    admin.create_topics([topic])[topic.topic].result(30)
    report = {r["name"]: r for r in operator_creates_topics(t)}
    assert report[topic.topic]["action"] == "exists"
    return t


def test_leader_sigkill_while_streaming_duplicates_and_loses_no_chunk(cluster: Cluster, tmp_path: Path) -> None:
    tenant = _tenant_streams_led_by_node_1(cluster, tmp_path)
    node1 = cluster.state()["kafka"]["nodes"][0]
    assert node1["node_id"] == 1 and _leaders(tenant) == {1}
    run_id, stop = f"fo-{uuid.uuid4().hex[:8]}", tmp_path / "stop"
    child = subprocess.Popen([sys.executable, "-m", "tests.support.stream_child", run_id,
                              f"sf-{uuid.uuid4().hex[:6]}", "50", "0.01", str(stop)], env=tenant.env("agent"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline() if child.stdout else ""
        assert json.loads(line or "{}").get("ready") == run_id, child.stderr.read()[-3000:] if child.stderr else ""
        time.sleep(1)
        os.kill(node1["process"]["pid"], signal.SIGKILL)  # the leader of every streams partition, mid-stream
        deadline = time.monotonic() + 60
        while Proc.from_json(node1["process"]).alive() or 1 in _leaders(tenant):  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "no new leader"
            time.sleep(0.2)
        time.sleep(3)  # the agent carries on writing under the new leader
    finally:
        stop.touch()
        out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err[-3000:]
    summary = json.loads(out.splitlines()[-1])
    assert summary["lost"] == 0, summary
    up = cli(cluster.env(None), "stack", "up", "--brokers", "3", "--secure", "--json")
    assert up.returncode == 0, up.stderr
    wait_isr(tenant.settings(), f"{tenant.prefix}.streams", timeout_s=120)
    events = [e for _o, e in read_stream(tenant.settings(), run_id)]
    chunks = [e for e in events if e.kind == "chunk"]
    assert [e.n for e in chunks] == list(range(1, summary["written"] + 1))  # once each, in order, none missing
    assert [e.data for e in chunks] == [f"tok-{n} " for n in range(1, summary["written"] + 1)]
    assert events[-1].kind == "end" and summary["written"] > 50 + 100  # it wrote on through the failover

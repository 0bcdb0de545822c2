"""Leader failover under load on three brokers (RF 3, ``min.insync.replicas`` 2, ``acks=all``, transactions).

Three agent processes publish runs as the ``agent`` user; the broker leading every events partition is
SIGKILLed mid-stream. Afterwards: every event an agent was told is acknowledged (its own ack log, written
when each durable publish returned) is in the topic; no run is duplicated or lost (per run: seqs exactly
1..n, unique keys and event ids); the agents carried on through the failover without an error; the
projection equals a fresh fold; ``runjournal stack up`` restarts the broker and it rejoins every ISR.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import NewTopic

from runjournal.core import kafka
from runjournal.deploy.kafka_cluster import wait_isr
from runjournal.deploy.procs import Proc
from runjournal.deploy.topics import EVENTS_TOPIC_CONFIG
from tests.cluster.conftest import Cluster, Tenant, cli, new_tenant, operator_creates_topics
from tests.consumers.projector.test_projector import redis_digests, topic_fold_digests
from tests.support.readback import read_committed

pytestmark = [pytest.mark.cluster, pytest.mark.integration, pytest.mark.crash]

AGENTS = 3


def _wait(what: str, cond: Callable[[], bool], timeout_s: float) -> float:
    started = time.monotonic()
    while not cond():
        assert time.monotonic() - started < timeout_s, f"{what}: not within {timeout_s} s"
        time.sleep(0.2)
    return time.monotonic() - started


def _acks(logs: list[Path]) -> list[dict]:
    return [json.loads(line) for log in logs if log.exists() for line in log.read_text().splitlines() if line]


def _leaders(tenant: Tenant) -> dict[int, int]:
    meta = kafka.admin_client(tenant.settings()).list_topics(f"{tenant.prefix}.events", timeout=10)
    return {p.id: p.leader for p in meta.topics[f"{tenant.prefix}.events"].partitions.values()}


def _tenant_led_by_node_1(cluster: Cluster, work: Path) -> Tenant:
    """The events topic created with node 1 as every partition's preferred leader, then checked and completed
    (DLQs) by the operator's ``topics create`` like any existing topic."""
    t = new_tenant(cluster, work)
    assignment = [[1, 2, 3], [1, 3, 2], [1, 2, 3]][: t.partitions]
    topic = NewTopic(f"{t.prefix}.events", num_partitions=len(assignment),
                     replica_assignment=assignment,
                     config={**EVENTS_TOPIC_CONFIG, "min.insync.replicas": "2"})
    admin = kafka.admin_client(t.settings())  # referenced until the future resolves
    admin.create_topics([topic])[topic.topic].result(30)
    report = {r["name"]: r for r in operator_creates_topics(t)}
    assert report[topic.topic]["action"] == "exists" and report[topic.topic]["replication_factor"] == 3
    return t


def test_leader_sigkill_under_load_loses_and_duplicates_nothing(cluster: Cluster, tmp_path: Path) -> None:
    tenant = _tenant_led_by_node_1(cluster, tmp_path)
    node1 = cluster.state()["kafka"]["nodes"][0]
    assert node1["node_id"] == 1 and set(_leaders(tenant).values()) == {1}
    env, stop = tenant.env("agent"), tmp_path / "stop"
    logs = [tmp_path / f"acks-{i}.jsonl" for i in range(AGENTS)]
    agents = [subprocess.Popen([sys.executable, "-m", "tests.support.load_agent", f"load-{i}", str(logs[i]), str(stop)],
                               env=env, stdout=subprocess.PIPE, stderr=open(tmp_path / f"agent-{i}.err", "w"),  # noqa: SIM115
                               text=True) for i in range(AGENTS)]
    try:
        _wait("warm-up: 60 acknowledgements", lambda: len(_acks(logs)) >= 60, 180)
        before = len(_acks(logs))
        # -- SIGKILL the leader of every events partition, mid-stream
        os.kill(node1["process"]["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        _wait("killed", lambda: not Proc.from_json(node1["process"]).alive(), 10)  # type: ignore[union-attr]
        failover_s = _wait("new leaders", lambda: 1 not in _leaders(tenant).values(), 60)
        _wait("agents carry on: 60 more acknowledgements", lambda: len(_acks(logs)) >= before + 60, 120)
        carried_on_s = time.monotonic() - killed_at
        # -- the broker comes back the way a user brings it back, and rejoins the ISR
        up = cli(cluster.env(None), "stack", "up", "--brokers", "3", "--secure", "--json")
        assert up.returncode == 0, up.stderr
        assert json.loads(up.stdout)["kafka"]["action"] == "restarted node(s) [1]"
        rejoin_s = wait_isr(tenant.settings(), f"{tenant.prefix}.events", timeout_s=120)
    finally:
        stop.touch()
        summaries = [json.loads(a.communicate(timeout=120)[0] or "{}") for a in agents]
    assert [a.returncode for a in agents] == [0] * AGENTS, [p.read_text()[-2000:] for p in tmp_path.glob("*.err")]
    acks = _acks(logs)
    assert [a for a in acks if "error" in a] == [], "every publish carried on through the failover"
    # -- every acknowledged event is in the topic; no run duplicated or lost
    records = read_committed(tenant.settings(), timeout_s=60)
    seqs: dict[str, list[int]] = defaultdict(list)
    for r in records:
        seqs[r.event.run_id].append(r.event.seq)
    assert len({r.key for r in records}) == len(records), "a key appears twice"
    assert len({r.event.event_id for r in records}) == len(records), "an event appears twice"
    acked: dict[str, int] = defaultdict(int)
    for a in acks:
        acked[a["run"]] = max(acked[a["run"]], a["seq"])
    assert set(acked) <= set(seqs), f"runs acknowledged but missing: {sorted(set(acked) - set(seqs))[:5]}"
    for run_id, got in seqs.items():
        assert got == list(range(1, len(got) + 1)), f"{run_id}: seqs {got} are not exactly 1..n"
        assert len(got) >= acked.get(run_id, 0), f"{run_id}: acknowledged up to {acked[run_id]}, topic has {len(got)}"
    done = {a["run"] for a in acks if a.get("done")}
    assert all(len(seqs[r]) == 12 for r in done)  # RUN_STARTED, 5 × 2 messages, RUN_SUCCEEDED
    # -- the projection (as the projector user) equals a fresh fold of the topic
    projected = cli(tenant.env("projector"), "projector", "--until-caught-up")
    assert projected.returncode == 0, projected.stderr[-3000:]
    ids = sorted(seqs)
    assert redis_digests(tenant.settings(), ids) == topic_fold_digests(tenant.settings(), ids)
    print(json.dumps({"failover_s": round(failover_s, 2), "carried_on_s": round(carried_on_s, 2),
                      "isr_rejoin_s": round(rejoin_s, 2), "runs": len(seqs), "events": len(records),
                      "acked_events": sum(acked.values()), "acks_before_kill": before, "agents": summaries}))

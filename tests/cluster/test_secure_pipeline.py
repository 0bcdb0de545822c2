"""Journal → projector → recovery → memory on the 3-broker SASL_SSL stack, each as its least-privilege user.

Every service is a real ``runjournal`` process (or the test agent child) whose only Kafka identity is its
role's SCRAM user with exactly the grants of ``runjournal.deploy.acls.ROLES``: the agent crashes inside a
tool call, the recovery job fences it and hands the run to a second agent, the projector folds the
journal (and quarantines a corrupt record to the DLQ), the memory extractor fills Qdrant, the operator
inspects, replays and erases. The oracle (fresh reads of the topic) is the stack's administrator.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from runjournal.schemas.keys import partition_for
from tests.cluster.conftest import Cluster, Tenant, cli
from tests.consumers.projector.test_projector import redis_digests, topic_fold_digests
from tests.support.provider import Provider, child, running_provider, wait_lease, wait_lease_gone
from tests.support.workload import publish

pytestmark = [pytest.mark.cluster, pytest.mark.integration, pytest.mark.crash]


@pytest.fixture
def provider(tmp_path: Path, tenant: Tenant) -> Iterator[Provider]:
    with running_provider(tmp_path, tenant.env(None)) as running:
        yield running


def _json(proc) -> dict:  # noqa: ANN001 - CompletedProcess
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_journal_projector_recovery_memory_as_least_privilege_users(tenant: Tenant, provider: Provider) -> None:
    admin, agent_env = tenant.settings(), tenant.env("agent")
    run_id = "secure-1"
    # 1. topics: the operator created them (fixture) — replicated 3x, min.insync.replicas 2
    topics = _json(cli(tenant.env("operator"), "topics", "describe", "--json"))
    assert {(t["replication_factor"], t["config"]["min.insync.replicas"]) for t in topics} == {(3, "2")}
    # 2. agent-a crashes after the provider ran the send, before its outcome is journaled
    crashed = child(agent_env, run_id, "agent-a", provider, failpoint="producers.call.after_tool=1")
    assert crashed.wait(120) == -signal.SIGKILL, crashed.stderr.read()[-3000:]
    wait_lease_gone(admin, "agent-a")
    taker = child(agent_env, run_id, "agent-b", provider, resume=True)
    wait_lease(admin, "agent-b")
    # 3. the recovery job fences agent-a at the broker and hands the run to agent-b
    report = _json(cli(tenant.env("recovery"), "recover", "--stale", "--json"))
    assert report["fenced"] == ["agent-a"]
    (outcome,) = report["runs"]
    assert (outcome["action"], outcome["assigned_to"], outcome["epoch"]) == ("resumed", "agent-b", 2)
    assert outcome["calls"] == {"OUTCOME_UNKNOWN": 1}
    assert taker.wait(120) == 0, taker.stderr.read()[-3000:]
    assert provider.executions() == 1, "reconciled, never re-sent"
    # 4. a corrupt record on the journal: the projector quarantines it to the DLQ (its only write grant)
    publish(admin, [("junk-run:1:1", b"\x00not avro")])
    projected = cli(tenant.env("projector"), "projector", "--until-caught-up")
    assert projected.returncode == 0, projected.stderr[-3000:]
    assert "dead-lettered 1" in projected.stdout + projected.stderr
    assert redis_digests(admin, [run_id]) == topic_fold_digests(admin, [run_id])
    # 5. memory, off the critical path, as the memory user (the corrupt record goes to its DLQ)
    memory = _json(cli(tenant.env("memory"), "memory-extractor", "--until-caught-up", "--json"))
    assert memory["items"] > 0 and memory["dead_lettered"] == 1
    # 6. the operator: inspect (Redis + the topic's timeline), replay from the topic
    seen = _json(cli(tenant.env("operator"), "inspect", run_id, "--json"))
    assert seen["state"]["status"] == "SUCCEEDED" and seen["state"]["epoch"] == 2
    assert [r["epoch"] for r in seen["timeline"]][-1] == 2
    assert partition_for(run_id, tenant.partitions) == seen["partition"]
    replayed = _json(cli(tenant.env("operator"), "replay", run_id, "--json"))
    assert replayed["state"]["status"] == "SUCCEEDED"


def test_operator_erases_a_run_with_tombstones(tenant: Tenant, provider: Provider) -> None:
    run_id = "secure-erase"
    done = child(tenant.env("agent"), run_id, "agent-e", provider)
    assert done.wait(120) == 0, done.stderr.read()[-3000:]
    assert cli(tenant.env("projector"), "projector", "--until-caught-up").returncode == 0
    erased = _json(cli(tenant.env("operator"), "erase", run_id, "--yes", "--json"))
    assert erased["tombstones"] == erased["records_seen"] > 0
    assert cli(tenant.env("projector"), "projector", "--until-caught-up").returncode == 0
    assert cli(tenant.env("operator"), "inspect", run_id, "--json").returncode == 1  # no state left


def test_the_demo_runs_on_the_secure_three_broker_stack(cluster: Cluster) -> None:
    """The demo's children (agents, projector, provider, memory extractor) get the parent's Kafka security
    settings (``Settings.as_env``): before, they were handed a bare bootstrap and talked plaintext."""
    out = cli(cluster.env("admin"), "demo", "--runs", "8", "--agents", "2", "--kills", "2", "--no-memory", "--json",
              timeout_s=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout)
    assert summary["ok"] and summary["runs_completed"] == 8 and summary["side_effect_duplicates"] == 0, summary

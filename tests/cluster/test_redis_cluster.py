"""The same crash tests, on a real 3-master Redis Cluster (the session stack's, TLS and ACL users; and a private
plain one whose master the test restarts).

The test functions are imported from the single-server suites and collected here with this module's fixtures:
``settings`` is the stack's administrator (Kafka super user, Redis ``admin``) under a fresh prefix on the
3-broker secure stack, whose Redis is ``rediss+cluster://`` — so every script, pipeline and scan they drive runs
against three masters (redis-py refuses a cross-slot script or transaction before sending it; a scan sees one
node only unless it goes node by node). ``private_redis`` is a private 3-master cluster started with the stack's
launcher; "restart" SHUTDOWNs one master and "sigkill" SIGKILLs it (the cluster is down — CLUSTERDOWN — until it
is back), then the launcher starts it again on its ``nodes.conf`` and AOF.

The batched hand-over's tests (issue 20) run here too: its pipelines and per-instance scripts split by slot.

On the old code none of this ran: no Redis setting took a cluster, and the first ``start_run`` died on a
cross-slot script (lease and owned set in two slots).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from runjournal.core import redis_client
from runjournal.core.settings import Settings
from runjournal.deploy.redis_stack import RedisShape, up_redis
from tests.cluster.conftest import Cluster, base_env, free_port_block, new_tenant
from tests.consumers.recovery.test_handover import (
    test_a_pass_killed_between_two_batches_is_completed_by_the_next_pass,
    test_batched_reads_and_writes_keep_the_single_run_contracts,
    test_one_runs_failed_write_does_not_lose_the_others_and_the_next_pass_completes_it,
)
from tests.faults.test_projector_crash import (
    test_redis_restart_midstream_no_loss_no_double_apply,
    test_sigkill_mid_batch_then_restart_equals_uninterrupted,
    test_two_members_split_partitions_and_survive_a_kill,
)
from tests.faults.test_recovery_crash_matrix import (
    test_sigkill_at_each_recovery_step_then_a_normal_pass_resumes_every_run_exactly_once as recovery_crash_matrix,
)
from tests.producers.test_approvals import provider, test_an_approval_granted_before_a_crash_is_not_asked_again

pytestmark = [pytest.mark.cluster, pytest.mark.integration, pytest.mark.crash]
test_recovery_crash_matrix = recovery_crash_matrix

__all__ = [  # collected here, against the Redis Cluster (see the module docstring)
    "provider", "test_an_approval_granted_before_a_crash_is_not_asked_again",
    "test_redis_restart_midstream_no_loss_no_double_apply", "test_sigkill_mid_batch_then_restart_equals_uninterrupted",
    "test_two_members_split_partitions_and_survive_a_kill",
    "test_recovery_crash_matrix",
    "test_a_pass_killed_between_two_batches_is_completed_by_the_next_pass",
    "test_batched_reads_and_writes_keep_the_single_run_contracts",
    "test_one_runs_failed_write_does_not_lose_the_others_and_the_next_pass_completes_it",
]


@pytest.fixture
def settings(cluster: Cluster, tmp_path: Path) -> Settings:
    """The administrator under a fresh prefix (3 partitions, RF 3) on the session stack's Redis Cluster."""
    s = new_tenant(cluster, tmp_path).settings()
    assert redis_client.is_cluster(redis_client.client(s)), s.redis_url
    return s


@pytest.fixture
def service_env(settings: Settings) -> dict[str, str]:
    """A child process's environment: the administrator's settings (Kafka and Redis) under the test's prefix."""
    return {**base_env(), **settings.as_env()}


@dataclass
class PrivateCluster:
    """A private plain 3-master Redis Cluster (``runjournal.deploy.redis_stack``) whose first master goes away."""

    directory: Path
    port: int
    entry: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """``redis+cluster://`` of its three masters."""
        return str(self.entry["url"])

    def overrides(self) -> dict[str, object]:
        """Settings that point at it (no user, no TLS)."""
        return {"redis_url": self.url, "redis_username": None, "redis_password": None, "redis_ssl_ca_location": None}

    def start(self) -> None:
        """Start the masters that are not running (on their data) and wait for ``cluster_state:ok``."""
        def save(entry: dict[str, Any]) -> None:
            self.entry = entry

        up_redis(self.directory, self.entry, shape=RedisShape(cluster=True), redis_port=self.port, prefix="private",
                 save=save, timeout_s=120)

    def go_away(self, how: str) -> None:
        """The first master: ``restart`` SHUTDOWNs it (AOF flushed, scripts forgotten), ``sigkill`` kills it."""
        node = self.entry["nodes"][0]
        if how == "restart":
            redis_client.client(None, url=f"redis://127.0.0.1:{node['port']}/0").shutdown()
        else:
            os.kill(node["process"]["pid"], signal.SIGKILL)

    def stop(self) -> None:
        """Stop every master."""
        from runjournal.deploy.redis_stack import stop_redis

        stop_redis(self.entry, grace_s=10)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateCluster]:
    private = PrivateCluster(tmp_path / "redis", free_port_block(6))
    private.start()
    try:
        yield private
    finally:
        private.stop()

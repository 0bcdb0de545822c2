"""The framework adapters as a user runs them on the production shape: ``examples/langgraph_agent.py`` with the
``agent`` role's credentials (``runjournal stack env --role agent``: SASL_SSL + ACLs on Kafka, an ACL user on a
TLS Redis Cluster) exits 0 — its checkpoint projection's MULTI/EXEC is allowed by the role's Redis ACL — and the
``operator`` erases the run: tombstones on ``{prefix}.checkpoints`` and the projection's keys gone."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from runjournal.core import redis_client
from runjournal.core.checkpoint_records import KINDS
from runjournal.core.redis_keys import RedisKeys
from tests.cluster.conftest import Tenant, cli

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_langgraph_example_runs_as_the_agent_role_and_the_operator_erases_it(tenant: Tenant) -> None:
    pytest.importorskip("langgraph")
    env = {**tenant.env("agent"), "OPENAI_API_KEY": ""}
    done = subprocess.run([sys.executable, str(EXAMPLES / "langgraph_agent.py")], env=env, capture_output=True,
                          text=True, timeout=300, check=False, cwd=tempfile.gettempdir())
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["emails_sent"] == 1 and summary["checkpoints"] >= 4
    run_id = summary["run_id"]
    admin, keys = redis_client.client(tenant.settings()), RedisKeys(tenant.prefix)
    assert admin.exists(keys.checkpoint(run_id, "cp")) == 1 and admin.sismember(keys.checkpoint_threads(), run_id)

    erased = cli(tenant.env("operator"), "erase", run_id, "--yes", "--json")
    assert erased.returncode == 0, erased.stderr[-3000:]
    report = json.loads(erased.stdout)
    assert report["checkpoint_tombstones"] > 0 and report["tombstones"] > 0
    assert admin.exists(*(keys.checkpoint(run_id, kind) for kind in KINDS)) == 0
    assert not admin.sismember(keys.checkpoint_threads(), run_id)

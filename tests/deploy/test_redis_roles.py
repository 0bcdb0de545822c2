"""Each role's Redis ACL rules are enough for its work — on the one-node test Redis, in ``make test``.

The 3-broker secure cluster (tests/cluster) runs every service as its least-privilege user, but late in CI; a
command or key family a role's code uses and its rules do not grant (TIME for the operators' requests and the
durable timers was one) must fail here first. The users are made by ``runjournal.deploy.redis_acls.grant`` for a
fresh prefix — the same rules ``runjournal stack up --secure`` writes — and every process runs as its role's user:
an agent owning a run (heartbeat, the requests it reads, a durable sleep), the operator's pause / resume / signal /
cancel / fork --dry-run / inspect, the recovery job's sweep (and its wake pass), the projector. Kafka is the plain
test broker: only Redis's rules are under test.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from runjournal import Journal
from runjournal.core import redis_client
from runjournal.core.settings import Settings
from runjournal.deploy.redis_acls import ROLES, grant
from tests.cli.test_paths import rj
from tests.support.readback import wait_first_call

pytestmark = pytest.mark.integration


@pytest.fixture
def users(topics: Settings) -> Iterator[dict[str, tuple[str, str]]]:
    """role → (Redis user, password) for ``topics``' prefix; the users are deleted afterwards."""
    admin = redis_client.client(topics)
    tag = uuid.uuid4().hex[:8]
    names = {role: f"rj-{tag}-{role}" for role in ROLES}
    passwords = {user: secrets.token_hex(12) for user in names.values()}
    grant(admin, names, topics.topic_prefix, passwords=passwords)
    try:
        yield {role: (user, passwords[user]) for role, user in names.items()}
    finally:
        admin.execute_command("ACL", "DELUSER", *names.values())


def _as(settings: Settings, login: tuple[str, str]) -> Settings:
    return settings.model_copy(update={"redis_username": login[0], "redis_password": SecretStr(login[1])})


def _env(service_env: dict[str, str], login: tuple[str, str]) -> dict[str, str]:
    return {**service_env, "RUNJOURNAL_REDIS_USERNAME": login[0], "RUNJOURNAL_REDIS_PASSWORD": login[1]}


def _ok(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_every_role_does_its_work_with_its_redis_rules_only(topics: Settings, service_env: dict[str, str],
                                                            users: dict[str, tuple[str, str]],
                                                            tmp_path: Path) -> None:
    operator = _env(service_env, users["operator"])
    # the agent: a durable sleep (Redis's clock) in a run of its own, then a run it owns while operators act
    with Journal(_as(topics, users["agent"]), producer_id=f"ag-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("t", "sleeper", {}, run_id=f"acl-sleep-{uuid.uuid4().hex[:6]}")
        run.sleep(0.05)
        run.succeed({"slept": True})
    run_id = f"acl-ctl-{uuid.uuid4().hex[:6]}"
    agent = subprocess.Popen([sys.executable, "-m", "tests.support.control_child", run_id,
                              f"ag-{uuid.uuid4().hex[:6]}", str(tmp_path), "40"],
                             env=_env(service_env, users["agent"]), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        wait_first_call(topics, run_id, child=agent)
        paused = _ok(rj(operator, "pause", run_id, "--reason", "acl", "--wait", "60", "--json", timeout=120)[0])
        assert paused["results"][0]["outcome"] == "paused", paused
        assert json.loads(agent.stdout.readline())["stopped"] == "pause"
        sent = _ok(rj(operator, "signal", run_id, "go", "--payload", "1", "--json", timeout=120)[0])
        assert sent["outcome"] == "delivered", sent
        resumed = _ok(rj(operator, "resume", run_id, "--json", timeout=120)[0])
        assert resumed["results"][0]["outcome"] == "resumed", resumed
        out, err = agent.communicate(timeout=120)
        assert agent.returncode == 0, err[-3000:]
        assert json.loads(out.splitlines()[-1]) == {"done": True}
    finally:
        agent.kill()
    # the recovery job's sweep and wake pass; the projector; the operator's reads
    swept = _ok(rj(_env(service_env, users["recovery"]), "recover", "--stale", "--json", timeout=120)[0])
    assert swept["runs"] == [] or all(r["action"] != "error" for r in swept["runs"]), swept
    projected = rj(_env(service_env, users["projector"]), "projector", "--until-caught-up", timeout=120)[0]
    assert projected.returncode == 0, projected.stderr[-3000:]
    seen = _ok(rj(operator, "inspect", run_id, "--json", timeout=120)[0])
    assert seen["state"]["status"] == "SUCCEEDED"
    fork = _ok(rj(operator, "fork", run_id, "--at", "3", "--dry-run", "--json", timeout=120)[0])
    assert fork["outcome"] == "would_fork", fork
    refused = rj(operator, "cancel", run_id, "--json", timeout=120)[0]
    assert refused.returncode == 1 and "already ended" in refused.stderr, refused.stderr[-2000:]


class _Blob:
    """A read-only tool whose result is over ``inline_result_bytes`` (records in ``{prefix}.payloads``)."""

    name = "fetch_blob"
    side_effect = False
    timeout_ms = 1000

    def __call__(self, args: dict, idempotency_key: str) -> dict:
        return {"blob": "b" * 20_000}


def test_the_archiver_archives_under_its_redis_rules_and_is_refused_a_key_outside_them(
        topics: Settings, service_env: dict[str, str], users: dict[str, tuple[str, str]], tmp_path: Path) -> None:
    """``runjournal archiver`` as the ``archiver`` user: notes the finish (TIME, the ``{P:arc}`` MULTI), archives the
    run (a large result's records too) and removes its Redis state, records and index entries (erase's step: the
    instance sets SCANned) and gives the run-id claim its expiry (``RUNJOURNAL_RUN_ID_MEMORY_S``); that user may not
    write a lease, the topic identity or another prefix's archive unit."""
    import redis

    from runjournal.consumers.archive import read_archived
    from runjournal.consumers.runtime.partitions import run_partition
    from runjournal.core.redis_keys import RedisKeys
    from tests.support.provider import project

    folder = tmp_path / "archive"
    run_id = f"acl-arc-{uuid.uuid4().hex[:6]}"
    with Journal(_as(topics, users["agent"]), producer_id=f"ag-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("t", "archived", {}, run_id=run_id)
        with run.node("fetch"):
            run.call(_Blob(), {"n": 1})
        run.succeed({"done": True})
    project(topics)
    admin, keys = redis_client.client(topics), RedisKeys(topics.topic_prefix)
    partition = run_partition(topics, run_id)
    assert admin.exists(keys.run(partition, run_id)) and admin.hexists(keys.index(partition), run_id)
    env = {**_env(service_env, users["archiver"]), "RUNJOURNAL_ARCHIVE_URL": folder.as_uri(),
           "RUNJOURNAL_RETENTION_S": "1"}
    first = _ok(rj(env, "archiver", "--until-caught-up", "--sweep-interval", "0.2", "--json", timeout=180)[0])
    assert first["finished_noted"] == 1, first
    time.sleep(1.2)
    second = _ok(rj(env, "archiver", "--until-caught-up", "--json", timeout=180)[0])
    assert first["archived"] + second["archived"] == [run_id], (first, second)
    archived = read_archived(topics.model_copy(update={"archive_url": folder.as_uri()}), run_id)
    assert archived is not None and archived.manifest["status"] == "SUCCEEDED"
    assert {r["source"] for r in archived.rows} == {"events", "payloads"}  # the large result's records too
    assert not admin.exists(keys.run(partition, run_id)) and not admin.hexists(keys.index(partition), run_id)
    assert admin.zscore(keys.archive_due(), run_id) is None
    assert 0 < admin.pttl(keys.claim(run_id)) <= 30 * 24 * 3600 * 1000, "the id is claimed for the window only"
    archiver = redis_client.client(_as(topics, users["archiver"]))
    assert archiver.zcard(keys.archive_due()) == 0  # its own unit: allowed
    for refused in (lambda: archiver.set(keys.lease("someone"), "x"),  # leases: read only
                    lambda: archiver.set(keys.topic_identity(), "x"),  # not its family
                    lambda: archiver.zadd(RedisKeys(f"other{topics.topic_prefix}").archive_due(), {"r": 1})):
        with pytest.raises(redis.exceptions.NoPermissionError):
            refused()

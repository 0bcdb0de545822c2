"""The secure stack's Redis refuses who it must: a client without credentials, with a wrong password, without
TLS or without the stack's CA; and each role's ACL user everything it does not need (an agent cannot write the
projection, a plan, an approval or — as its own user — another instance's lease; the projector cannot write
plans or approvals; no role may run FLUSHALL, KEYS, CONFIG or ACL, or touch another prefix). The roles' rules
(``runjournal.deploy.redis_acls``) are enough for their work: the pipeline test runs every service with them,
and a named agent's Journal runs here with its own user."""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from pydantic import SecretStr

from runjournal import Journal
from runjournal.core import redis_client
from runjournal.core.errors import ConfigError
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from tests.cluster.conftest import Cluster, Tenant, cli

pytestmark = [pytest.mark.cluster, pytest.mark.integration]


def _refusal(settings: Settings) -> str | None:
    """None when PING works with ``settings``, else the refusal's kind (``auth``, ``tls``, or the error)."""
    try:
        redis_client.check_access(settings, timeout_s=5)
        return None
    except ConfigError as exc:
        return next(k for k, hint in redis_client.ACCESS_HINTS.items() if hint in str(exc))
    except redis.RedisError as exc:
        return f"{type(exc).__name__}: {exc}"


def test_a_client_without_credentials_or_tls_is_refused(cluster: Cluster, tenant: Tenant) -> None:
    operator = tenant.settings("operator")
    assert operator.redis_url.startswith("rediss+cluster://") and _refusal(operator) is None  # the control
    anonymous = operator.model_copy(update={"redis_username": None, "redis_password": None})
    assert _refusal(anonymous) == "auth"  # `default` is off: no command without a login
    assert _refusal(operator.model_copy(update={"redis_password": SecretStr("not-the-password")})) == "auth"
    assert _refusal(operator.model_copy(update={"redis_username": "mallory"})) == "auth"
    assert _refusal(operator.model_copy(update={"redis_ssl_ca_location": None})) == "tls"  # system CAs never signed it
    plaintext = operator.model_copy(update={"redis_url": operator.redis_url.replace("rediss+", "redis+"),
                                            "redis_ssl_ca_location": None})
    assert _refusal(plaintext) not in (None, "auth")  # a TLS port cuts a plaintext client
    # the CLI with a wrong Redis password: refused at once, naming the settings to check
    env = {**tenant.env("operator"), "RUNJOURNAL_REDIS_PASSWORD": "not-the-password"}
    out = cli(env, "projector", "--until-caught-up", timeout_s=120)
    assert out.returncode != 0 and "RUNJOURNAL_REDIS_USERNAME and RUNJOURNAL_REDIS_PASSWORD" in out.stderr, out.stderr


def _actions(keys: RedisKeys, other: RedisKeys) -> dict[str, Callable[[Any], Any]]:
    """What a user might try, each on keys of the tenant's prefix (probe names: nothing real is clobbered)."""
    return {
        "read the projection": lambda r: r.get(keys.run(0, "probe")),
        "write the projection": lambda r: r.set(keys.run(0, "probe"), "{}"),
        "write the topic identity": lambda r: r.delete(keys.topic_identity()),
        "write lag samples": lambda r: r.delete(keys.projector_lag()),
        "read a lease": lambda r: r.get(keys.lease("probe-agent")),
        "write a lease": lambda r: r.set(keys.lease("probe-agent"), "forged", px=1000),
        "write an owned set": lambda r: r.srem(keys.owned("probe-agent"), "probe"),
        "write an assignment list": lambda r: r.lrem(keys.assign("probe-agent"), 0, "probe"),
        "read a plan": lambda r: r.get(keys.plan("probe")),
        "write a plan": lambda r: r.set(keys.plan("probe"), "{}"),
        "read an approval": lambda r: r.hget(keys.approvals("probe"), "c"),
        "write an approval": lambda r: r.hsetnx(keys.approvals("probe"), "c", "{}"),
        "claim a run id": lambda r: r.set(keys.claim("probe"), "x", px=1000),
        "write a result": lambda r: r.set(keys.result("0" * 64), "x", px=1000),
        "write the parked set": lambda r: r.srem(keys.parked(), "probe"),
        "write a checkpoint projection": lambda r: r.hdel(keys.checkpoint("probe", "cp"), "f"),
        "a MULTI on a thread's checkpoints": lambda r: _multi(r, keys.checkpoint("probe", "cp")),
        "write the archive unit": lambda r: r.zrem(keys.archive_due(), "probe"),
        "write another prefix's plan": lambda r: r.set(other.plan("probe"), "{}"),
        "FLUSHALL": lambda r: r.flushall(),
        "KEYS": lambda r: r.keys("*"),
        "CONFIG GET": lambda r: r.config_get("maxmemory"),
        "ACL SETUSER": lambda r: r.acl_setuser("probe-user", enabled=True),
    }


def _multi(r: Any, key: str) -> None:
    """A transactional pipeline as the adapters send it (MULTI, HDEL, EXEC; one slot). A refusal is reported as
    NoPermissionError however the cluster pipeline wraps it (a refused MULTI, or EXECABORT after a refused HDEL)."""
    pipe = r.pipeline(transaction=True)
    pipe.hdel(key, "f")
    try:
        pipe.execute()
    except redis.exceptions.RedisError as exc:
        if "noperm" in str(exc).lower() or "permission" in str(exc).lower():
            raise redis.exceptions.NoPermissionError(str(exc)) from exc
        raise


_READS = {"read the projection", "read a lease", "read a plan", "read an approval"}
ALLOWED = {
    "agent": {"read the projection", "read a lease", "write a lease", "write an owned set", "write an assignment list",
              "read a plan", "read an approval", "claim a run id", "write a result", "write a checkpoint projection",
              "a MULTI on a thread's checkpoints"},
    "projector": {"read the projection", "write the projection", "write the topic identity", "write lag samples"},
    "recovery": {"read the projection", "read a lease", "write an owned set", "write an assignment list",
                 "read a plan", "write a plan", "claim a run id", "write the parked set",
                 "write the topic identity"},  # it stores the journal's shape when no projector has (decision 0043)
    "memory": {"read the projection"},
    "operator": _READS | {"write the projection", "write an owned set", "write an assignment list", "write a plan",
                          "write an approval", "write the parked set", "write a checkpoint projection",
                          "a MULTI on a thread's checkpoints"},
    "archiver": _READS | {"write the archive unit", "write the projection", "write an owned set",  # erase's step
                          "write an assignment list", "write a plan", "write an approval", "write a result",
                          "write the parked set", "write a checkpoint projection",
                          "a MULTI on a thread's checkpoints",
                          "claim a run id"},  # an archived run's claim gets its expiry (RUNJOURNAL_RUN_ID_MEMORY_S)
}


def _outcomes(client: Any, actions: dict[str, Callable[[Any], Any]]) -> dict[str, str]:
    out = {}
    for name, act in actions.items():
        try:
            act(client)
            out[name] = "allowed"
        except redis.exceptions.NoPermissionError:
            out[name] = "denied"
    return out


@pytest.mark.parametrize("role", list(ALLOWED))
def test_each_role_may_do_what_it_needs_and_nothing_else(tenant: Tenant, role: str) -> None:
    keys, other = RedisKeys(tenant.prefix), RedisKeys(f"other{tenant.prefix}")
    client = redis_client.client(tenant.settings(role))
    outcome = _outcomes(client, _actions(keys, other))
    assert {n for n, o in outcome.items() if o == "allowed"} == ALLOWED[role], outcome


def test_an_agent_user_of_its_own_cannot_touch_another_instances_keys(cluster: Cluster, tenant: Tenant) -> None:
    """One Redis user per agent name (``acls create --redis --agent-name``): its Journal works — lease, incarnations,
    run-id claims, owned set — and another instance's lease, owned set or assignment list is refused. (Agents
    sharing the fleet user can reach each other's keys, as they can fence each other's transactional ids.)"""
    user, password = f"svc-{uuid.uuid4().hex[:6]}", secrets.token_urlsafe(12)
    admin_env = {**cluster.env("admin"), "RUNJOURNAL_TOPIC_PREFIX": tenant.prefix}
    made = cli(admin_env, "acls", "create", "--redis", "--principal", f"agent={user}", "--agent-name", "agent-a",
               "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["users"] == {"agent": user}
    assert json.loads(made.stdout)["disabled"] == [user]  # issue 35: said, not silent — it has no password yet
    admin = redis_client.client(tenant.settings())
    for node in redis_client.nodes(admin):  # the password, by the administrator (ACLs are per node)
        node.acl_setuser(user, enabled=True, passwords=[f"+{password}"])
    mine = tenant.settings("agent").model_copy(update={"redis_username": user, "redis_password": SecretStr(password)})
    with Journal(mine, producer_id="agent-a") as first, Journal(mine, producer_id="agent-a") as second:
        assert (first.producer_id, second.producer_id) == ("agent-a", "agent-a#2")
        run = second.start_run("acme", "a", {"x": 1}, run_id=f"own-{uuid.uuid4().hex[:6]}")
        run.succeed({"ok": True})
    keys, r = RedisKeys(tenant.prefix), redis_client.client(mine)
    for forge in (lambda: r.set(keys.lease("agent-b"), "forged", px=1000), lambda: r.sadd(keys.owned("agent-b"), "x"),
                  lambda: r.rpush(keys.assign("agent-b"), "x"), lambda: r.set(keys.lease("agent-ab"), "forged")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            forge()
    with pytest.raises(redis.exceptions.NoPermissionError):
        r.set(keys.run(0, "forged"), "{}")  # nor the projection

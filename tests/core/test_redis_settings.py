"""Redis settings and the one client builder: the URL forms (one server, TLS, a cluster), the ACL user and the
TLS files, what a secure local stack supplies, masking, and a cluster client that connects on first use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from runjournal.core import redis_client
from runjournal.core._redis_url import parse_redis_url
from runjournal.core.errors import ConfigError
from runjournal.core.settings import Settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in list(os.environ):
        if key.startswith("RUNJOURNAL_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("RUNJOURNAL_STACK_DIR", str(tmp_path / "nostack"))


def test_url_forms() -> None:
    one = parse_redis_url("rediss://svc-agent:p%40ss@redis.example.net:6380/2")
    assert (one.cluster, one.tls, one.username, one.password) == (False, True, "svc-agent", "p@ss")
    many = parse_redis_url("redis+cluster://u:pw@10.0.0.1:7000, 10.0.0.2:7001,[::1]:7002")
    assert many.cluster and not many.tls and many.nodes == (("10.0.0.1", 7000), ("10.0.0.2", 7001), ("::1", 7002))
    assert parse_redis_url("rediss+cluster://h:1").tls
    assert parse_redis_url("unix:///run/redis.sock").nodes == ()


@pytest.mark.parametrize(("url", "says"), [
    ("http://h:6379", "is not a Redis URL"),
    ("redis+cluster://", "at least one seed node"),
    ("redis+cluster://h1", "needs host:port"),
    ("redis+cluster://h1:7000/3", "database 0 only"),
])
def test_bad_urls_are_named(monkeypatch: pytest.MonkeyPatch, url: str, says: str) -> None:
    monkeypatch.setenv("RUNJOURNAL_REDIS_URL", url)
    with pytest.raises(ConfigError, match="RUNJOURNAL_REDIS_URL") as err:
        Settings.load()
    assert says in str(err.value)


def test_tls_files_need_a_tls_url_and_exist(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    monkeypatch.setenv("RUNJOURNAL_REDIS_SSL_CA_LOCATION", str(ca))
    with pytest.raises(ConfigError, match="use rediss://"):
        Settings.load(redis_url="redis://h:1/0")
    assert Settings.load(redis_url="rediss+cluster://h:1").redis_ssl_ca_location == ca
    monkeypatch.setenv("RUNJOURNAL_REDIS_SSL_CERTIFICATE_LOCATION", str(ca))
    with pytest.raises(ConfigError, match="needs both"):
        Settings.load(redis_url="rediss://h:1/0")
    monkeypatch.setenv("RUNJOURNAL_REDIS_SSL_KEY_LOCATION", str(tmp_path / "missing.key"))
    with pytest.raises(ConfigError, match="RUNJOURNAL_REDIS_SSL_KEY_LOCATION: .* is not a readable file"):
        Settings.load(redis_url="rediss://h:1/0")


def test_the_password_is_masked_and_given_credentials_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNJOURNAL_REDIS_URL", "redis://url-user:url-secret@h:1/0")
    monkeypatch.setenv("RUNJOURNAL_REDIS_USERNAME", "svc-projector")
    monkeypatch.setenv("RUNJOURNAL_REDIS_PASSWORD", "s3cret-value")
    out = subprocess.run([sys.executable, "-m", "runjournal", "settings"], capture_output=True, text=True,
                         env=dict(os.environ), timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert shown["redis_password"] == "***" and shown["redis_url"] == "redis://url-user:***@h:1/0"
    assert "s3cret-value" not in out.stdout and "url-secret" not in out.stdout
    client = redis_client.client(Settings.load())
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["username"], kwargs["password"]) == ("svc-projector", "s3cret-value")
    assert Settings.load().as_env()["RUNJOURNAL_REDIS_PASSWORD"] == "s3cret-value"  # children connect like the parent


def test_a_secure_stack_supplies_the_operator_and_its_ca_only_with_its_own_url(monkeypatch: pytest.MonkeyPatch,
                                                                                tmp_path: Path) -> None:
    users, ca = tmp_path / "users.json", tmp_path / "ca.pem"
    users.write_text(json.dumps({"operator": "op-pw", "agent": "ag-pw"}))
    ca.write_text("x")
    (tmp_path / "stack.json").write_text(json.dumps({"redis": {
        "url": "rediss+cluster://127.0.0.1:7000,127.0.0.1:7001", "cluster": True,
        "security": {"ca": str(ca), "users_file": str(users), "default_user": "operator"}}}))
    monkeypatch.setenv("RUNJOURNAL_STACK_DIR", str(tmp_path))
    s = Settings.load()
    assert (s.redis_username, s.redis_password.get_secret_value(), s.redis_ssl_ca_location) == ("operator", "op-pw", ca)
    monkeypatch.setenv("RUNJOURNAL_REDIS_USERNAME", "agent")
    monkeypatch.setenv("RUNJOURNAL_REDIS_PASSWORD", "ag-pw")
    assert Settings.load().redis_username == "agent"  # given credentials win
    monkeypatch.delenv("RUNJOURNAL_REDIS_USERNAME")
    monkeypatch.delenv("RUNJOURNAL_REDIS_PASSWORD")
    monkeypatch.setenv("RUNJOURNAL_REDIS_URL", "redis://prod:6379/0")  # another Redis: nothing of the stack's
    other = Settings.load()
    assert (other.redis_username, other.redis_password, other.redis_ssl_ca_location) == (None, None, None)


def test_a_cluster_client_connects_on_first_use_and_an_unreachable_one_is_transient() -> None:
    """Stores are built before Redis answers (a service started while Redis is down waits in its failure policy
    rather than failing in a constructor): nothing connects until the first command, whose failure is a
    ``redis.ConnectionError`` (transient in ``consumers/runtime/failures.py``)."""
    from runjournal.consumers.projector.store import ProjectionStore
    from runjournal.consumers.runtime.failures import TRANSIENT, classify
    from runjournal.deploy.procs import free_port

    ports = [free_port(), free_port()]
    settings = Settings.load(redis_url=f"redis+cluster://127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}")
    client = redis_client.client(settings, socket_connect_timeout=0.5)
    assert redis_client.is_cluster(client)
    store = ProjectionStore(client, "p")  # registers its script: no connection needed
    with pytest.raises(redis.ConnectionError) as err:
        store.applied_offset(0)
    assert classify(err.value).kind == TRANSIENT
    assert "no Redis Cluster node answers" in str(err.value)


def test_acls_show_redis_lists_each_roles_rules(tmp_path: Path) -> None:
    """``runjournal acls show --redis [--agent-name N] --json``: key patterns and ``ACL SETUSER`` rules per role."""
    from runjournal.deploy import redis_acls

    env = {**os.environ, "RUNJOURNAL_TOPIC_PREFIX": "acme"}
    out = subprocess.run([sys.executable, "-m", "runjournal", "acls", "show", "--redis", "--agent-name", "agent-7",
                          "--json"], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert set(shown) == set(redis_acls.ROLES)
    assert shown["memory"]["rules"][:5] == [f"%R~rj:{{acme.p{'[0-9]' * n}}}:*" for n in range(1, 6)]
    assert "+@write" not in shown["memory"]["rules"] and "-@dangerous" in shown["projector"]["rules"]
    assert shown["agent"]["rules"][:2] == ["~rj:{acme:i:agent-7}:*", "~rj:{acme:i:agent-7#*}:*"]
    assert not any(r.startswith("~") and ":r:" in r and r.endswith(":plan") for r in shown["agent"]["rules"])
    table = subprocess.run([sys.executable, "-m", "runjournal", "acls", "show", "--redis", "--role", "projector"],
                           capture_output=True, text=True, env=env, timeout=60, check=False)
    assert table.returncode == 0 and "projection" in table.stdout, table.stderr


@pytest.mark.parametrize("name", ["*", "a?[b]*"])
def test_an_explicit_agent_name_is_matched_literally(name: str) -> None:
    """``acls show --redis --agent-name NAME``: the name is a literal, glob characters included — ``*`` is an agent
    called ``*``, never every instance (the fleet-wide rule is the one without ``--agent-name``)."""
    env = {**os.environ, "RUNJOURNAL_TOPIC_PREFIX": "acme"}
    out = subprocess.run([sys.executable, "-m", "runjournal", "acls", "show", "--redis", "--agent-name", name,
                          "--json"], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    escaped = "".join("\\" + c if c in "*?[]\\" else c for c in name)
    rules = json.loads(out.stdout)["agent"]["rules"]
    assert rules[:2] == [f"~rj:{{acme:i:{escaped}}}:*", f"~rj:{{acme:i:{escaped}#*}}:*"]
    assert "~rj:{acme:i:*}:*" not in rules

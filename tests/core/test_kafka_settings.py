"""Kafka security and pass-through settings: what reaches every client config, what is refused, what is masked.

The builder (``runjournal.core.kafka.client_config``) is the one place a client config is made, so these
tests check its output; ``tests/cluster`` checks the same settings against a real SASL_SSL cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from runjournal.core import kafka
from runjournal.core.errors import ConfigError
from runjournal.core.settings import Settings

SECRET = "hunter2-secret"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in list(os.environ):
        if key.startswith("RUNJOURNAL_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("RUNJOURNAL_STACK_DIR", str(tmp_path / "no-stack"))


@pytest.fixture
def pem(tmp_path: Path) -> Path:
    path = tmp_path / "ca.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\n")
    return path


def test_typed_security_settings_reach_every_client_role(monkeypatch: pytest.MonkeyPatch, pem: Path) -> None:
    monkeypatch.setenv("RUNJOURNAL_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("RUNJOURNAL_KAFKA_SASL_MECHANISM", "SCRAM-SHA-256")
    monkeypatch.setenv("RUNJOURNAL_KAFKA_SASL_USERNAME", "svc-agent")
    monkeypatch.setenv("RUNJOURNAL_KAFKA_SASL_PASSWORD", SECRET)
    monkeypatch.setenv("RUNJOURNAL_KAFKA_SSL_CA_LOCATION", str(pem))
    monkeypatch.setenv("RUNJOURNAL_KAFKA_SSL_CERTIFICATE_LOCATION", str(pem))
    monkeypatch.setenv("RUNJOURNAL_KAFKA_SSL_KEY_LOCATION", str(pem))
    monkeypatch.setenv("RUNJOURNAL_KAFKA_SSL_KEY_PASSWORD", "key-pw")
    settings = Settings.load()
    for role in ("producer", "consumer", "admin"):
        config = kafka.client_config(settings, role, **{"group.id": "g"} if role == "consumer" else {})
        assert {k: config[k] for k in ("security.protocol", "sasl.mechanism", "sasl.username", "sasl.password",
                                       "ssl.ca.location", "ssl.certificate.location", "ssl.key.location",
                                       "ssl.key.password")} == {
            "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "svc-agent",
            "sasl.password": SECRET, "ssl.ca.location": str(pem), "ssl.certificate.location": str(pem),
            "ssl.key.location": str(pem), "ssl.key.password": "key-pw"}
    assert SECRET not in repr(settings) and SECRET not in json.dumps(settings.masked())


def test_passthrough_from_a_properties_file_and_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A managed Kafka's librdkafka client file works as is (its bootstrap too); variables win over it."""
    props = tmp_path / "client.properties"
    props.write_text("# from the cloud console\nbootstrap.servers=pkc-1.example:9092\nsecurity.protocol=SASL_SSL\n"
                     "sasl.mechanisms=PLAIN\nsasl.username=KEY\nsasl.password=" + SECRET + "\n"
                     "session.timeout.ms=45000\nsocket.keepalive.enable=false\n")
    monkeypatch.setenv("RUNJOURNAL_KAFKA_PROPERTIES_FILE", str(props))
    monkeypatch.setenv("RUNJOURNAL_LIBRDKAFKA_SOCKET_KEEPALIVE_ENABLE", "true")
    monkeypatch.setenv("RUNJOURNAL_LIBRDKAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM", "https")
    settings = Settings.load()
    assert settings.bootstrap == "pkc-1.example:9092"
    config = kafka.client_config(settings, "producer", **{"linger.ms": 5, "acks": "all"})
    assert config["bootstrap.servers"] == "pkc-1.example:9092"
    assert (config["sasl.mechanism"], config["sasl.username"], config["sasl.password"]) == ("PLAIN", "KEY", SECRET)
    assert config["socket.keepalive.enable"] == "true"  # the variable won over the file
    assert config["ssl.endpoint.identification.algorithm"] == "https"
    assert config["acks"] == "all" and config["linger.ms"] == 5
    monkeypatch.setenv("RUNJOURNAL_BOOTSTRAP", "mine:9092")
    assert Settings.load().bootstrap == "mine:9092"  # RUNJOURNAL_BOOTSTRAP wins over the file's


def test_oauthbearer_passes_its_oidc_properties_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNJOURNAL_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("RUNJOURNAL_KAFKA_SASL_MECHANISM", "OAUTHBEARER")
    monkeypatch.setenv("RUNJOURNAL_LIBRDKAFKA_SASL_OAUTHBEARER_METHOD", "oidc")
    monkeypatch.setenv("RUNJOURNAL_LIBRDKAFKA_SASL_OAUTHBEARER_CLIENT_ID", "svc-agent")
    monkeypatch.setenv("RUNJOURNAL_LIBRDKAFKA_SASL_OAUTHBEARER_CLIENT_SECRET", SECRET)
    monkeypatch.setenv("RUNJOURNAL_LIBRDKAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL", "https://idp.example/token")
    settings = Settings.load()
    config = kafka.client_config(settings, "admin")
    assert config["sasl.oauthbearer.client.secret"] == SECRET and config["sasl.oauthbearer.method"] == "oidc"
    shown = settings.masked()["kafka_properties"]
    assert shown["sasl.oauthbearer.client.secret"] == "***" and shown["sasl.oauthbearer.client.id"] == "svc-agent"
    monkeypatch.setenv("RUNJOURNAL_KAFKA_SASL_PASSWORD", "x")
    with pytest.raises(ConfigError, match="OAUTHBEARER takes no username/password"):
        Settings.load()


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("RUNJOURNAL_LIBRDKAFKA_ACKS", "1", "RUNJOURNAL_LIBRDKAFKA_ACKS: librdkafka property 'acks' cannot be passed"),
    ("RUNJOURNAL_LIBRDKAFKA_ENABLE_IDEMPOTENCE", "false", "'enable.idempotence' cannot be passed through"),
    ("RUNJOURNAL_LIBRDKAFKA_ISOLATION_LEVEL", "read_uncommitted", "'isolation.level' cannot be passed through"),
    ("RUNJOURNAL_LIBRDKAFKA_TRANSACTIONAL_ID", "x", "'transactional.id' cannot be passed through"),
    ("RUNJOURNAL_LIBRDKAFKA_GROUP_ID", "x", "'group.id' cannot be passed through"),
    ("RUNJOURNAL_LIBRDKAFKA_ENABLE_AUTO_COMMIT", "true", "'enable.auto.commit' cannot be passed through"),
    ("RUNJOURNAL_LIBRDKAFKA_BOOTSTRAP_SERVERS", "x:1", "set RUNJOURNAL_BOOTSTRAP instead"),
    ("RUNJOURNAL_LIBRDKAFKA_SOCKET_KEEPALIVE_ENABLX", "true", "RUNJOURNAL_LIBRDKAFKA_SOCKET_KEEPALIVE_ENABLX: "
                                                             "librdkafka refused"),
    ("RUNJOURNAL_LIBRDKAFKA_SOCKET_TIMEOUT_MS", "soon", "RUNJOURNAL_LIBRDKAFKA_SOCKET_TIMEOUT_MS: librdkafka refused"),
])
def test_passthrough_refuses_what_correctness_rests_on_and_names_the_variable(
        monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("'", "'")):
        Settings.load()


def test_a_java_client_file_line_is_refused_with_the_librdkafka_way(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    props = tmp_path / "java.properties"
    props.write_text('sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required '
                     'username="u" password="p";\n')
    monkeypatch.setenv("RUNJOURNAL_KAFKA_PROPERTIES_FILE", str(props))
    with pytest.raises(ConfigError, match=f"{props}:sasl.jaas.config.*librdkafka takes sasl.username"):
        Settings.load()


def test_a_property_set_twice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNJOURNAL_KAFKA_SASL_USERNAME", "a")
    monkeypatch.setenv("RUNJOURNAL_LIBRDKAFKA_SASL_USERNAME", "b")
    with pytest.raises(ConfigError, match="RUNJOURNAL_LIBRDKAFKA_SASL_USERNAME sets 'sasl.username', which "
                                          "RUNJOURNAL_KAFKA_SASL_USERNAME also sets"):
        Settings.load()


@pytest.mark.parametrize(("env", "message"), [
    ({"RUNJOURNAL_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "needs RUNJOURNAL_KAFKA_SASL_MECHANISM"),
    ({"RUNJOURNAL_KAFKA_SASL_MECHANISM": "PLAIN"}, "needs RUNJOURNAL_KAFKA_SECURITY_PROTOCOL=SASL_SSL"),
    ({"RUNJOURNAL_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "RUNJOURNAL_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
      "RUNJOURNAL_KAFKA_SASL_USERNAME": "u"},
     "needs RUNJOURNAL_KAFKA_SASL_USERNAME and RUNJOURNAL_KAFKA_SASL_PASSWORD"),
    ({"RUNJOURNAL_KAFKA_SSL_CA_LOCATION": "PEM"}, "but the security protocol is PLAINTEXT"),
    ({"RUNJOURNAL_KAFKA_SECURITY_PROTOCOL": "SSL", "RUNJOURNAL_KAFKA_SSL_CERTIFICATE_LOCATION": "PEM"},
     "needs both RUNJOURNAL_KAFKA_SSL_CERTIFICATE_LOCATION and RUNJOURNAL_KAFKA_SSL_KEY_LOCATION"),
    ({"RUNJOURNAL_KAFKA_SECURITY_PROTOCOL": "SSL", "RUNJOURNAL_KAFKA_SSL_CA_LOCATION": "/nonexistent/ca.pem"},
     "RUNJOURNAL_KAFKA_SSL_CA_LOCATION: /nonexistent/ca.pem is not a readable file"),
    ({"RUNJOURNAL_KAFKA_SECURITY_PROTOCOL": "KERBEROS"}, "RUNJOURNAL_KAFKA_SECURITY_PROTOCOL: Input should be"),
])
def test_inconsistent_security_settings_are_refused_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, pem: Path, env: dict[str, str], message: str) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, str(pem) if value == "PEM" else value)
    with pytest.raises(ConfigError, match=message):
        Settings.load()


def _runjournal(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).with_name("runjournal")), *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False, cwd=tempfile.gettempdir())


def test_runjournal_settings_masks_every_secret(tmp_path: Path, pem: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNJOURNAL_")}
    env.update(RUNJOURNAL_STACK_DIR=str(tmp_path), RUNJOURNAL_KAFKA_SECURITY_PROTOCOL="SASL_SSL",
               RUNJOURNAL_KAFKA_SASL_MECHANISM="SCRAM-SHA-512", RUNJOURNAL_KAFKA_SASL_USERNAME="svc",
               RUNJOURNAL_KAFKA_SASL_PASSWORD=SECRET + "1", RUNJOURNAL_KAFKA_SSL_CA_LOCATION=str(pem),
               RUNJOURNAL_KAFKA_SSL_KEY_PASSWORD=SECRET + "2", RUNJOURNAL_LIBRDKAFKA_SSL_KEYSTORE_PASSWORD=SECRET + "3",
               RUNJOURNAL_LIBRDKAFKA_CLIENT_RACK="rack-1")
    out = _runjournal(env, "settings")
    assert out.returncode == 0, out.stderr
    assert SECRET not in out.stdout
    shown = json.loads(out.stdout)
    assert (shown["kafka_sasl_password"], shown["kafka_ssl_key_password"]) == ("***", "***")
    assert shown["kafka_properties"] == {"ssl.keystore.password": "***", "client.rack": "rack-1"}


def test_a_child_process_gets_the_same_kafka_settings(monkeypatch: pytest.MonkeyPatch, pem: Path,
                                                     tmp_path: Path) -> None:
    """``Settings.as_env`` (what the demo, bench and tests hand their children) reproduces security and
    pass-through: a child never connects with less than its parent."""
    monkeypatch.setenv("RUNJOURNAL_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("RUNJOURNAL_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("RUNJOURNAL_KAFKA_SASL_USERNAME", "svc")
    monkeypatch.setenv("RUNJOURNAL_KAFKA_SASL_PASSWORD", SECRET)
    monkeypatch.setenv("RUNJOURNAL_KAFKA_SSL_CA_LOCATION", str(pem))
    monkeypatch.setenv("RUNJOURNAL_LIBRDKAFKA_SOCKET_KEEPALIVE_ENABLE", "true")
    monkeypatch.setenv("RUNJOURNAL_LIBRDKAFKA_CLIENT_RACK", "rack-1")
    parent = Settings.load(replication_factor=1, bootstrap="b1:9092,b2:9092")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNJOURNAL_")}
    env.update(parent.as_env())
    code = "import json; from runjournal.core.settings import Settings; s = Settings.load(); " \
           "print(json.dumps({**s.kafka_security_config(), 'bs': s.bootstrap, 'rf': s.replication_factor}))"
    child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                           check=True, cwd=tempfile.gettempdir())
    assert json.loads(child.stdout) == {**parent.kafka_security_config(), "bs": "b1:9092,b2:9092", "rf": 1}
    assert parent.kafka_security_config()["client.rack"] == "rack-1"


def test_the_local_stack_state_supplies_security_only_with_its_bootstrap(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path, pem: Path) -> None:
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"operator": SECRET, "agent": "a"}))
    (tmp_path / "stack.json").write_text(json.dumps({
        "redis": {"url": "redis://127.0.0.1:7/0"},
        "kafka": {"bootstrap": "127.0.0.1:1,127.0.0.1:3", "brokers": 3, "security": {
            "kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": "SCRAM-SHA-512",
            "kafka_ssl_ca_location": str(pem), "users_file": str(users), "default_user": "operator"}}}))
    monkeypatch.setenv("RUNJOURNAL_STACK_DIR", str(tmp_path))
    s = Settings.load()
    assert (s.bootstrap, s.replication_factor, s.kafka_security_protocol, s.kafka_sasl_username) == \
        ("127.0.0.1:1,127.0.0.1:3", 3, "SASL_SSL", "operator")
    assert s.kafka_sasl_password is not None and s.kafka_sasl_password.get_secret_value() == SECRET
    monkeypatch.setenv("RUNJOURNAL_KAFKA_SASL_USERNAME", "agent")
    monkeypatch.setenv("RUNJOURNAL_KAFKA_SASL_PASSWORD", "a")
    assert Settings.load().kafka_sasl_username == "agent"  # given credentials win, the rest still from the stack
    monkeypatch.setenv("RUNJOURNAL_BOOTSTRAP", "prod:9092")  # another cluster: nothing Kafka from the local stack
    monkeypatch.delenv("RUNJOURNAL_KAFKA_SASL_USERNAME")
    monkeypatch.delenv("RUNJOURNAL_KAFKA_SASL_PASSWORD")
    other = Settings.load()
    assert (other.kafka_security_protocol, other.kafka_sasl_username, other.replication_factor) == (None, None, 3)
    assert other.redis_url == "redis://127.0.0.1:7/0"


def test_acls_show_lists_each_roles_grants_for_the_prefix(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNJOURNAL_")}
    env.update(RUNJOURNAL_STACK_DIR=str(tmp_path), RUNJOURNAL_TOPIC_PREFIX="acme")
    out = _runjournal(env, "acls", "show", "--json")
    assert out.returncode == 0, out.stderr
    grants = json.loads(out.stdout)
    assert set(grants) == {"agent", "projector", "recovery", "memory", "operator", "archiver"}
    agent = {(g["resource"], g["name"], g["permission"]): set(g["operations"]) for g in grants["agent"]}
    assert agent == {("topic", "acme.events", "ALLOW"): {"WRITE", "DESCRIBE"},
                     ("topic", "acme.schemas", "ALLOW"): {"WRITE", "DESCRIBE", "READ"},
                     ("topic", "acme.checkpoints", "ALLOW"): {"WRITE", "DESCRIBE"},
                     ("topic", "acme.payloads", "ALLOW"): {"WRITE", "READ", "DESCRIBE"},  # large results, read back
                     ("topic", "acme.streams", "ALLOW"): {"WRITE", "READ", "DESCRIBE"},  # partial output, gap
                     ("transactional_id", "acme.", "ALLOW"): {"WRITE", "DESCRIBE"},
                     ("transactional_id", "acme.recovery", "DENY"): {"WRITE", "DESCRIBE"}}
    operator = {(g["resource"], g["name"]): set(g["operations"]) for g in grants["operator"]}
    assert operator[("topic", "acme.events")] == operator[("topic", "acme.checkpoints")] == {"WRITE"}  # erase
    assert operator[("topic", "acme.payloads")] == {"WRITE"}  # erase's tombstones; read through the prefixed READ
    recovery = {(g["resource"], g["name"]): set(g["operations"]) for g in grants["recovery"]}
    assert recovery[("topic", "acme.payloads")] == {"READ", "DESCRIBE"}
    assert not any(g["name"] == "acme.payloads" for role in ("projector", "memory") for g in grants[role])
    # the streams are never read by recovery, the projector or the extractor (0055)
    assert not any(g["name"] == "acme.streams" for role in ("projector", "recovery", "memory") for g in grants[role])
    archiver = {(g["resource"], g["name"], g["permission"]): set(g["operations"]) for g in grants["archiver"]}
    assert archiver == {("topic", "acme.events", "ALLOW"): {"READ", "WRITE", "DESCRIBE"},  # its group; tombstones
                        ("topic", "acme.schemas", "ALLOW"): {"READ", "DESCRIBE"},
                        ("topic", "acme.checkpoints", "ALLOW"): {"READ", "WRITE", "DESCRIBE"},  # archived, tombstoned
                        ("topic", "acme.payloads", "ALLOW"): {"READ", "WRITE", "DESCRIBE"},
                        ("group", "acme.archiver", "ALLOW"): {"READ", "DESCRIBE"}}
    assert not any(g["resource"] == "transactional_id" for g in grants["archiver"])  # it fences nobody
    assert not any("DELETE" in g["operations"] for gs in grants.values() for g in gs)


@pytest.mark.integration
def test_passthrough_reaches_a_real_client(settings: Settings, service_env: dict[str, str]) -> None:
    """``RUNJOURNAL_LIBRDKAFKA_DEBUG=cgrp`` turns on librdkafka's group debug lines in a real service (as JSON
    lines through the ``runjournal.kafka`` logger)."""
    from runjournal.deploy.topics import create_topics

    create_topics(settings)
    args = ("--log-level", "DEBUG", "projector", "--until-caught-up")
    quiet = _runjournal(service_env, *args)
    loud = _runjournal({**service_env, "RUNJOURNAL_LIBRDKAFKA_DEBUG": "cgrp"}, *args)
    assert quiet.returncode == loud.returncode == 0, loud.stderr
    debug = [json.loads(line) for line in loud.stderr.splitlines() if "CGRP" in line]
    assert debug and all(d["logger"] == "runjournal.kafka" for d in debug)
    assert "CGRP" not in quiet.stderr


@pytest.mark.integration
def test_topics_create_takes_replication_from_settings(settings: Settings) -> None:
    """Replication 3 on this single broker is refused with the fix named, not silently cut to 1."""
    from runjournal.deploy.errors import TopicConfigError
    from runjournal.deploy.topics import create_topics

    with pytest.raises(TopicConfigError, match=r"replication factor 3 \(RUNJOURNAL_REPLICATION_FACTOR\) needs 3 "
                                               r"brokers, but 1 answer.*RUNJOURNAL_REPLICATION_FACTOR=1"):
        create_topics(settings.model_copy(update={"replication_factor": 3}))
    reports = create_topics(settings)
    assert {(r.replication_factor, r.config["min.insync.replicas"]) for r in reports} == {(1, "1")}

"""The secure stack refuses who it must: clients without credentials, bad credentials or an untrusted
certificate, anyone at the controller port without the brokers' certificate, and every role for what
it does not need (an agent cannot delete topics, commit the projector group's offsets, write the DLQs,
fence the recovery job or touch another prefix; no role can write ACLs)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from pydantic import SecretStr

from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.deploy.topics import create_topics
from tests.cluster.conftest import Cluster, Tenant, cli

pytestmark = [pytest.mark.cluster, pytest.mark.integration]


def _client_error(settings: Settings, timeout_s: float = 5) -> set[str]:
    """The errors a metadata request with ``settings`` meets (its own and the client's error callbacks);
    empty when it succeeds."""
    seen: set[str] = set()
    admin = kafka.admin_client(settings, **{"socket.connection.setup.timeout.ms": 3000,
                                            "error_cb": lambda err: seen.add(err.name())})
    try:
        admin.list_topics(timeout=timeout_s)
        return set()
    except KafkaException as exc:
        admin.poll(0.5)
        return seen | {exc.args[0].name()}


def test_a_client_without_credentials_is_refused(cluster: Cluster, tenant: Tenant) -> None:
    operator = tenant.settings("operator")
    assert _client_error(operator) == set()  # the control: the operator's settings are accepted
    plaintext = Settings.load(bootstrap=operator.bootstrap, stack_dir=Path("/nonexistent"))
    assert _client_error(plaintext) & {"_TRANSPORT", "_TIMED_OUT", "_ALL_BROKERS_DOWN"}
    wrong = operator.model_copy(update={"kafka_sasl_password": SecretStr("not-the-password")})
    assert "_AUTHENTICATION" in _client_error(wrong)
    stranger = operator.model_copy(update={"kafka_sasl_username": "mallory"})
    assert "_AUTHENTICATION" in _client_error(stranger)
    no_ca = operator.model_copy(update={"kafka_ssl_ca_location": None})  # the system CAs never signed it
    assert "_SSL" in _client_error(no_ca)
    # the CLI with a wrong password: refused within seconds, naming the settings to check (not "start the
    # local stack"), nothing created — for the one-shot commands and the services alike
    env = {**tenant.env("operator"), "RUNJOURNAL_KAFKA_SASL_PASSWORD": "not-the-password",
           "RUNJOURNAL_TOPIC_PREFIX": f"x{tenant.prefix}"}
    for args in (("topics", "create", "--json"), ("projector", "--until-caught-up")):
        out = cli(env, *args, timeout_s=120)
        assert out.returncode != 0 and "check RUNJOURNAL_KAFKA_SASL_MECHANISM" in out.stderr, out.stderr
    assert f"x{tenant.prefix}.events" not in kafka.admin_client(tenant.settings()).list_topics(timeout=10).topics


def _sign(ca_store: Path, password: str, out: Path, *, trusted: bool) -> tuple[Path, Path]:
    """A client certificate and key (PEM) signed by the stack's CA (``trusted``) or self-signed."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.hazmat.primitives.serialization import pkcs12
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-client")])
    ca_key, ca_cert, _ = pkcs12.load_key_and_certificates(ca_store.read_bytes(), password.encode())
    issuer_key, issuer = (ca_key, ca_cert.subject) if trusted else (key, name)
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(issuer_key, hashes.SHA256()))
    cert_path, key_path = out.with_suffix(".crt"), out.with_suffix(".key")
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_the_controller_port_takes_only_a_certificate_the_stack_ca_signed(cluster: Cluster, tmp_path: Path) -> None:
    """Mutual TLS on the controller listener (not PLAINTEXT, not ANONYMOUS as a super user), reached through the
    product's own TLS settings (RUNJOURNAL_KAFKA_SSL_CERTIFICATE_LOCATION / _KEY_LOCATION): without a
    certificate or with a self-signed one the broker cuts the handshake (``bad certificate``); with one the
    stack's CA signed, TLS completes and the controller answers — it serves no client metadata."""
    state = cluster.state()["kafka"]
    sec, port = state["security"], state["nodes"][0]["controller_port"]
    password = json.loads(Path(sec["pki_secrets"]).read_text())["store_password"]
    tls = Settings.load(bootstrap=f"127.0.0.1:{port}", kafka_security_protocol="SSL",
                        kafka_ssl_ca_location=sec["kafka_ssl_ca_location"], stack_dir=Path("/nonexistent"))
    assert _client_error(tls, timeout_s=5) & {"_TRANSPORT", "_ALL_BROKERS_DOWN"}
    for trusted, expected in ((False, {"_TRANSPORT", "_ALL_BROKERS_DOWN"}), (True, {"_UNSUPPORTED_FEATURE"})):
        cert, key = _sign(Path(sec["ca_store"]), password, tmp_path / f"client-{trusted}", trusted=trusted)
        with_cert = tls.model_copy(update={"kafka_ssl_certificate_location": cert, "kafka_ssl_key_location": key})
        assert _client_error(with_cert, timeout_s=5) & expected, trusted


# -- each role is denied what it does not need ------------------------------------------------------------
def _produce(topic: str) -> Callable[[Settings], None]:
    def act(s: Settings) -> None:
        p = kafka.producer(s, **{"acks": "all", "enable.idempotence": True, "message.timeout.ms": 15000})
        errors: list[str] = []
        p.produce(topic.format(p=s.topic_prefix), key=b"acl-probe:1:1", value=b"probe",
                  on_delivery=lambda err, _m: errors.append(err.name()) if err else None)
        p.flush(20)
        if errors:
            raise PermissionError(errors[0])
    return act


def _commit(group: str) -> Callable[[Settings], None]:
    def act(s: Settings) -> None:  # an OffsetCommit for the group (an assign()-only consumer's commit would just
        # wait: librdkafka retries the group's denied FindCoordinator until its timeout)
        offsets = ConsumerGroupTopicPartitions(group.format(p=s.topic_prefix),
                                               [TopicPartition(f"{s.topic_prefix}.events", 0, 0)])
        admin = kafka.admin_client(s)  # referenced until the futures resolve
        for fut in admin.alter_consumer_group_offsets([offsets]).values():
            try:
                result = fut.result(20)
            except KafkaException as exc:
                raise PermissionError(exc.args[0].name()) from exc
            for tp in result.topic_partitions:  # the commit's own answer is per partition
                if tp.error is not None:
                    raise PermissionError(tp.error.name())
    return act


def _init_txn(txn_id: str) -> Callable[[Settings], None]:
    def act(s: Settings) -> None:
        p = kafka.producer(s, **{"transactional.id": txn_id.format(p=s.topic_prefix)})
        try:
            p.init_transactions(20)
        except KafkaException as exc:
            raise PermissionError(exc.args[0].name()) from exc
    return act


def _admin(op: str) -> Callable[[Settings], None]:
    def act(s: Settings) -> None:
        admin = kafka.admin_client(s)
        if op == "delete":
            futures = admin.delete_topics([f"{s.topic_prefix}.events"], operation_timeout=10)
        elif op == "create":
            futures = admin.create_topics([NewTopic(f"{s.topic_prefix}.scratch-{uuid.uuid4().hex[:6]}", 1, 3)])
        else:
            me = f"User:{s.kafka_sasl_username}"
            futures = admin.create_acls([AclBinding(ResourceType.TOPIC, "*", ResourcePatternType.LITERAL, me, "*",
                                                    AclOperation.ALL, AclPermissionType.ALLOW)])
        for fut in futures.values():
            try:
                fut.result(20)
            except KafkaException as exc:
                raise PermissionError(exc.args[0].name()) from exc
    return act


ACTIONS: dict[str, Callable[[Settings], None]] = {
    "write events": _produce("{p}.events"),
    "write events DLQ": _produce("{p}.events.dlq"),
    "write memory DLQ": _produce("{p}.memory.dlq"),
    "write another prefix's events": _produce("other{p}.events"),
    "commit projector group": _commit("{p}.projector"),
    "commit memory group": _commit("{p}.memory"),
    "commit archiver group": _commit("{p}.archiver"),
    "use an agent's transactional id": _init_txn("{p}.agent-x"),
    "use the recovery job's transactional id": _init_txn("{p}.recovery"),
    "create a topic": _admin("create"),
    "delete the events topic": _admin("delete"),
    "grant itself ACLs": _admin("acls"),
}
ALLOWED = {
    "agent": {"write events", "use an agent's transactional id"},
    "projector": {"write events DLQ", "commit projector group"},
    "recovery": {"write events", "use an agent's transactional id", "use the recovery job's transactional id"},
    "memory": {"write memory DLQ", "commit memory group"},
    "operator": {"write events", "create a topic"},
    "archiver": {"write events", "commit archiver group"},  # tombstones; its group (decision 0056)
}


@pytest.mark.parametrize("role", list(ALLOWED))
def test_each_role_may_do_what_it_needs_and_nothing_else(cluster: Cluster, tenant: Tenant, role: str) -> None:
    # another prefix's topics exist; our roles' grants do not cover them
    create_topics(tenant.settings().model_copy(update={"topic_prefix": f"other{tenant.prefix}"}))
    settings = tenant.settings(role)
    outcome = {}
    for name, act in ACTIONS.items():
        try:
            act(settings)
            outcome[name] = "allowed"
        except PermissionError as exc:
            outcome[name] = f"denied: {exc}"
    assert {n for n, o in outcome.items() if o == "allowed"} == ALLOWED[role], outcome
    denied = {o.split(": ", 1)[1] for o in outcome.values() if o != "allowed"}
    assert denied <= {"TOPIC_AUTHORIZATION_FAILED", "GROUP_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED",
                      "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"}, outcome



def test_acls_create_as_the_administrator_and_never_as_the_operator(cluster: Cluster, tenant: Tenant) -> None:
    """``runjournal acls create`` the way the README runs it: with ``stack env --role admin``'s settings."""
    from confluent_kafka.admin import AclBindingFilter

    prefix = f"acl{tenant.prefix}"
    admin_env = {**cluster.env("admin"), "RUNJOURNAL_TOPIC_PREFIX": prefix}
    made = cli(admin_env, "acls", "create", "--principal", "agent=User:svc-agent", "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout) == {"prefix": prefix, "principals": {"agent": "User:svc-agent"}, "bindings": 17}
    admin = kafka.admin_client(tenant.settings())  # referenced until the future resolves
    found = admin.describe_acls(AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, "User:svc-agent", None, AclOperation.ANY,
        AclPermissionType.ANY)).result(30)
    assert {(b.name, b.operation.name, b.permission_type.name) for b in found} == {
        (f"{prefix}.events", "WRITE", "ALLOW"), (f"{prefix}.events", "DESCRIBE", "ALLOW"),
        (f"{prefix}.schemas", "WRITE", "ALLOW"), (f"{prefix}.schemas", "DESCRIBE", "ALLOW"),
        (f"{prefix}.schemas", "READ", "ALLOW"),
        (f"{prefix}.checkpoints", "WRITE", "ALLOW"), (f"{prefix}.checkpoints", "DESCRIBE", "ALLOW"),
        (f"{prefix}.payloads", "WRITE", "ALLOW"), (f"{prefix}.payloads", "READ", "ALLOW"),
        (f"{prefix}.payloads", "DESCRIBE", "ALLOW"),
        (f"{prefix}.streams", "WRITE", "ALLOW"), (f"{prefix}.streams", "READ", "ALLOW"),
        (f"{prefix}.streams", "DESCRIBE", "ALLOW"),
        (f"{prefix}.", "WRITE", "ALLOW"), (f"{prefix}.", "DESCRIBE", "ALLOW"),
        (f"{prefix}.recovery", "WRITE", "DENY"), (f"{prefix}.recovery", "DESCRIBE", "DENY")}
    refused = cli({**tenant.env("operator"), "RUNJOURNAL_TOPIC_PREFIX": prefix}, "acls", "create")
    assert refused.returncode == 1 and "run as the cluster's administrator" in refused.stderr.replace("\n", " ")

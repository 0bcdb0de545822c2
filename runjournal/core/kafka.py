"""The one place Kafka client configurations are built: producers, consumers and admin clients.

Every client runjournal creates — in the journal, the projector, the recovery job, the memory
extractor, erase, the demo, the bench and the local stack's readiness probe — gets its
configuration from :func:`client_config` (a test greps the tree for any other ``bootstrap.servers``).
What the builder adds to the caller's role-specific properties:

* ``bootstrap.servers`` from :class:`~runjournal.core.settings.Settings` (or an explicit bootstrap
  for the stack launcher, which runs before settings exist);
* security — ``security.protocol``, ``sasl.mechanism`` / ``sasl.username`` / ``sasl.password``,
  ``ssl.ca.location`` / ``ssl.certificate.location`` / ``ssl.key.location`` / ``ssl.key.password`` — from
  the ``RUNJOURNAL_KAFKA_*`` settings, and every pass-through librdkafka property
  (``RUNJOURNAL_KAFKA_PROPERTIES_FILE``, ``RUNJOURNAL_LIBRDKAFKA_*``; ``runjournal.core._kafka_props``);
* ``logger``: librdkafka's log lines go through Python logging (logger ``runjournal.kafka``), so no
  raw ``%N|timestamp|FAC|…`` line reaches a terminal; they are served by the client's
  ``poll``/``flush``/``consume`` calls and filtered by ``--log-level`` / ``RUNJOURNAL_LOG_LEVEL``;
* ``client.id`` when the caller names one.

Precedence: the builder's defaults < the caller's role-specific properties (``transactional.id``,
``isolation.level``, ``linger.ms`` …) < the settings' security and pass-through properties (the user's
explicit choice for their cluster). Pass-through cannot touch what correctness rests on (acks,
idempotence, transactions, isolation, groups, offsets): those keys are refused when settings load.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Literal

from runjournal.core.errors import ConfigError, StackUnavailableError
from runjournal.core.logs import RepeatFilter

if TYPE_CHECKING:  # pragma: no cover
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient

    from runjournal.core.settings import Settings

__all__ = ["ACCESS_HINTS", "KAFKA_LOGGER", "Role", "admin_client", "bootstrap_of", "check_access", "client_config",
           "consumer", "no_broker", "producer", "refused"]

#: The Python logger librdkafka's log lines are forwarded to; a repeated line passes once a minute, with its count
#: (``runjournal.core.logs.RepeatFilter``): a broker that stays away is one line, not one per reconnect.
KAFKA_LOGGER = "runjournal.kafka"
logging.getLogger(KAFKA_LOGGER).addFilter(RepeatFilter(window_s=60.0))

Role = Literal["producer", "consumer", "admin"]

#: librdkafka error → the settings that fix it (a refused login or TLS handshake never heals by waiting).
ACCESS_HINTS = {
    "_AUTHENTICATION": "the broker refused the credentials: check RUNJOURNAL_KAFKA_SASL_MECHANISM, "
                       "RUNJOURNAL_KAFKA_SASL_USERNAME and RUNJOURNAL_KAFKA_SASL_PASSWORD",
    "_SSL": "the TLS handshake failed: check RUNJOURNAL_KAFKA_SECURITY_PROTOCOL and RUNJOURNAL_KAFKA_SSL_CA_LOCATION "
            "(the CA that signed the brokers' certificates)",
    "_TRANSPORT": "no broker answered: check RUNJOURNAL_BOOTSTRAP, and RUNJOURNAL_KAFKA_SECURITY_PROTOCOL (a client "
                  "without TLS is cut off by a TLS listener)",
}


def client_config(settings: Settings | None, role: Role, *, bootstrap: str | None = None,
                  client_id: str | None = None, **props: Any) -> dict[str, Any]:
    """A librdkafka configuration dict for a client of ``role``.

    Args:
        settings: where the cluster is (``settings.bootstrap``) and how to authenticate to it (security and
            pass-through properties); None only with ``bootstrap`` (a plaintext probe).
        role: ``producer``, ``consumer`` or ``admin`` (selects which settings apply).
        bootstrap: overrides ``settings.bootstrap`` (the stack launcher's probe, before settings exist).
        client_id: ``client.id`` shown in broker logs and metrics (default: librdkafka's ``rdkafka``).
        **props: role-specific librdkafka properties, with dots replaced by underscores only where
            Python needs it — pass dotted names through ``**{"a.b": v}``. They override the builder's.

    Returns:
        A new dict, safe to mutate.

    Raises:
        ValueError: neither ``settings`` nor ``bootstrap`` given, or an unknown role.
    """
    if role not in ("producer", "consumer", "admin"):
        raise ValueError(f"unknown Kafka client role {role!r}")
    servers = bootstrap or (settings.bootstrap if settings is not None else None)
    if not servers:
        raise ValueError("client_config needs settings or an explicit bootstrap")
    config: dict[str, Any] = {"bootstrap.servers": servers, "logger": logging.getLogger(KAFKA_LOGGER)}
    if client_id:
        config["client.id"] = client_id
    config.update(props)
    if settings is not None:
        config.update(settings.kafka_security_config())
    return config


def producer(settings: Settings | None, *, client_id: str | None = None, bootstrap: str | None = None,
             **props: Any) -> Producer:
    """A ``confluent_kafka.Producer`` built from :func:`client_config` (role ``producer``)."""
    from confluent_kafka import Producer

    return Producer(client_config(settings, "producer", bootstrap=bootstrap, client_id=client_id, **props))


def consumer(settings: Settings | None, *, client_id: str | None = None, bootstrap: str | None = None,
             **props: Any) -> Consumer:
    """A ``confluent_kafka.Consumer`` built from :func:`client_config` (role ``consumer``).

    ``group.id`` is required by librdkafka: pass it in ``props`` (``**{"group.id": g}``).
    """
    from confluent_kafka import Consumer

    return Consumer(client_config(settings, "consumer", bootstrap=bootstrap, client_id=client_id, **props))


def admin_client(settings: Settings | None, *, client_id: str | None = None, bootstrap: str | None = None,
                 **props: Any) -> AdminClient:
    """A ``confluent_kafka.admin.AdminClient`` built from :func:`client_config` (role ``admin``)."""
    from confluent_kafka.admin import AdminClient

    return AdminClient(client_config(settings, "admin", bootstrap=bootstrap, client_id=client_id, **props))


def check_access(settings: Settings, *, timeout_s: float = 30.0) -> int:
    """Fail fast, naming the fix, when the cluster refuses these settings; return how many brokers answer.

    A wrong password or CA otherwise shows as a generic transport failure after the full timeout;
    here a refused login or handshake (seen through librdkafka's error callback) ends the wait at once.

    Args:
        settings: the client settings to try.
        timeout_s: how long to wait for any broker, seconds.

    Raises:
        ConfigError: authentication or TLS refused, or no broker answered within ``timeout_s`` (each with
            the settings to check, :data:`ACCESS_HINTS`).
    """
    from confluent_kafka import KafkaError, KafkaException

    seen: list[KafkaError] = []
    admin = admin_client(settings, error_cb=seen.append)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return len(admin.list_topics(timeout=min(2.0, max(0.1, deadline - time.monotonic()))).brokers)
        except KafkaException as exc:
            admin.poll(0.1)
            codes = [e.name() for e in seen] + [exc.args[0].name()]
            refused = next((c for c in ("_AUTHENTICATION", "_SSL") if c in codes), None)
            if refused or time.monotonic() >= deadline:
                code = refused or "_TRANSPORT"
                detail = next((e.str() for e in seen if e.name() == code), str(exc.args[0]))
                raise ConfigError(f"Kafka at {settings.bootstrap}: {detail} — {ACCESS_HINTS[code]}") from exc


def bootstrap_of(config: dict[str, Any]) -> str:
    """The bootstrap servers a client configuration (from :func:`client_config`) names."""
    return str(config.get("bootstrap.servers", ""))


def no_broker(bootstrap: str, timeout_s: float, cause: BaseException | None = None) -> StackUnavailableError:
    """The error of a metadata request no broker at ``bootstrap`` answered within ``timeout_s`` seconds (the commands'
    preflight and a starting ``Journal``): it names ``runjournal stack up`` and ``RUNJOURNAL_BOOTSTRAP``."""
    return StackUnavailableError(f"no Kafka broker answers at {bootstrap} within {timeout_s:.0f} s: start the local "
                                 "stack with `runjournal stack up` (or set RUNJOURNAL_BOOTSTRAP)", cause)


def refused(bootstrap: str, codes: list[str]) -> ConfigError | None:
    """A :class:`ConfigError` naming the settings to check when ``codes`` (librdkafka errors a client reported
    through its ``error_cb`` while it failed to connect) hold a refused login or TLS handshake; None otherwise (the
    broker is away: :func:`no_broker`)."""
    code = next((c for c in ("_AUTHENTICATION", "_SSL") if c in codes), None)
    return None if code is None else ConfigError(f"Kafka at {bootstrap} refused the connection ({code}): "
                                                 f"{ACCESS_HINTS[code]}")

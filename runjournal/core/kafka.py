"""The one place Kafka client configurations are built: producers, consumers and admin clients.

Every client runjournal creates — in the journal, the projector, the recovery job, the memory
extractor, erase, the demo, the bench and the local stack's readiness probe — gets its
configuration from :func:`client_config` (a test greps the tree for any other ``bootstrap.servers``).
What the builder adds to the caller's role-specific properties:

* ``bootstrap.servers`` from :class:`~runjournal.core.settings.Settings` (or an explicit bootstrap
  for the stack launcher, which runs before settings exist);
* ``logger``: librdkafka's log lines go through Python logging (logger ``runjournal.kafka``), so no
  raw ``%N|timestamp|FAC|…`` line reaches a terminal; they are served by the client's
  ``poll``/``flush``/``consume`` calls and filtered by ``--log-level`` / ``RUNJOURNAL_LOG_LEVEL``;
* ``client.id`` when the caller names one.

Caller properties win over the builder's (they are role-specific: ``transactional.id``,
``isolation.level`` …).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # pragma: no cover
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient

    from runjournal.core.settings import Settings

__all__ = ["KAFKA_LOGGER", "Role", "admin_client", "client_config", "consumer", "producer"]

#: The Python logger librdkafka's log lines are forwarded to.
KAFKA_LOGGER = "runjournal.kafka"

Role = Literal["producer", "consumer", "admin"]


def client_config(settings: Settings | None, role: Role, *, bootstrap: str | None = None,
                  client_id: str | None = None, **props: Any) -> dict[str, Any]:
    """A librdkafka configuration dict for a client of ``role``.

    Args:
        settings: where the cluster is (``settings.bootstrap``); None only with ``bootstrap``.
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

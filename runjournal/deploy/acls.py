"""Least privilege on Kafka: the ACLs each runjournal role needs, for one topic prefix.

The table is the documentation (docs/operations/cluster-and-least-privilege.md § Least privilege prints it through
``runjournal acls show``) and the configuration (``runjournal acls create`` and ``runjournal stack up --secure``
create exactly these bindings with Kafka's AdminClient, for any cluster with the standard authorizer). Roles and
what they do:

* ``agent`` — the Journal an agent embeds: transactional produce of every event to ``{prefix}.events``
  under ``transactional.id`` ``{prefix}.{producer_id}``, and of large tool results to ``{prefix}.payloads``,
  which it reads back (by offset, group-less) when a resumed run re-enters a recorded call, and of streamed
  partial output to ``{prefix}.streams`` (``run.stream()``, idempotent, not transactional); it reads no other
  topic. A DENY keeps it
  from using the recovery job's transactional id (it could otherwise fence the recovery job).
* ``projector`` — consumer group ``{prefix}.projector`` on the events topic; writes quarantined records
  to ``{prefix}.events.dlq``.
* ``recovery`` — fences dead instances (``init_transactions`` with *their* transactional ids, so every
  id under ``{prefix}.``), reads partition tails, publishes RUN_RESUMED under ``{prefix}.recovery``; reads large
  results on ``{prefix}.payloads``; restores an archived run for ``continue_run`` (its events and framework records,
  under ``{prefix}.unarchive-<run>``: decision 0058).
* ``memory`` — consumer group ``{prefix}.memory``; writes failures to ``{prefix}.memory.dlq``.
* ``operator`` — ``topics create/describe``, ``inspect``, ``replay``, ``erase`` (tombstones on the events,
  checkpoints and payloads topics), reading the DLQs. Not ACL administration: that stays with the cluster's
  administrator.
* ``archiver`` — consumer group ``{prefix}.archiver`` on the events topic (notes finished runs); reads a due run's
  records in the events, checkpoints and payloads topics (group-less, by partition) and, once its archive object is
  verified, writes their tombstones there (decision 0056). No transactional id, no topic creation.

Every role that encodes events (agent, recovery, operator tools) writes its writer schema to
``{prefix}.schemas`` before its first event; every reader (projector, recovery, memory, operator, archiver) reads
writer schemas there by fingerprint (``runjournal.schemas.catalog``). Only the operator creates topics.

Throw-away readers (recovery's tails, inspect, replay, erase) need no group ACL: they ``assign()``
partitions at explicit offsets and commit nothing, so the only group request librdkafka makes is a
FindCoordinator, whose GROUP_AUTHORIZATION_FAILED it ignores for such a consumer (seen with 2.16; the
secure-cluster tests run every role with exactly these grants).

Agents share one role, so an agent can fence another agent's transactional id (the same as a process
restarting with a reused producer_id); give agent fleets of different trust their own topic prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runjournal.core.settings import Settings

__all__ = ["ROLES", "Grant", "acl_bindings", "create_acls", "grants_for"]


@dataclass(frozen=True)
class Grant:
    """One ACL rule of a role, before the topic prefix and principal are filled in."""

    resource: str
    """``topic``, ``group``, ``transactional_id`` or ``cluster``."""
    name: str
    """Resource name template; ``{prefix}`` is the topic prefix."""
    pattern: str
    """``literal`` or ``prefixed``."""
    operations: tuple[str, ...]
    """Kafka ACL operations (``READ``, ``WRITE``, ``DESCRIBE``, ``CREATE``, ``DESCRIBE_CONFIGS`` …)."""
    why: str
    """What needs it (shown by ``runjournal acls show``)."""
    permission: str = "ALLOW"
    """``ALLOW`` or ``DENY`` (a DENY wins over every ALLOW)."""


_EVENTS, _DLQ, _MDLQ, _SCHEMAS = "{prefix}.events", "{prefix}.events.dlq", "{prefix}.memory.dlq", "{prefix}.schemas"
_PAYLOADS = "{prefix}.payloads"
_STREAMS = "{prefix}.streams"
# Every writer publishes its writer schema to {prefix}.schemas before its first event; every reader looks
# writer schemas up there (runjournal.schemas.catalog). The operator creates the topic (topics create).
_SCHEMAS_WRITE = Grant("topic", _SCHEMAS, "literal", ("WRITE", "DESCRIBE", "READ"),
                       "publish its writer schema before its first event (and read the catalog back)")
_SCHEMAS_READ = Grant("topic", _SCHEMAS, "literal", ("READ", "DESCRIBE"),
                      "find writer schemas by fingerprint (newer writers' records)")

ROLES: dict[str, tuple[Grant, ...]] = {
    "agent": (
        Grant("topic", _EVENTS, "literal", ("WRITE", "DESCRIBE"), "publish every event (transactional produce)"),
        _SCHEMAS_WRITE,
        Grant("topic", "{prefix}.checkpoints", "literal", ("WRITE", "DESCRIBE"),
              "framework adapters' records (LangGraph checkpoints, Agents SDK sessions) in the same transaction"),
        Grant("topic", _PAYLOADS, "literal", ("WRITE", "READ", "DESCRIBE"),
              "large tool results (transactional produce), read back when a resumed run re-enters a call"),
        Grant("topic", _STREAMS, "literal", ("WRITE", "READ", "DESCRIBE"),
              "streamed partial output (run.stream(), idempotent produce); a resumed run's gap record"),
        Grant("transactional_id", "{prefix}.", "prefixed", ("WRITE", "DESCRIBE"),
              "its transactional.id {prefix}.{producer_id}: init_transactions, commit"),
        Grant("transactional_id", "{prefix}.recovery", "literal", ("WRITE", "DESCRIBE"),
              "never the recovery job's transactional id (it could fence the recovery job)", "DENY"),
    ),
    "projector": (
        Grant("topic", _EVENTS, "literal", ("READ", "DESCRIBE"), "fold the journal"),
        _SCHEMAS_READ,
        Grant("group", "{prefix}.projector", "literal", ("READ", "DESCRIBE"), "its consumer group and commits"),
        Grant("topic", _DLQ, "literal", ("WRITE", "DESCRIBE"), "quarantine undecodable records with their offset"),
    ),
    "recovery": (
        Grant("topic", _EVENTS, "literal", ("READ", "WRITE", "DESCRIBE"),
              "read partition tails to the high watermark; publish RUN_RESUMED"),
        _SCHEMAS_WRITE,
        Grant("topic", _PAYLOADS, "literal", ("READ", "DESCRIBE"), "read large tool results (continue, fork)"),
        Grant("topic", "{prefix}.checkpoints", "literal", ("WRITE", "DESCRIBE"),
              "continue an archived run: re-publish its framework records (decision 0058)"),
        Grant("transactional_id", "{prefix}.", "prefixed", ("WRITE", "DESCRIBE"),
              "fence a dead instance (init_transactions with its id); its own {prefix}.recovery; "
              "{prefix}.unarchive-<run> restoring an archived run"),
    ),
    "memory": (
        Grant("topic", _EVENTS, "literal", ("READ", "DESCRIBE"), "extract memory from events"),
        _SCHEMAS_READ,
        Grant("group", "{prefix}.memory", "literal", ("READ", "DESCRIBE"), "its consumer group and commits"),
        Grant("topic", _MDLQ, "literal", ("WRITE", "DESCRIBE"), "dead-letter items Qdrant refused"),
    ),
    "operator": (
        Grant("topic", "{prefix}.", "prefixed", ("CREATE", "DESCRIBE", "DESCRIBE_CONFIGS", "READ"),
              "topics create/describe; inspect, replay and the DLQs"),
        Grant("topic", _EVENTS, "literal", ("WRITE",), "erase: tombstones"),
        Grant("topic", "{prefix}.checkpoints", "literal", ("WRITE",),
              "erase: tombstones of the run's framework records (LangGraph checkpoints, Agents SDK sessions)"),
        Grant("topic", _PAYLOADS, "literal", ("WRITE",), "erase: tombstones of the run's large results' records"),
        Grant("topic", _SCHEMAS, "literal", ("WRITE",), "tools that encode events (e.g. the demo's seeding)"),
    ),
    "archiver": (
        Grant("topic", _EVENTS, "literal", ("READ", "WRITE", "DESCRIBE"),
              "note finished runs; read a due run's events; tombstone them once archived"),
        _SCHEMAS_READ,
        Grant("topic", "{prefix}.checkpoints", "literal", ("READ", "WRITE", "DESCRIBE"),
              "a due run's framework records into its archive object; their tombstones"),
        Grant("topic", _PAYLOADS, "literal", ("READ", "WRITE", "DESCRIBE"),
              "a due run's large results' records into its archive object; their tombstones"),
        Grant("group", "{prefix}.archiver", "literal", ("READ", "DESCRIBE"), "its consumer group and commits"),
    ),
}
"""Role → its grants (see the module docstring)."""


def grants_for(role: str, prefix: str) -> list[dict[str, Any]]:
    """The grants of ``role`` for topic prefix ``prefix`` as plain dicts (``runjournal acls show --json``).

    Raises:
        KeyError: unknown role.
    """
    return [{"resource": g.resource, "name": g.name.format(prefix=prefix), "pattern": g.pattern,
             "operations": list(g.operations), "permission": g.permission, "why": g.why.format(prefix=prefix,
                                                                                              producer_id="{producer_id}")}
            for g in ROLES[role]]


def acl_bindings(role: str, prefix: str, principal: str) -> list[Any]:
    """``confluent_kafka.admin.AclBinding`` objects for ``role`` granted to ``principal`` (``User:name``)."""
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    kinds = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP,
             "transactional_id": ResourceType.TRANSACTIONAL_ID, "cluster": ResourceType.BROKER}
    out = []
    for g in ROLES[role]:
        name = "kafka-cluster" if g.resource == "cluster" else g.name.format(prefix=prefix)
        for op in g.operations:
            out.append(AclBinding(kinds[g.resource], name, ResourcePatternType[g.pattern.upper()], principal, "*",
                                  AclOperation[op], AclPermissionType[g.permission]))
    return out


def create_acls(settings: Settings, principals: dict[str, str], *, prefix: str | None = None,
                timeout_s: float = 30.0) -> int:
    """Create every role's ACLs for ``prefix`` (default ``settings.topic_prefix``); idempotent.

    Args:
        settings: a principal allowed to alter ACLs (the cluster's administrator).
        principals: role → principal, e.g. ``{"agent": "User:svc-agent"}``; roles not named are skipped.
        prefix: topic prefix the grants are for.
        timeout_s: admin request timeout, seconds.

    Returns:
        The number of ACL bindings created (existing identical ones count too: Kafka dedupes them).

    Raises:
        KeyError: an unknown role.
        confluent_kafka.KafkaException: the broker refused (e.g. the principal may not alter ACLs).
    """
    from runjournal.core import kafka

    bindings = [b for role, principal in principals.items()
                for b in acl_bindings(role, prefix or settings.topic_prefix, principal)]
    if not bindings:
        return 0
    admin = kafka.admin_client(settings)
    for fut in admin.create_acls(bindings, request_timeout=timeout_s).values():
        fut.result()
    return len(bindings)

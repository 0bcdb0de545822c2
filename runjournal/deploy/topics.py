"""Create and check runjournal's topics through Kafka's AdminClient (idempotent).

``{prefix}.events`` — the journal — is compacted. Its keys are unique per event
(``{run_id}:{epoch}:{seq}``), so compaction only removes a retried duplicate of the same
key and the records of an erased (tombstoned) run; all other history is kept forever.
Choices, each a topic-level config:

* ``cleanup.policy=compact`` — history kept forever except erasures and duplicates.
* ``min.compaction.lag.ms=3600000`` (1 h) — the newest hour is never compacted, so a
  projector or recovery job reading the tail sees the log exactly as written.
* ``delete.retention.ms=604800000`` (7 d) — a tombstone stays readable a week: a projector
  down for less than that still sees the erase and deletes the run's Redis state; after a
  longer outage, rebuild (``runjournal projector --rebuild``).
* ``segment.ms=86400000`` (1 d) — the active segment is never cleaned; rolling daily lets an
  erasure actually remove bytes within about a day instead of at the 1 GiB segment size.

Replication (every topic, DLQs included — a dead letter is a quarantined event):

* the replication factor is ``settings.replication_factor`` (``RUNJOURNAL_REPLICATION_FACTOR``, default 3;
  the local stack's state supplies its broker count), never guessed from how many brokers answer now (a
  broker that is down at creation time would silently cost a replica forever);
* ``min.insync.replicas`` is 2 when replicated (1 only at replication 1, the development stack). With
  ``acks=all`` an acknowledged event is then on at least two brokers, so losing any one broker never
  drops it;
* an existing topic is refused when it could drop acknowledged events on a single broker loss:
  replicated with ``min.insync.replicas`` < 2, fewer replicas than the settings ask for, a
  ``min.insync.replicas`` above its replication (no write could ever be acknowledged), or
  ``unclean.leader.election.enable=true`` (an out-of-sync replica may become leader).

Dead-letter topics keep everything (``retention.ms=-1``): a quarantined event is never lost.
``{prefix}.schemas`` (writer schemas by fingerprint, :mod:`runjournal.schemas.catalog`) is compacted,
one partition; writers create it themselves when missing.
``{prefix}.streams`` (runs' streamed partial output, ``run.stream()``) is ``cleanup.policy=delete`` with
``retention.ms`` = ``settings.streams_retention_ms`` (``RUNJOURNAL_STREAMS_RETENTION_MS``, default 24 h), as many
partitions as the events topic (a run's stream is on its run's partition); decision 0055.
The partition count is fixed at creation: the run-to-partition mapping (murmur2 of run_id
mod count) depends on it, so an existing events topic with another count is refused.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.deploy.errors import TopicConfigError
from runjournal.schemas.catalog import SCHEMAS_TOPIC_CONFIG

__all__ = ["EVENTS_TOPIC_CONFIG", "TopicReport", "check_durability", "create_topics", "describe_topics"]

EVENTS_TOPIC_CONFIG: dict[str, str] = {
    "cleanup.policy": "compact",
    "min.compaction.lag.ms": "3600000",
    "delete.retention.ms": "604800000",
    "segment.ms": "86400000",
}
DLQ_TOPIC_CONFIG: dict[str, str] = {"cleanup.policy": "delete", "retention.ms": "-1"}
CHECKPOINTS_TOPIC_CONFIG: dict[str, str] = {"cleanup.policy": "compact"}  # runjournal.adapters: latest per key
PAYLOADS_TOPIC_CONFIG: dict[str, str] = {"cleanup.policy": "compact"}  # large results: one key per record, forever
STREAMS_TOPIC_CONFIG: dict[str, str] = {"cleanup.policy": "delete"}  # partial output; retention.ms from the settings


@dataclass(frozen=True)
class TopicReport:
    """What ``create_topics`` found or did for one topic."""

    name: str
    """Topic name."""
    action: str
    """``"created"`` or ``"exists"``."""
    partitions: int
    """Partition count."""
    replication_factor: int
    """Replicas per partition (of partition 0)."""
    config: dict[str, str]
    """The topic's effective value of each config runjournal sets."""
    topic_id: str | None = None
    """Kafka's topic id: a topic deleted and created again under the same name gets a new one (a projector
    checks it against the id its projection was built from: ``runjournal.consumers.runtime.topic_identity``)."""


def _admin(settings: Settings) -> Any:

    return kafka.admin_client(settings)


def create_topics(settings: Settings, partitions: int | None = None, *, timeout_s: float = 30.0) -> list[TopicReport]:
    """Create the events topic, both DLQs and the writer-schema topic unless present; verify the events topic.

    Args:
        settings: bootstrap servers and topic prefix.
        partitions: events topic partition count (default ``settings.partitions``).
        timeout_s: admin request timeout, seconds.

    Raises:
        ConfigError: the cluster refused these settings' credentials or TLS, or never answered (fix named).
        TopicConfigError: fewer brokers answer than the replication factor needs; a topic exists that could
            drop acknowledged events (:func:`check_durability`); the events topic exists with another
            partition count or a cleanup policy other than ``compact``.
        confluent_kafka.KafkaException: the broker refused or could not be reached.
    """
    from confluent_kafka.admin import NewTopic

    count = partitions or settings.partitions
    kafka.check_access(settings, timeout_s=timeout_s)
    admin = _admin(settings)
    meta = admin.list_topics(timeout=timeout_s)
    rf = settings.replication_factor
    if rf > len(meta.brokers):
        raise TopicConfigError(
            f"replication factor {rf} (RUNJOURNAL_REPLICATION_FACTOR) needs {rf} brokers, but {len(meta.brokers)} "
            "answer. Start the missing brokers; a single-broker development cluster takes "
            "RUNJOURNAL_REPLICATION_FACTOR=1.")
    isr = {"min.insync.replicas": str(min(2, rf))}
    wanted = {
        settings.events_topic: (count, {**EVENTS_TOPIC_CONFIG, **isr}),
        settings.events_dlq_topic: (1, {**DLQ_TOPIC_CONFIG, **isr}),
        settings.memory_dlq_topic: (1, {**DLQ_TOPIC_CONFIG, **isr}),
        settings.schemas_topic: (1, {**SCHEMAS_TOPIC_CONFIG, **isr}),
        # the framework adapters' records (runjournal.adapters): compacted, keyed like the events
        settings.checkpoints_topic: (count, {**CHECKPOINTS_TOPIC_CONFIG, **isr}),
        # large tool results (runjournal.producers.results): compacted, on the run's partition like its events
        settings.payloads_topic: (count, {**PAYLOADS_TOPIC_CONFIG, **isr}),
        # streamed partial output (runjournal.producers.streams): deleted after its own retention, on the run's
        # partition like its events; never read by recovery or the projector
        settings.streams_topic: (count, {**STREAMS_TOPIC_CONFIG, "retention.ms": str(settings.streams_retention_ms),
                                         **isr}),
    }
    missing = [NewTopic(name, num_partitions=n, replication_factor=rf, config=cfg)
               for name, (n, cfg) in wanted.items() if name not in meta.topics]
    created = set()
    for name, fut in (admin.create_topics(missing, request_timeout=timeout_s) if missing else {}).items():
        try:
            fut.result()
            created.add(name)
        except Exception as exc:  # TOPIC_ALREADY_EXISTS from a concurrent creator is fine
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    if created:
        _await_metadata(admin, created, timeout_s)
    reports = _settled(settings, {n: (p, rf) for n, (p, _c) in wanted.items() if n in created}, list(wanted), timeout_s)
    for rep in reports:
        object.__setattr__(rep, "action", "created" if rep.name in created else "exists")
        check_durability(rep, rf)
    _check_events_topic(next(r for r in reports if r.name == settings.events_topic), count)
    return reports


def _settled(settings: Settings, created: dict[str, tuple[int, int]], names: list[str],
             timeout_s: float) -> list[TopicReport]:
    """:func:`describe_topics`, again until the topics just created show their partitions and replicas: on a
    multi-broker cluster the answering broker may not have the new topic's full metadata yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        reports = describe_topics(settings, names, timeout_s=timeout_s)
        pending = [r.name for r in reports if r.name in created and
                   ((r.partitions, r.replication_factor) != created[r.name] or "min.insync.replicas" not in r.config)]
        if not pending or time.monotonic() > deadline:
            return reports
        time.sleep(0.2)


def check_durability(report: TopicReport, replication_factor: int) -> None:
    """Refuse a topic that could drop acknowledged (``acks=all``) events when one broker is lost.

    Args:
        report: the topic as :func:`describe_topics` found it.
        replication_factor: what the settings ask for.

    Raises:
        TopicConfigError: see the module docstring (replication rules); the message names the fix.
    """
    rf, isr = report.replication_factor, int(report.config.get("min.insync.replicas", "1"))
    fix = ("fix it with kafka-configs (min.insync.replicas=2, unclean.leader.election.enable=false) or "
           "kafka-reassign-partitions, or use another RUNJOURNAL_TOPIC_PREFIX")
    if rf < replication_factor:
        raise TopicConfigError(f"topic {report.name} has {rf} replica(s), the settings ask for "
                               f"{replication_factor} (RUNJOURNAL_REPLICATION_FACTOR): losing a broker could drop "
                               f"acknowledged events; {fix}")
    if rf >= 2 and isr < 2:
        raise TopicConfigError(f"topic {report.name} is replicated {rf}x but min.insync.replicas={isr}: an acks=all "
                               f"write may be acknowledged by the leader alone, and losing it drops the event; {fix}")
    if isr > rf:
        raise TopicConfigError(f"topic {report.name} has min.insync.replicas={isr} above its {rf} replica(s): no "
                               f"write can be acknowledged; {fix}")
    if report.config.get("unclean.leader.election.enable") == "true":
        raise TopicConfigError(f"topic {report.name} allows unclean leader election: an out-of-sync replica may "
                               f"become leader and drop acknowledged events; {fix}")


def _await_metadata(admin: Any, names: set[str], timeout_s: float) -> None:
    """Wait until the metadata shows each created topic with a leader for every partition.

    A successful CreateTopics answer comes from the controller; the broker answering the next
    metadata request may not know the topic yet (seen under load: a fresh topic reported with 0
    partitions), and checking it then would refuse a topic that is fine.

    Raises:
        TopicConfigError: the topics did not appear within ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        meta = admin.list_topics(timeout=max(1.0, deadline - time.monotonic()))
        pending = sorted(n for n in names if n not in meta.topics or not meta.topics[n].partitions
                         or any(p.leader < 0 for p in meta.topics[n].partitions.values()))
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TopicConfigError(f"created topics {pending} have no leader in the metadata after {timeout_s} s")
        time.sleep(0.1)


def _check_events_topic(report: TopicReport, count: int) -> None:
    if report.partitions != count:
        raise TopicConfigError(
            f"topic {report.name} exists with {report.partitions} partitions, not {count}. The run-to-partition "
            "mapping depends on the count, so runjournal will not use it: pass --partitions "
            f"{report.partitions} (or RUNJOURNAL_PARTITIONS={report.partitions}), "
            "or use another RUNJOURNAL_TOPIC_PREFIX."
        )
    if report.config.get("cleanup.policy") != "compact":
        raise TopicConfigError(
            f"topic {report.name} exists with cleanup.policy={report.config.get('cleanup.policy')}, not compact: "
            "the journal must keep history forever. Recreate it or use another RUNJOURNAL_TOPIC_PREFIX."
        )


def describe_topics(
    settings: Settings, names: list[str] | None = None, *, timeout_s: float = 30.0
) -> list[TopicReport]:
    """Partition count, topic id and runjournal-relevant configs of each topic (default: runjournal's four).

    Raises:
        confluent_kafka.KafkaException: a topic does not exist or the broker is unreachable.
    """
    from confluent_kafka import KafkaError, KafkaException, TopicCollection
    from confluent_kafka.admin import ConfigResource, ResourceType

    names = names or list(settings.all_topics)
    admin = _admin(settings)
    meta = admin.list_topics(timeout=timeout_s)
    keys = set(EVENTS_TOPIC_CONFIG) | set(DLQ_TOPIC_CONFIG) | {"min.insync.replicas", "unclean.leader.election.enable"}
    resources = [ConfigResource(ResourceType.TOPIC, n) for n in names if n in meta.topics]
    configs: dict[str, dict[str, str]] = {}
    for res, fut in (admin.describe_configs(resources, request_timeout=timeout_s) if resources else {}).items():
        try:
            configs[res.name] = {k: v.value for k, v in fut.result().items() if k in keys}
        except KafkaException as exc:  # a broker that has not heard of a just-created topic yet
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
    present = [n for n in names if n in meta.topics]
    ids = {n: str(f.result().topic_id) for n, f in
           (admin.describe_topics(TopicCollection(present), request_timeout=timeout_s) if present else {}).items()}
    out = []
    for name in names:
        if name not in meta.topics:
            out.append(TopicReport(name=name, action="missing", partitions=0, replication_factor=0, config={}))
        else:
            parts = meta.topics[name].partitions
            out.append(TopicReport(name=name, action="exists", partitions=len(parts),
                                   replication_factor=len(parts[min(parts)].replicas) if parts else 0,
                                   config=configs.get(name, {}), topic_id=ids.get(name)))
    return out

"""What a consumer stored about the events topic, checked against the topic before it is used.

The projection in Redis holds, per partition, the last applied offset; those offsets mean something
only for the topic they were read from. A topic deleted and created again under the same name starts
at offset 0 with a new topic id: a projector trusting its stored offsets would seek past the new
records and report "caught up" with nothing projected (issue 14, case 5). So before any stored
offset is used (projector start, each assignment, each recovery pass):

* the topic must exist (:class:`~runjournal.producers.errors.TopicNotFoundError`: ``runjournal topics create``);
* the stored identity ``rj:<prefix>:topic`` (``{"topic_id", "partitions"}``, written on first use)
  must name the same topic id and partition count;
* every stored applied offset must lie inside the partition's log (``offset < high watermark``)
  and name a partition that exists.

A mismatch is :class:`TopicMismatchError`, whose message names the repair
(``runjournal projector --rebuild``): never a silent skip, never a wrong partition.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import redis
from confluent_kafka import KafkaError, KafkaException, TopicCollection

from runjournal.consumers.runtime.partitions import watermarks
from runjournal.core import kafka, redis_client
from runjournal.core.errors import RunjournalError, StackUnavailableError
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.producers.errors import PARTITIONS_REPAIR, TopicNotFoundError

__all__ = ["REBUILD", "StackUnavailableError", "TopicMismatchError", "TopicShape", "check_projection",
           "check_rebuild", "check_topic", "describe_events_topic", "identity_key", "preflight",
           "stored_partition_count"]

#: The repair of a projection that does not belong to the topic.
REBUILD = "runjournal projector --rebuild"


class TopicMismatchError(RunjournalError):
    """What a consumer stored about the topic (identity, partition count, offsets) does not fit the topic.

    Attributes:
        repair: the command that fixes it.
    """

    def __init__(self, message: str, *, repair: str = REBUILD) -> None:
        self.repair = repair
        super().__init__(f"{message}; repair: `{repair}`")


@dataclass(frozen=True)
class TopicShape:
    """The events topic as the broker describes it now."""

    topic: str
    """Topic name."""
    topic_id: str
    """Kafka's topic id (a new one each time the topic is created)."""
    partitions: int
    """Partition count."""
    ranges: Mapping[int, tuple[int, int]]
    """partition -> (log start offset, high watermark)."""


def identity_key(prefix: str) -> str:
    """``rj:<prefix>:topic``: the topic identity the projection of ``prefix`` was built from."""
    return RedisKeys(prefix).topic_identity()


def describe_events_topic(settings: Settings, *, timeout_s: float = 5.0) -> TopicShape:
    """Topic id, partition count and log range of every partition of ``settings.events_topic``.

    Raises:
        TopicNotFoundError: the topic does not exist (message: ``runjournal topics create``).
        KafkaException: the broker did not answer within ``timeout_s`` seconds.
    """
    admin = kafka.admin_client(settings)
    future = admin.describe_topics(TopicCollection([settings.events_topic]), request_timeout=timeout_s)
    try:
        desc = future[settings.events_topic].result()
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                                          KafkaError._UNKNOWN_TOPIC):  # noqa: SLF001
            raise TopicNotFoundError(f"topic {settings.events_topic} does not exist at {settings.bootstrap}: "
                                     "create it with `runjournal topics create`") from exc
        raise
    n = len(desc.partitions)
    return TopicShape(settings.events_topic, str(desc.topic_id), n,
                      watermarks(settings, range(n), timeout_s=timeout_s))


def check_projection(client: redis.Redis, prefix: str, shape: TopicShape, applied: Mapping[int, int], *,
                     adopt: bool) -> None:
    """Check the stored identity and the applied offsets of ``prefix``'s projection against ``shape``.

    Args:
        client: Redis.
        prefix: the topic prefix.
        shape: :func:`describe_events_topic`.
        applied: partition -> stored applied offset (-1: none) — only partitions with one are checked.
        adopt: store ``shape``'s identity when none is stored (the projector and the recovery job: whichever
            runs first records the count the journal was created with). A user whose Redis ACL makes the key
            read-only (an operator's recovery pass: docs/operations/cluster-and-least-privilege.md) checks only:
            the next projector or recovery job stores it.

    Raises:
        TopicMismatchError: another topic id or partition count, or an offset outside the partition's log.
    """
    raw = client.get(identity_key(prefix))
    stored = json.loads(raw) if raw else None
    if stored is not None and stored.get("topic_id") != shape.topic_id:
        raise TopicMismatchError(
            f"topic {shape.topic} was deleted and created again (topic id {stored.get('topic_id')} → "
            f"{shape.topic_id}): the projection of prefix {prefix} in Redis describes the old topic")
    if stored is not None and stored.get("partitions") != shape.partitions:
        raise TopicMismatchError(
            f"topic {shape.topic} has {shape.partitions} partitions but the journal was created with "
            f"{stored.get('partitions')}: the run-to-partition mapping changed",
            repair=PARTITIONS_REPAIR.format(expected=stored.get("partitions")))
    for p, offset in sorted(applied.items()):
        if offset < 0:
            continue
        if p not in shape.ranges:
            raise TopicMismatchError(f"the projection holds an applied offset for partition {p}, but topic "
                                     f"{shape.topic} has {shape.partitions} partitions")
        low, high = shape.ranges[p]
        if offset >= high:
            raise TopicMismatchError(
                f"the projection says partition {p} of {shape.topic} was applied up to offset {offset}, but the "
                f"partition ends at {high} (log {low}..{high}): the topic was re-created or truncated")
    if stored is None and adopt:
        try:
            client.set(identity_key(prefix), json.dumps({"topic_id": shape.topic_id, "partitions": shape.partitions}))
        except redis.exceptions.NoPermissionError:
            pass  # a read-only user of the key: checked; a projector or the recovery job stores it


def check_topic(settings: Settings, client: redis.Redis, prefix: str, read_applied: Callable[[int], dict[int, int]],
                *, adopt: bool, call: Callable[[str, Callable[[], Any]], Any] | None = None) -> TopicShape:
    """Describe the events topic and check the projection of ``prefix`` against it (:func:`check_projection`), the
    applied offsets read *before* the log ends they are checked against: a projector applying meanwhile (another
    member of the group, a caught-up one) only moves the ends further, so an offset read first can never pass an end
    read after it — read the other way round, a busy partition looked truncated (a false ``TopicMismatchError``
    telling the operator to rebuild).

    Args:
        read_applied: partition count → partition → stored applied offset (-1: none).
        call: runs each read (``FailurePolicy.call``: what, function); default: directly.

    Returns:
        The topic as described after the offsets were read.

    Raises:
        As :func:`describe_events_topic` and :func:`check_projection`.
    """
    run = call or (lambda _what, fn: fn())
    first = run("describe topic", lambda: describe_events_topic(settings))
    applied = run("read offsets", lambda: read_applied(first.partitions))
    shape: TopicShape = run("describe topic", lambda: describe_events_topic(settings))  # the ends, after the offsets
    check_projection(client, prefix, shape, applied, adopt=adopt)
    return shape


def check_rebuild(client: redis.Redis, prefix: str, shape: TopicShape) -> None:
    """Refuse ``projector --rebuild`` when it cannot repair the mismatch: the same topic (same topic id) with
    another partition count. A rebuild re-reads the topic, but the runs it holds stay placed by the old count.

    Raises:
        TopicMismatchError: the partition count of the same topic changed (the repair names a new prefix).
    """
    raw = client.get(identity_key(prefix))
    stored = json.loads(raw) if raw else None
    if stored is not None and stored.get("topic_id") == shape.topic_id and stored.get("partitions") != shape.partitions:
        raise TopicMismatchError(
            f"topic {shape.topic} has {shape.partitions} partitions but the journal was created with "
            f"{stored.get('partitions')}; a rebuild would look for existing runs in the wrong partitions",
            repair=PARTITIONS_REPAIR.format(expected=stored.get("partitions")))


def stored_partition_count(client: redis.Redis, prefix: str) -> int | None:
    """The partition count the journal of ``prefix`` was created with (the stored topic identity), or None when
    none is stored yet."""
    raw = client.get(identity_key(prefix))
    if not raw:
        return None
    try:
        return int(json.loads(raw)["partitions"])
    except (ValueError, KeyError, TypeError):
        return None


def preflight(settings: Settings, *, need_topic: bool = True, need_redis: bool = True, timeout_s: float = 3.0) -> None:
    """Fail fast (well within 5 s) when the stack or the events topic is missing, naming the fix.

    Raises:
        StackUnavailableError: no broker at ``settings.bootstrap`` or no Redis at ``settings.redis_url``
            within ``timeout_s`` seconds (``runjournal stack up``; ``runjournal.core.kafka.no_broker``,
            ``runjournal.core.redis_client.probe``).
        ConfigError: the broker or Redis refused the credentials or the TLS handshake (the settings to check named).
        TopicNotFoundError: ``need_topic`` and the events topic does not exist (``runjournal topics create``).
    """
    seen: list[str] = []
    admin = kafka.admin_client(settings, **{"socket.connection.setup.timeout.ms": int(timeout_s * 1000),
                                            "error_cb": lambda err: seen.append(err.name())})
    try:
        meta = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        admin.poll(0.1)  # serve the error callbacks: a refused login or TLS handshake is not a missing stack
        refusal = kafka.refused(settings.bootstrap, seen)
        if refusal is not None:
            raise refusal from exc
        raise kafka.no_broker(settings.bootstrap, timeout_s, exc) from None
    if need_redis:
        redis_client.probe(settings, timeout_s=timeout_s)  # a refused login or TLS: ConfigError
    if need_topic and settings.events_topic not in meta.topics:
        raise TopicNotFoundError(f"topic {settings.events_topic} does not exist at {settings.bootstrap}: create it "
                                 "with `runjournal topics create` (or check RUNJOURNAL_TOPIC_PREFIX)")

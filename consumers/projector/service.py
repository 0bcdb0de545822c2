"""The state projector: a consumer-group service folding the journal into Redis, exactly once in effect.

Per poll (DESIGN.md § Projector; numbered as in the code):

1. ``consume`` up to ``batch_size`` records (``read_committed``: aborted transactions are never seen).
2. Split by partition; drop records at or below the partition's applied offset (redelivery).
3. Decode. A tombstone (null value) erases its run. An undecodable record is copied to the
   events DLQ with its offset and its run (parsed from the key) is marked BLOCKED; the
   partition's other runs go on. A registry that cannot be reached is not a bad record: the
   batch waits (step 8).
4. Take the touched runs' states from the in-memory cache when it is valid at the partition's
   applied offset (``runjournal.consumers.projector._cache``), the others from Redis (one MGET), and fold
   each event with the pure reducer (``runjournal.model.reducer.apply``).
5. Flush the DLQ (durable before the offset passes the record).
6. One script call writes every changed state and advances the partition's applied offset,
   atomically, refusing a batch folded from a stale view (then: reload and re-seek).
7. Commit the group offset (last handled + 1), asynchronously — for lag monitoring and tools;
   on (re)assignment the projector seeks to the offset stored in Redis, not the group's.
8. Failures go through the one failure policy (``runjournal.consumers.failures``): a transient one
   (registry, Redis, broker) waits with capped backoff and folds the same batch again — nothing was
   written, so nothing moves; a fatal one (fenced static member, unauthorised, topic gone) stops the
   projector with :class:`~runjournal.consumers.failures.FatalDependencyError`.

Before any stored offset is used, the topic is checked against what the projection stored about it
(``runjournal.consumers.topic_identity``): a re-created topic or another partition count stops the
projector with :class:`~runjournal.consumers.topic_identity.TopicMismatchError` naming the repair.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict

import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from runjournal.consumers._group import LagExport, commit_pending, partition_lags
from runjournal.consumers.dlq import DeadLetters
from runjournal.consumers.failures import (
    TRANSIENT,
    FailurePolicy,
    FatalDependencyError,
    classify,
    kafka_error_verdict,
    stops_consumer,
)
from runjournal.consumers.projector._cache import StateCache
from runjournal.consumers.projector._decode import Decoded, decode_batch
from runjournal.consumers.projector.metrics import ProjectorMetrics, count_outcomes
from runjournal.consumers.projector.stats import ProjectorStats
from runjournal.consumers.projector.store import ProjectionStore
from runjournal.consumers.topic_identity import TopicMismatchError, check_projection, describe_events_topic
from runjournal.core import failpoints, kafka, redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.model.reducer import RunState, RunStatus, apply, block
from runjournal.schemas import EventCodec, codec_from_settings
from runjournal.schemas.errors import SchemaError
from runjournal.schemas.events import Event

__all__ = ["Projector", "ProjectorStats", "projector_group"]

log = logging.getLogger("runjournal.consumers.projector")


def projector_group(settings: Settings) -> str:
    """The projector's consumer group id: ``{prefix}.projector``."""
    return f"{settings.topic_prefix}.projector"


class Projector:
    """Folds ``{prefix}.events`` into Redis run states; one instance per process, many per group.

    Args:
        settings: bootstrap, Redis URL, topic prefix.
        batch_size: records per consume call (default 2,000).
        poll_timeout_s: consume timeout, seconds.
        codec: event codec (default from settings).
        metrics: Prometheus metrics holder (default: a private one).
        group_id: consumer group (default ``{prefix}.projector``).
        session_timeout_ms: how long a dead member holds its partitions before the group moves
            them (ms). 10 s instead of Kafka's 45 s default: a SIGKILLed projector's runs stall
            for at most that long.
        group_instance_id: static group membership (KIP-345): a restarted projector with the same id
            takes its partitions back at once instead of waiting out the session timeout.
        state_cache_runs: run states kept in memory between batches (default 10,000; 0 disables),
            used only while the partition's applied offset in Redis is the one they were written at
            (``runjournal.consumers.projector._cache``). Saves the per-batch MGET and JSON parse of each run.
        max_outage_s: longest one dependency outage is waited out before the projector stops (s, 240).
    """

    def __init__(self, settings: Settings, *, batch_size: int = 2000, poll_timeout_s: float = 0.2,
                 codec: EventCodec | None = None, metrics: ProjectorMetrics | None = None,
                 group_id: str | None = None, session_timeout_ms: int = 10_000,
                 group_instance_id: str | None = None, state_cache_runs: int = 10_000,
                 max_outage_s: float = 240.0) -> None:
        self.settings = settings
        self._critical = settings.critical_types  # parsed once, not per event
        self.topic = settings.events_topic
        self.batch_size = batch_size
        self.poll_timeout_s = poll_timeout_s
        self.codec = codec or codec_from_settings(settings)
        self.metrics = metrics or ProjectorMetrics()
        # A blip is absorbed by redis-py's own quick retry; a longer outage by the failure policy (step 8),
        # visibly: the batch that failed was not written, so it is simply folded and written again.
        self.redis = redis_client.client(
            settings,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), retries=3),
            retry_on_error=[redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError],
        )
        self._stop = threading.Event()
        self.policy = FailurePolicy("projector", log, registry=self.metrics.registry, max_wait_s=max_outage_s,
                                    stop=self._stop)
        self._fatal: KafkaError | None = None
        self._quarantined: set[tuple[int, int]] = set()
        self._mismatch: TopicMismatchError | None = None
        self.store = ProjectionStore(self.redis, settings.topic_prefix)
        self.lag_key = RedisKeys(settings.topic_prefix).projector_lag()
        """Redis list of the last 10,000 per-poll lag samples ``"<unix ms>:<lag ms>"``, newest first."""
        self.dlq = DeadLetters(settings, settings.events_dlq_topic)
        self.group_id = group_id or projector_group(settings)
        self.applied: dict[int, int] = {}
        self.cache = StateCache(state_cache_runs)
        self._pending_commit: dict[int, int] = {}
        self._assigned_once = threading.Event()
        self._lag_export = LagExport(self.metrics.lag)
        self.stats = ProjectorStats()
        self.consumer = kafka.consumer(settings, **{"group.id": self.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": session_timeout_ms,
            **({"group.instance.id": group_instance_id} if group_instance_id else {}),
            "heartbeat.interval.ms": max(1000, session_timeout_ms // 4),
            "fetch.min.bytes": 1,
            "queued.max.messages.kbytes": 65536,
            "error_cb": self._on_error,
        })

    def _on_error(self, err: KafkaError) -> None:
        """librdkafka's error callback: fatal ones (a fenced static member …) stop the main loop."""
        verdict = kafka_error_verdict(err)
        if stops_consumer(err):
            self._fatal = err
            log.error("fatal consumer error", extra={"error": verdict.cause})
        else:
            log.warning("consumer error", extra={"error": verdict.cause})

    # -- assignment -------------------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        applied = {tp.partition: self.store.applied_offset(tp.partition) for tp in partitions}
        for p, offset in applied.items():  # a stored offset must lie in the log it was read from (topic_identity)
            _low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10, cached=False)
            if offset >= high:
                self._mismatch = TopicMismatchError(
                    f"the projection says partition {p} of {self.topic} was applied up to offset {offset}, but the "
                    f"partition ends at {high}: the topic was re-created or truncated")
                return  # nothing assigned: the main loop stops on the mismatch
        for tp in partitions:
            stored = applied[tp.partition]
            self.applied[tp.partition] = stored
            self.cache.drop(tp.partition)
            tp.offset = stored + 1 if stored >= 0 else OFFSET_BEGINNING
        consumer.incremental_assign(partitions)
        self._assigned_once.set()
        log.info("assigned", extra={"partitions": {tp.partition: tp.offset for tp in partitions}})

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Batches are processed to completion before the next consume() call, in which this
        # callback runs, so nothing is in flight: record the revoked partitions' offsets and go.
        self._commit({tp.partition for tp in partitions}, asynchronous=False)
        for tp in partitions:
            self.applied.pop(tp.partition, None)
            self.cache.drop(tp.partition)
        consumer.incremental_unassign(partitions)
        log.info("revoked", extra={"partitions": [tp.partition for tp in partitions]})

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.applied.pop(tp.partition, None)
            self._pending_commit.pop(tp.partition, None)
            self.cache.drop(tp.partition)
        consumer.incremental_unassign(partitions)
        log.warning("partitions lost", extra={"partitions": [tp.partition for tp in partitions]})

    # -- main loop ------------------------------------------------------------------------------
    def run(self, *, until_caught_up: bool = False, stop: threading.Event | None = None,
            idle_timeout_s: float | None = None) -> ProjectorStats:
        """Consume until ``stop`` is set (or, with ``until_caught_up``, until lag is 0 on every assigned partition).

        Returns:
            :class:`ProjectorStats` of this run.

        Raises:
            TopicNotFoundError: the events topic does not exist (``runjournal topics create``).
            TopicMismatchError: the projection in Redis was built from another topic (re-created, other
                partition count, offsets beyond its end); the message names the repair.
            FatalDependencyError: fenced (e.g. another member with the same ``group_instance_id``),
                unauthorised, or any error librdkafka marks fatal.
            DependencyUnavailableError: a dependency stayed away longer than ``max_outage_s``.
        """
        stop = stop or threading.Event()
        self._stop = self.policy.stop = stop
        started = time.monotonic()
        last_data = time.monotonic()
        try:
            self._check_topic()  # before any stored offset is used
            self.consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                    on_lost=self._on_lost)
            while not stop.is_set():
                msgs = self.consumer.consume(self.batch_size, timeout=self.poll_timeout_s)  # step 1
                self._raise_if_fatal()
                if msgs:
                    last_data = time.monotonic()
                    try:
                        self._handle(msgs)
                    except Exception as exc:
                        if stop.is_set() and classify(exc).kind == TRANSIENT:
                            break  # stopped while waiting out an outage: this batch is not committed
                        raise
                    self._record_lag(msgs)
                    self._commit(set(self._pending_commit), asynchronous=True)  # step 7
                else:
                    self.metrics.lag_seconds.set(0)
                    if until_caught_up and self._caught_up():
                        break
                self._lag_export.maybe(self.consumer, self.applied)
                if idle_timeout_s is not None and time.monotonic() - last_data > idle_timeout_s:
                    break
            self._commit(set(self._pending_commit), asynchronous=False)
        finally:
            self.stats.elapsed_s = time.monotonic() - started
            self.consumer.close()
        return self.stats

    def _check_topic(self) -> None:
        """Step 0: the topic exists, is the one the projection was built from, and holds its offsets."""
        shape = self.policy.call("describe topic", lambda: describe_events_topic(self.settings))
        applied = self.policy.call("read offsets", lambda: {p: self.store.applied_offset(p)
                                                            for p in range(shape.partitions)})
        check_projection(self.redis, self.settings.topic_prefix, shape, applied, adopt=True)

    def _raise_if_fatal(self) -> None:
        if self._mismatch is not None:
            raise self._mismatch
        if self._fatal is not None:
            raise FatalDependencyError("kafka", kafka_error_verdict(self._fatal).cause)

    def _record_lag(self, msgs: list[Message]) -> None:
        """Lag of this poll: now minus the oldest record's CreateTime (ms); kept in Redis for dashboards/demo."""
        stamps = [m.timestamp()[1] for m in msgs if not m.error() and m.timestamp()[1] > 0]
        if not stamps:
            return
        now_ms = int(time.time() * 1000)
        lag_ms = max(0, now_ms - min(stamps))
        self.metrics.event_age.observe(lag_ms / 1000)
        self.metrics.lag_seconds.set(lag_ms / 1000)
        pipe = self.redis.pipeline(transaction=False)
        pipe.lpush(self.lag_key, f"{now_ms}:{lag_ms}")
        pipe.ltrim(self.lag_key, 0, 9999)
        try:
            pipe.execute()
        except redis.RedisError as exc:  # a dashboard sample: never worth a wait
            log.warning("lag sample not stored", extra={"error": str(exc)})

    def _handle(self, msgs: list[Message]) -> None:
        by_partition: dict[int, list[Message]] = defaultdict(list)
        for msg in msgs:
            if msg.error():
                if stops_consumer(msg.error()):  # fatal, fenced (static member), unauthorised, topic gone
                    raise FatalDependencyError("kafka", kafka_error_verdict(msg.error()).cause)
                log.warning("consumer error", extra={"error": str(msg.error())})
                continue
            by_partition[msg.partition()].append(msg)  # step 2
        for partition, batch in by_partition.items():
            if partition in self.applied:
                started = time.perf_counter()
                self.policy.call(f"apply partition {partition}",  # step 8
                                 lambda p=partition, b=batch: self._apply_partition(p, b))  # type: ignore[misc]
                self.metrics.batch_seconds.observe(time.perf_counter() - started)

    def _apply_partition(self, partition: int, batch: list[Message]) -> None:
        expected = self.applied[partition]
        fresh = batch if batch[0].offset() > expected else [m for m in batch if m.offset() > expected]
        if not fresh:
            return
        decoded = decode_batch(self.codec, self.topic, partition, fresh)  # step 3 (raises on a registry outage)
        for msg, (run_id, item) in zip(fresh, decoded, strict=True):
            if isinstance(item, SchemaError):
                self._quarantine(msg, run_id, item)
        run_ids = {run_id for run_id, _ in decoded if run_id is not None}
        cached, missing = self.cache.split(partition, expected, run_ids)  # step 4
        states: dict[str, RunState | None] = {**cached, **self.store.load(partition, missing)}
        before = dict(states)
        dirty = self._fold_batch(partition, fresh, decoded, states)
        if self.dlq.sent:
            self.dlq.flush()  # step 5
        last = fresh[-1].offset()
        failpoints.hit("projector.before_write")
        write_started = time.perf_counter()
        result = self.store.apply_batch(partition, expected_offset=expected, new_offset=last, states=dirty)  # 6
        self.metrics.commit_seconds.observe(time.perf_counter() - write_started)
        if result.status == "conflict":
            self._resync(partition, result.stored_offset)
            return
        if result.status == "applied":
            self.cache.advance(partition, expected, last, states)
        else:  # Redis is ahead of this batch (another writer): what we folded is not what it holds
            self.cache.drop(partition)
        failpoints.hit("projector.after_write")
        self.applied[partition] = max(last, result.stored_offset)
        self._pending_commit[partition] = self.applied[partition] + 1
        self.stats.events += len(fresh)
        self.stats.batches += 1
        self.metrics.events.labels(str(partition)).inc(len(fresh))
        self.metrics.batches.inc()
        self._count_outcomes(dirty, before)
        self._quarantined = {w for w in self._quarantined if w[0] != partition}

    def _fold_batch(self, partition: int, fresh: list[Message], decoded: list[Decoded],
                    states: dict[str, RunState | None]) -> dict[str, RunState | None]:
        """Fold every decoded record into ``states`` (updated in place); returns the runs that changed."""
        dirty: dict[str, RunState | None] = {}
        critical = self._critical
        for msg, (run_id, item) in zip(fresh, decoded, strict=True):
            if run_id is None:
                continue
            state = states.get(run_id)
            if type(item) is Event:
                new = apply(state, item, partition=partition, offset=msg.offset(), critical=critical)
            else:
                new = self._fold_other(state, item, partition, msg.offset(), run_id)
            if new is not state:
                states[run_id] = dirty[run_id] = new
        return dirty

    def _fold_other(self, state: RunState | None, item: SchemaError | None, partition: int, offset: int,
                    run_id: str) -> RunState | None:
        """A tombstone (None: the run is erased) or an undecodable record (the run is BLOCKED)."""
        if item is None:
            if state is not None:
                self.stats.erased += 1
                self.metrics.erased.inc()
            return None
        if run_id not in self.stats.blocked_runs:
            self.metrics.blocked.inc()
        self.stats.blocked_runs.add(run_id)
        return block(state, run_id, f"{type(item).__name__}: {item}", partition=partition, offset=offset)

    def _quarantine(self, msg: Message, run_id: str | None, exc: SchemaError) -> None:
        """Copy an undecodable record to the DLQ once (a batch folded again after an outage sends nothing twice)."""
        where = (msg.partition(), msg.offset())
        if where in self._quarantined:
            return
        self._quarantined.add(where)
        self.dlq.send(msg, exc)
        self.stats.dead_lettered += 1
        self.metrics.dead_lettered.labels(type(exc).__name__).inc()
        log.warning("quarantined", extra={"topic": msg.topic(), "partition": msg.partition(),
                                          "offset": msg.offset(), "error": str(exc), "run_id": run_id})

    def _count_outcomes(self, dirty: dict[str, RunState | None], before: dict[str, RunState | None]) -> None:
        for run_id, state in dirty.items():
            if state is not None and state.status == RunStatus.GAP and run_id not in self.stats.parked_runs:
                self.stats.parked_runs.add(run_id)
                self.metrics.parked.inc()
        count_outcomes(self.metrics, before, dirty)

    def _resync(self, partition: int, stored: int) -> None:
        """Redis's applied offset is not ours (Redis lost its last second, or another instance wrote): re-seek."""
        self.stats.conflicts += 1
        self.metrics.conflicts.inc()
        log.warning("stale view; re-seeking to Redis's applied offset",
                    extra={"partition": partition, "ours": self.applied.get(partition), "redis": stored})
        self.applied[partition] = stored
        self._pending_commit.pop(partition, None)
        self.cache.drop(partition)
        target = stored + 1 if stored >= 0 else OFFSET_BEGINNING
        self.consumer.seek(TopicPartition(self.topic, partition, target))

    def _commit(self, partitions: set[int], *, asynchronous: bool) -> None:
        # Group offsets are advisory here (Redis holds the truth): a failed commit is only logged.
        commit_pending(self.consumer, self.topic, self._pending_commit, partitions, asynchronous=asynchronous,
                       log=log)

    def _caught_up(self) -> bool:
        if not self._assigned_once.is_set():
            return False
        lags = partition_lags(self.consumer, self.applied)
        for partition, lag in lags.items():
            self.metrics.lag.labels(str(partition)).set(lag)
        return not any(lags.values())


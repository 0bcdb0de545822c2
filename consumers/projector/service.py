"""The state projector: a consumer-group service folding the journal into Redis, exactly once in effect.

Per poll (DESIGN.md § Projector; numbered as in the code):

1. ``consume`` up to ``batch_size`` records (``read_committed``: aborted transactions are never seen).
2. Split by partition; drop records at or below the partition's applied offset (redelivery).
3. Decode. A tombstone (null value) erases its run. An undecodable record is copied to the
   events DLQ with its offset and its run (parsed from the key) is marked BLOCKED; the
   partition's other runs go on.
4. Take the touched runs' states from the in-memory cache when it is valid at the partition's
   applied offset (``runjournal.consumers.projector._cache``), the others from Redis (one MGET), and fold
   each event with the pure reducer (``runjournal.model.reducer.apply``).
5. Flush the DLQ (durable before the offset passes the record).
6. One script call writes every changed state and advances the partition's applied offset,
   atomically, refusing a batch folded from a stale view (then: reload and re-seek).
7. Commit the group offset (last handled + 1), asynchronously — for lag monitoring and tools;
   on (re)assignment the projector seeks to the offset stored in Redis, not the group's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, TopicPartition
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from runjournal.consumers._group import LagExport, commit_pending, partition_lags
from runjournal.consumers.dlq import DeadLetters
from runjournal.consumers.projector._cache import StateCache
from runjournal.consumers.projector.metrics import ProjectorMetrics, count_transitions
from runjournal.consumers.projector.store import ProjectionStore
from runjournal.core import failpoints, kafka
from runjournal.core.settings import Settings
from runjournal.model.reducer import RunState, RunStatus, apply, block
from runjournal.schemas import EventCodec, codec_from_settings
from runjournal.schemas.errors import SchemaError

__all__ = ["Projector", "ProjectorStats", "projector_group"]

log = logging.getLogger("runjournal.consumers.projector")


def projector_group(settings: Settings) -> str:
    """The projector's consumer group id: ``{prefix}.projector``."""
    return f"{settings.topic_prefix}.projector"


@dataclass
class ProjectorStats:
    """Counters of one :meth:`Projector.run` (events are records handled, no-ops included)."""

    events: int = 0
    batches: int = 0
    dead_lettered: int = 0
    erased: int = 0
    conflicts: int = 0
    elapsed_s: float = 0.0
    parked_runs: set[str] = field(default_factory=set)
    blocked_runs: set[str] = field(default_factory=set)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able summary with ``events_per_s``."""
        rate = self.events / self.elapsed_s if self.elapsed_s > 0 else 0.0
        return {"events": self.events, "batches": self.batches, "dead_lettered": self.dead_lettered,
                "erased": self.erased, "conflicts": self.conflicts, "elapsed_s": round(self.elapsed_s, 3),
                "events_per_s": round(rate, 1), "parked_runs": sorted(self.parked_runs),
                "blocked_runs": sorted(self.blocked_runs)}


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
    """

    def __init__(self, settings: Settings, *, batch_size: int = 2000, poll_timeout_s: float = 0.2,
                 codec: EventCodec | None = None, metrics: ProjectorMetrics | None = None,
                 group_id: str | None = None, session_timeout_ms: int = 10_000,
                 group_instance_id: str | None = None, state_cache_runs: int = 10_000) -> None:
        self.settings = settings
        self.topic = settings.events_topic
        self.batch_size = batch_size
        self.poll_timeout_s = poll_timeout_s
        self.codec = codec or codec_from_settings(settings)
        self.metrics = metrics or ProjectorMetrics()
        # Redis restarts (deploys, failover) are ridden out by redis-py's own retry with capped backoff
        # (about 30 s in all); the batch that failed was not written, so it is simply written again.
        self.redis = redis.Redis.from_url(
            settings.redis_url,
            retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=20),
            retry_on_error=[redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError],
        )
        self.store = ProjectionStore(self.redis, settings.topic_prefix)
        self.lag_key = f"rj:{settings.topic_prefix}:projector:lag_ms"
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
        })

    # -- assignment -------------------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            stored = self.store.applied_offset(tp.partition)
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
            KafkaException: a fatal consumer error.
            redis.RedisError: Redis unreachable for longer than the retry budget.
        """
        stop = stop or threading.Event()
        started = time.monotonic()
        self.consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_lost)
        last_data = time.monotonic()
        try:
            while not stop.is_set():
                msgs = self.consumer.consume(self.batch_size, timeout=self.poll_timeout_s)  # step 1
                if msgs:
                    last_data = time.monotonic()
                    self._handle(msgs)
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
        pipe.execute()

    def _handle(self, msgs: list[Message]) -> None:
        by_partition: dict[int, list[Message]] = defaultdict(list)
        for msg in msgs:
            if msg.error():
                if msg.error().fatal():
                    raise KafkaException(msg.error())
                log.warning("consumer error", extra={"error": str(msg.error())})
                continue
            by_partition[msg.partition()].append(msg)  # step 2
        for partition, batch in by_partition.items():
            if partition in self.applied:
                started = time.perf_counter()
                self._apply_partition(partition, batch)
                self.metrics.batch_seconds.observe(time.perf_counter() - started)

    def _apply_partition(self, partition: int, batch: list[Message]) -> None:
        expected = self.applied[partition]
        fresh = [m for m in batch if m.offset() > expected]
        if not fresh:
            return
        decoded = [self._decode(m) for m in fresh]  # step 3
        run_ids = {run_id for run_id, _ in decoded if run_id is not None}
        cached, missing = self.cache.split(partition, expected, run_ids)  # step 4
        states: dict[str, RunState | None] = {**cached, **self.store.load(partition, missing)}
        before = dict(states)
        dirty: dict[str, RunState | None] = {}
        for msg, (run_id, item) in zip(fresh, decoded, strict=True):
            if run_id is None:
                continue
            new = self._fold(states.get(run_id), item, partition, msg.offset(), run_id)
            if new is not states.get(run_id):
                states[run_id] = new
                dirty[run_id] = new
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

    def _fold(self, state: RunState | None, item: Any, partition: int, offset: int, run_id: str) -> RunState | None:
        if item is None:  # tombstone: the run is being erased
            if state is not None:
                self.stats.erased += 1
                self.metrics.erased.inc()
            return None
        if isinstance(item, SchemaError):
            self.stats.blocked_runs.add(run_id)
            self.metrics.blocked.inc()
            return block(state, run_id, f"{type(item).__name__}: {item}", partition=partition, offset=offset)
        return apply(state, item, partition=partition, offset=offset)

    def _decode(self, msg: Message) -> tuple[str | None, Any]:
        """``(run_id, Event | None(tombstone) | SchemaError)``; run_id None when even the key is unreadable."""
        run_id = _run_id_from_key(msg.key())
        value = msg.value()
        if value is None:
            return run_id, None
        try:
            event = self.codec.decode(value, topic=msg.topic(), partition=msg.partition(), offset=msg.offset())
        except SchemaError as exc:
            self.dlq.send(msg, exc)
            self.stats.dead_lettered += 1
            self.metrics.dead_lettered.labels(type(exc).__name__).inc()
            log.warning("quarantined", extra={"topic": msg.topic(), "partition": msg.partition(),
                                              "offset": msg.offset(), "error": str(exc), "run_id": run_id})
            return run_id, exc
        return event.run_id, event

    def _count_outcomes(self, dirty: dict[str, RunState | None], before: dict[str, RunState | None]) -> None:
        for run_id, state in dirty.items():
            if state is None:
                continue
            if state.status == RunStatus.GAP and run_id not in self.stats.parked_runs:
                self.stats.parked_runs.add(run_id)
                self.metrics.parked.inc()
            count_transitions(self.metrics, before.get(run_id), state)

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


def _run_id_from_key(key: bytes | None) -> str | None:
    """``run_id`` from a key ``{run_id}:{epoch}:{seq}``; None when the key is not of that form."""
    if not key:
        return None
    try:
        run_id, epoch, seq = key.decode("utf-8").rsplit(":", 2)
        int(epoch), int(seq)
    except ValueError:
        return None
    return run_id or None

"""The state projector: a consumer-group service folding the journal into Redis, exactly once in effect.

Per poll (docs/design/protocol.md § Projector; numbered as in the code):

1. ``consume`` up to ``batch_size`` records (``read_committed``: aborted transactions are never seen).
2. Split by partition; drop records at or below the partition's applied offset (redelivery), and a partition's
   records fetched before it was re-seeked (they come again).
3. Decode. A tombstone (null value) erases its run. An undecodable record is copied to the
   events DLQ with its offset and its run (parsed from the key) is marked BLOCKED; the
   partition's other runs go on. A registry that cannot be reached is not a bad record: the
   batch waits (step 8).
4. Take the touched runs' states from the in-memory cache when it is valid at the partition's
   applied offset (``runjournal.consumers.projector._cache``), else from the batch whose write is in flight,
   else from Redis (one pipelined HGETALL per run), and fold each event with the pure reducer
   (``runjournal.model.reducer.apply``).
5. Flush the DLQ (durable before the offset passes the record).
6. Write behind (``runjournal.consumers.projector._writebehind``, its rules 1-5): serialise the changed states,
   take the outcome of the write in flight, then hand this batch's one script call — every changed state and the
   partition's applied offset, atomically, refusing a batch folded from a stale view — to the write thread, and
   go on with the next batch while it runs. A write that was not applied (refused, or failed) re-seeks its
   partition to the applied offset Redis holds, and the batch folded after it is dropped.
7. Commit the group offset (last applied + 1, only once its write's outcome said applied), asynchronously — for
   lag monitoring and tools; on (re)assignment the projector seeks to the offset stored in Redis, not the group's.
8. Failures go through the one failure policy (``runjournal.consumers.runtime.failures``): a transient one
   (registry, Redis, broker) before the hand-off waits with capped backoff and folds the same batch again —
   nothing was written, so nothing moves; a write that fails makes its partition re-read its applied offset from
   Redis (waiting out the outage) and re-seek; a fatal one (fenced static member, unauthorised, topic gone) stops
   the projector with :class:`~runjournal.consumers.runtime.failures.FatalDependencyError`.

Before any stored offset is used, the topic is checked against what the projection stored about it
(``runjournal.consumers.runtime.topic_identity``): a re-created topic or another partition count stops the
projector with :class:`~runjournal.consumers.runtime.topic_identity.TopicMismatchError` naming the repair.
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

from runjournal.consumers.projector._cache import StateCache
from runjournal.consumers.projector._fold import BatchFolder
from runjournal.consumers.projector._gc import GcPause
from runjournal.consumers.projector._positions import Positions
from runjournal.consumers.projector._writebehind import PendingWrite, WriteBehind, WriteOutcome, states_at
from runjournal.consumers.projector.metrics import ProjectorMetrics, poll_lag_ms, store_lag_sample
from runjournal.consumers.projector.stats import ProjectorStats
from runjournal.consumers.projector.store import ApplyResult, ProjectionStore
from runjournal.consumers.runtime.dlq import DeadLetters
from runjournal.consumers.runtime.failures import (
    TRANSIENT,
    FailurePolicy,
    FatalDependencyError,
    classify,
    kafka_error_verdict,
    stops_consumer,
)
from runjournal.consumers.runtime.group import LagExport, commit_pending, group_consumer_config, partition_lags
from runjournal.consumers.runtime.topic_identity import TopicMismatchError, check_topic
from runjournal.core import failpoints, kafka, otel, redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.schemas import EventCodec, codec_from_settings

__all__ = ["Projector", "ProjectorStats", "projector_group"]

log = logging.getLogger("runjournal.consumers.projector")


def _consumer_config(group_id: str, session_timeout_ms: int, instance_id: str | None) -> dict[str, object]:
    """The projector's consumer settings: offsets stored by hand (Redis holds the truth), read_committed."""
    return {**group_consumer_config(group_id, session_timeout_ms=session_timeout_ms, instance_id=instance_id),
            "fetch.min.bytes": 1, "queued.max.messages.kbytes": 65536}


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
            (``runjournal.consumers.projector._cache``). Saves the per-batch read and parse of each run.
        max_outage_s: longest one dependency outage is waited out before the projector stops (s, 240).
        write_behind: run each batch's Redis write while the next batch is decoded and folded (default True;
            ``runjournal.consumers.projector._writebehind``). False waits for every write before going on.
    """

    def __init__(self, settings: Settings, *, batch_size: int = 2000, poll_timeout_s: float = 0.2,
                 codec: EventCodec | None = None, metrics: ProjectorMetrics | None = None,
                 group_id: str | None = None, session_timeout_ms: int = 10_000,
                 group_instance_id: str | None = None, state_cache_runs: int = 10_000,
                 max_outage_s: float = 240.0, write_behind: bool = True) -> None:
        self.settings = settings
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
        self._mismatch: TopicMismatchError | None = None
        self.store = ProjectionStore(self.redis, settings.topic_prefix)
        self.lag_key = RedisKeys(settings.topic_prefix).projector_lag()
        """Redis list of the last 10,000 per-poll lag samples ``"<unix ms>:<lag ms>"``, newest first."""
        self.dlq = DeadLetters(settings, settings.events_dlq_topic)
        self.group_id = group_id or projector_group(settings)
        self.cache = StateCache(state_cache_runs)
        self.positions = Positions(self.cache)
        self.applied = self.positions.applied
        """Assigned partition -> the offset its next batch folds from (the end of the write in flight, if any)."""
        self.write_behind = write_behind
        self.writer = WriteBehind(self.store.run_batch)
        self._assigned_once = threading.Event()
        self._lag_export = LagExport(self.metrics.lag)
        self.stats = ProjectorStats()
        self._folder = BatchFolder(settings.critical_types, self.stats, self.metrics, self.dlq, log)
        self.consumer = kafka.consumer(settings, **_consumer_config(self.group_id, session_timeout_ms,
                                                                    group_instance_id), error_cb=self._on_error)

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
        known = {p: self.store.run_ids_upto(p, self.cache.max_known) for p in applied}  # after the offsets (_cache)
        for tp in partitions:
            stored = applied[tp.partition]
            self.positions.assign(tp.partition, stored, known[tp.partition])
            tp.offset = stored + 1 if stored >= 0 else OFFSET_BEGINNING
        consumer.incremental_assign(partitions)
        self._assigned_once.set()
        log.info("assigned", extra={"partitions": {tp.partition: tp.offset for tp in partitions}})

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # The write in flight ends first (write-behind rule 5), so the offsets committed for the revoked
        # partitions are the ones Redis holds; then they go.
        revoked = {tp.partition for tp in partitions}
        self._settle(leaving=revoked)
        self._commit(revoked, asynchronous=False)
        for p in revoked:
            self.positions.forget(p)
        consumer.incremental_unassign(partitions)
        log.info("revoked", extra={"partitions": sorted(revoked)})

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Another member may own them already: the write in flight ends (the apply script refuses it if that
        # member wrote first), nothing is committed for them.
        lost = {tp.partition for tp in partitions}
        self._settle(leaving=lost)
        for p in lost:
            self.positions.pending_commit.pop(p, None)
            self.positions.forget(p)
        consumer.incremental_unassign(partitions)
        log.warning("partitions lost", extra={"partitions": sorted(lost)})

    # -- main loop ------------------------------------------------------------------------------
    def run(self, *, until_caught_up: bool = False, stop: threading.Event | None = None,
            idle_timeout_s: float | None = None) -> ProjectorStats:
        """Consume until ``stop`` is set (or, with ``until_caught_up``, until lag is 0 on every assigned partition).

        Returns:
            :class:`ProjectorStats` of this run (every write it made has ended and its outcome counted).

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
        gc_pause = GcPause()
        try:
            self._check_topic()  # before any stored offset is used
            self.consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                    on_lost=self._on_lost)
            while not stop.is_set():
                # step 1; with a write in flight, a short poll: an idle stream takes its outcome at once (step 7)
                timeout_s = self.poll_timeout_s if self.writer.in_flight is None else min(self.poll_timeout_s, 0.01)
                msgs = self.consumer.consume(self.batch_size, timeout=timeout_s)
                self._raise_if_fatal()
                try:
                    if msgs:
                        last_data = time.monotonic()
                        gc_pause.busy()
                        self._handle(msgs)  # steps 2-6
                        gc_pause.handled()
                    else:  # idle: the write in flight lands, a partition it did not apply re-seeks
                        gc_pause.resume()
                        self._settle()
                        self._reseek()
                except Exception as exc:
                    if stop.is_set() and classify(exc).kind == TRANSIENT:
                        break  # stopped while waiting out an outage: this batch is not committed
                    raise
                lag_ms = poll_lag_ms(self.metrics, msgs) if msgs else None
                if lag_ms is not None:  # its Redis sample is pushed by the write thread, after the write in flight
                    self.writer.aside(lambda ms=lag_ms: store_lag_sample(self.redis, self.lag_key, ms, log))
                self._commit(set(self.positions.pending_commit), asynchronous=True)  # step 7
                if not msgs:
                    self.metrics.lag_seconds.set(0)
                    if until_caught_up and self._caught_up():
                        break
                self._lag_export.maybe(self.consumer, self.applied)
                if idle_timeout_s is not None and time.monotonic() - last_data > idle_timeout_s:
                    break
            self._settle()  # the last write's outcome, before the last commit
            self._commit(set(self.positions.pending_commit), asynchronous=False)
        finally:
            gc_pause.resume()
            self.writer.close()  # a write still in flight (an exception above) ends; nothing is committed for it
            self.stats.elapsed_s = time.monotonic() - started
            self.consumer.close()
        return self.stats

    def _check_topic(self) -> None:
        """Step 0: the topic exists, is the one the projection was built from, and holds its offsets."""
        check_topic(self.settings, self.redis, self.settings.topic_prefix,
                    lambda n: {p: self.store.applied_offset(p) for p in range(n)}, adopt=True, call=self.policy.call)

    def _raise_if_fatal(self) -> None:
        if self._mismatch is not None:
            raise self._mismatch
        if self._fatal is not None:
            raise FatalDependencyError("kafka", kafka_error_verdict(self._fatal).cause)

    def _handle(self, msgs: list[Message]) -> None:
        by_partition: dict[int, list[Message]] = defaultdict(list)
        for msg in msgs:
            if msg.error():
                if stops_consumer(msg.error()):  # fatal, fenced (static member), unauthorised, topic gone
                    raise FatalDependencyError("kafka", kafka_error_verdict(msg.error()).cause)
                log.warning("consumer error", extra={"error": str(msg.error())})
                continue
            by_partition[msg.partition()].append(msg)  # step 2
        views = dict(self.positions.views)  # the views these records were fetched under: a later re-seek drops them
        self._reseek()
        for partition, batch in by_partition.items():
            if partition in self.applied:
                started = time.perf_counter()
                links = otel.header_links(batch) if otel.tracer() is not None else None  # the runs' traces
                with otel.step_span("runjournal.projector.apply", {"runjournal.partition": partition,
                                                                   "runjournal.records": len(batch)}, links):
                    self.policy.call(f"apply partition {partition}",  # step 8
                                     lambda p=partition, b=batch: self._apply_partition(p, b, views.get(p)))  # type: ignore[misc]
                self.metrics.batch_seconds.observe(time.perf_counter() - started)

    def _apply_partition(self, partition: int, batch: list[Message], view: int | None) -> None:
        if view is None or self.positions.views.get(partition) != view:
            return  # re-seeked since these records were fetched: they come again (step 2)
        expected = self.applied[partition]
        fresh = batch if batch[0].offset() > expected else [m for m in batch if m.offset() > expected]
        if not fresh:
            return
        folded = self._folder.decode_fold(self.codec, self.topic, partition, fresh, lambda run_ids: states_at(
            self.cache, self.writer, self.store, partition, expected, run_ids))  # steps 3-4
        states, before, dirty = folded.states, folded.before, folded.dirty
        if self.dlq.sent:
            self.dlq.flush()  # step 5
        prepared = self.store.prepare_batch(partition, expected_offset=expected, new_offset=fresh[-1].offset(),
                                            states=dirty, before=before)  # step 6
        self._settle()  # write-behind rule 1: the write before this one has ended
        if self.positions.views.get(partition) != view:
            return  # it was not applied: the partition re-seeks and this batch is folded again
        self.writer.submit(PendingWrite(prepared, view, dirty, before, len(fresh)))
        failpoints.hit("projector.write_in_flight")
        self.applied[partition] = prepared.new_offset  # rule 2: the next batch folds from this one
        self.cache.advance(partition, expected, prepared.new_offset, states)
        if not self.write_behind:
            self._settle()

    # -- write outcomes ---------------------------------------------------------------------------
    def _settle(self, *, leaving: set[int] | None = None) -> WriteOutcome | None:
        """Take the outcome of the write in flight, if any (write-behind rules 3-5); ``leaving``: partitions being
        revoked or lost (a write of theirs that was not applied needs no re-seek).

        Raises:
            Exception: the write failed for a reason no waiting fixes (unauthorised, a script error): re-raised.
        """
        outcome = self.writer.wait()
        if outcome is not None:
            self._take(outcome, leaving or set())
        return outcome

    def _take(self, outcome: WriteOutcome, leaving: set[int]) -> None:
        write, result = outcome.write, outcome.result
        partition = write.partition
        if result is not None:
            self.metrics.commit_seconds.observe(outcome.seconds)
            if result.status != "conflict":  # applied, or already applied (Redis is ahead: another writer)
                self._applied(write, result)
                if result.status == "applied":
                    return
        if partition in leaving or self.positions.views.get(partition) != write.view:
            return  # going to another member, or already re-seeked: it reads Redis's offset anyway
        if result is None:
            assert outcome.error is not None
            if classify(outcome.error).kind != TRANSIENT:
                raise outcome.error
            log.warning("write failed; re-reading the partition's applied offset from Redis",
                        extra={"partition": partition, "error": f"{type(outcome.error).__name__}: {outcome.error}"})
        elif result.status == "conflict":
            self.stats.conflicts += 1
            self.metrics.conflicts.inc()
            log.warning("stale view; re-seeking to Redis's applied offset",
                        extra={"partition": partition, "ours": write.batch.expected_offset,
                               "redis": result.stored_offset})
        self.positions.void(partition, result.stored_offset if result is not None else None)

    def _applied(self, write: PendingWrite, result: ApplyResult) -> None:
        """``write`` is in Redis (or Redis was already past it): its group offset may be committed (step 7)."""
        partition = write.partition
        self.positions.pending_commit[partition] = max(write.last, result.stored_offset) + 1
        self.stats.events += write.records
        self.stats.batches += 1
        self.metrics.events.labels(str(partition)).inc(write.records)
        self.metrics.batches.inc()
        self._folder.applied(partition, write.last, write.dirty, write.before)

    def _reseek(self) -> None:
        """Re-seek every partition whose last write was not applied to the applied offset Redis holds (read first
        when the write failed: step 8 waits out an outage)."""
        for partition, due in list(self.positions.reseek_due.items()):
            stored, known = self.policy.call(f"read the applied offset of partition {partition}",
                                             lambda p=partition, d=due: self._stored(p, d))  # type: ignore[misc]
            self.positions.reseeked(partition, stored, known)
            target = stored + 1 if stored >= 0 else OFFSET_BEGINNING
            self.consumer.seek(TopicPartition(self.topic, partition, target))
            log.info("re-seeked to Redis's applied offset", extra={"partition": partition, "offset": stored})

    def _stored(self, partition: int, stored: int | None) -> tuple[int, set[str] | None]:
        """Redis's applied offset of ``partition`` (read unless given) and then its runs (``_cache``)."""
        offset = self.store.applied_offset(partition) if stored is None else stored
        return offset, self.store.run_ids_upto(partition, self.cache.max_known)

    def _commit(self, partitions: set[int], *, asynchronous: bool) -> None:
        # Group offsets are advisory here (Redis holds the truth): a failed commit is only logged.
        commit_pending(self.consumer, self.topic, self.positions.pending_commit, partitions, asynchronous=asynchronous,
                       log=log)

    def _caught_up(self) -> bool:
        if not self._assigned_once.is_set() or self.positions.reseek_due or self.writer.in_flight is not None:
            return False
        lags = partition_lags(self.consumer, self.applied)
        for partition, lag in lags.items():
            self.metrics.lag.labels(str(partition)).set(lag)
        return not any(lags.values())

"""Journal: an agent instance's one transactional publisher to the events topic.

Durability design (DESIGN.md § The side-effect protocol, § Zombies: fence first, then read):

* One ``confluent_kafka.Producer`` per Journal — ``acks=all``, ``enable.idempotence=true``,
  ``compression.type=lz4``, ``linger.ms=5`` — with ``transactional.id =
  transactional_id(settings, producer_id)``; ``init_transactions()`` at start. All events of
  the instance go through it (two producers could reorder a run).
* Every event is produced into the open transaction. A **durable** event (``runjournal.schemas.DURABLE_TYPES``:
  TOOL_CALL_INTENDED / COMMITTED / FAILED / RECONCILED, approvals, RUN_RESUMED and terminal events)
  then commits it: ``commit_transaction()`` returning *is* the broker's ack, for it and every
  event before it. Concurrent durable publishes from several threads share one commit.
* A **non-durable** event (RUN_STARTED, NODE_*, MESSAGE, USER_CORRECTION, read-only tool calls)
  returns once queued; it is committed by the next durable event, by the keeper thread when the
  transaction is ``max_txn_age_ms`` old (default 1000 ms), or by ``flush()`` / ``close()``.
  Trade-off: a crash can lose the last ≤ ~``max_txn_age_ms`` of non-durable events (the broker
  aborts the open transaction), but never reorders or gaps a run — a lost tail is a clean tail,
  and consumers read ``read_committed``. A side effect is never in that window: its intent commits
  before the tool runs.
* The partition is ``murmur2(run_id) % partitions`` (``runjournal.producers.partitioner``), passed
  explicitly; the count is read at start and re-read every ``metadata_check_interval_s`` and
  after a delivery error; a change stops publishing with ``PartitionCountChangedError``.
* Fencing: the recovery job calls ``init_transactions()`` with this instance's transactional id
  (``fence_producer``). The next transactional call here fails as fenced, and from then on every
  publish of this instance raises ``ProducerFencedError`` (checked under the publisher lock, so no
  thread slips a write past the fence). The same transactional.id is never initialised again:
  that would un-fence the zombie. Restart with a new producer_id.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException

from runjournal.core import failpoints, kafka
from runjournal.core.settings import Settings
from runjournal.producers._digest import canonical_json
from runjournal.producers._lease import InstanceLease
from runjournal.producers._txn import Item, TxnPublisher
from runjournal.producers.errors import (
    DeliveryError,
    JournalError,
    NoRecoveryPlanError,
    PartitionCountChangedError,
    ProducerFencedError,
    TopicNotFoundError,
)
from runjournal.producers.fencing import default_producer_id, transactional_id
from runjournal.producers.handle import RunHandle
from runjournal.producers.metrics import NO_METRICS, JournalMetrics
from runjournal.producers.partitioner import partition_for
from runjournal.producers.plan import PlanStore
from runjournal.producers.results import ResultStore
from runjournal.producers.tracing import check_traceparent
from runjournal.schemas import Event, EventType

__all__ = ["Journal"]

log = logging.getLogger("runjournal.producers.journal")


class Journal:
    """The agent-side journal: start or resume runs, publish their events durably. Thread-safe.

    Starts on construction: takes the instance lease (and starts its heartbeat thread), calls
    ``init_transactions()``, reads the events topic's partition count and starts the keeper thread
    (age-bounded commits, partition-count checks). Use as a context manager, or call :meth:`close`.

    Args:
        settings: ``runjournal.core.settings.Settings`` (bootstrap, redis_url, topic_prefix → events topic).
        producer_id: this instance's id (default ``{host}-{pid}-{8 hex}``); base of the transactional id,
            the lease key and the owned set. Two live instances must not share one.
        codec: an ``runjournal.schemas.EventCodec`` (default ``runjournal.schemas.codec_from_settings(settings)``).
        redis_client: a ``redis.Redis`` (default: from ``settings.redis_url``).
        redis_prefix: Redis key prefix (default ``settings.topic_prefix``).
        lease_ttl_ms: lease TTL in ms (default 10 000); renewed every ttl/3.
        linger_ms: producer ``linger.ms`` (default 5).
        compression: producer ``compression.type`` (default ``lz4``).
        max_txn_age_ms: the keeper commits an open transaction this old, ms (default 1000) — the
            bound on how long a non-durable event stays uncommitted.
        metadata_check_interval_s: seconds between partition-count checks (default 30).
        commit_timeout_s: timeout of each commit/abort/init call, seconds (default 30).
        inline_result_bytes: results (and args) up to this many bytes of canonical JSON go inline in
            events; larger results go to Redis by reference (default 8192; see ``runjournal.producers.results``).
        queue_full_retries: bounded retries of a full local queue before ``QueueFullError`` (default 20).
        txn_settle_ms: a durable publish opening a transaction less than this many ms after the last
            commit waits out the rest (default 0: off). Right after a commit a slow (cold or loaded)
            broker is still writing markers and librdkafka answers the next AddPartitionsToTxn's
            CONCURRENT_TRANSACTIONS with a fixed 20 ms backoff. Measured on the local 1-node broker:
            back-to-back durable publishes p50 ~35 ms cold vs ~4 ms warm with 0; ~9-14 ms either way
            with 5. Set it when your brokers show the cold profile.
        producer_config: extra librdkafka settings (override the defaults above).
        metrics: opt-in Prometheus metrics (``runjournal.producers.metrics.JournalMetrics``: the host
            application's registry, or a port of its own); default None exports nothing.

    Raises:
        TopicNotFoundError: the events topic does not exist.
        FatalProducerError: ``init_transactions`` failed.
        JournalError: ``producer_id`` is held by another live instance's lease.
        redis.RedisError: Redis is unreachable.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        producer_id: str | None = None,
        codec: Any = None,
        redis_client: Any = None,
        redis_prefix: str | None = None,
        lease_ttl_ms: int = 10_000,
        linger_ms: int = 5,
        compression: str = "lz4",
        max_txn_age_ms: int = 1000,
        metadata_check_interval_s: float = 30.0,
        commit_timeout_s: float = 30.0,
        inline_result_bytes: int = 8192,
        queue_full_retries: int = 20,
        txn_settle_ms: float = 0.0,
        producer_config: dict[str, Any] | None = None,
        metrics: JournalMetrics | None = None,
    ) -> None:
        if codec is None:
            from runjournal.schemas import codec_from_settings

            codec = codec_from_settings(settings)
        if redis_client is None:
            import redis

            redis_client = redis.Redis.from_url(settings.redis_url)
        self.settings = settings
        self.producer_id = producer_id or default_producer_id()
        self.transactional_id = transactional_id(settings, self.producer_id)
        self.topic = settings.events_topic
        self.inline_result_bytes = inline_result_bytes
        self._codec = codec
        prefix = redis_prefix or settings.topic_prefix
        self.plans = PlanStore(redis_client, prefix)
        self.results = ResultStore(redis_client, prefix)
        self._lease = InstanceLease(
            redis_client, prefix, self.producer_id, self.transactional_id, lease_ttl_ms
        )
        self._max_txn_age_s = max_txn_age_ms / 1000
        self._metadata_interval_s = metadata_check_interval_s
        self._fence_count = 0
        self._partition_error: PartitionCountChangedError | None = None
        self._closed = False
        self._metrics = metrics or NO_METRICS
        config = kafka.client_config(settings, "producer", client_id=self.producer_id, **{
            "transactional.id": self.transactional_id,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": compression,
            "linger.ms": linger_ms,
            "allow.auto.create.topics": False,  # a metadata request must never create the journal topic
            # A dead instance nobody fenced must not hold the partitions' last stable offset for long:
            # the coordinator aborts its open transaction after this (live ones commit every max_txn_age_ms).
            "transaction.timeout.ms": max(15_000, 10 * max_txn_age_ms),
            **(producer_config or {}),
        })
        self._txn = TxnPublisher(
            config,
            self.topic,
            commit_timeout_s=commit_timeout_s,
            commit_retries=2,
            queue_full_retries=queue_full_retries,
            on_fenced=self._fenced,
            still_leased=self._lease.still_ours,
            settle_ms=txn_settle_ms,
        )
        self.partitions = 0
        """The events topic's partition count, read at start."""
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._heartbeat, name=f"journal-lease-{self.producer_id}", daemon=True),
            threading.Thread(target=self._keep, name=f"journal-keeper-{self.producer_id}", daemon=True),
        ]
        # Lease first (init_transactions() with the transactional id of a live instance would fence it),
        # heartbeating at once: the first init_transactions() on a cold broker can outlast a short TTL.
        self._lease.acquire()
        self._threads[0].start()
        try:
            self._txn.start()
            self.partitions = self._read_partition_count()
        except BaseException:
            self._stop.set()
            self._threads[0].join()
            self._lease.release()
            raise
        self._threads[1].start()
        self._metrics.attach(self)

    # -- properties ------------------------------------------------------------------------------
    @property
    def fence_count(self) -> int:
        """How many times this instance was found fenced; a handle created before a fence stops writing."""
        return self._fence_count

    @property
    def stats(self) -> dict[str, int]:
        """Counters: ``commits``, ``aborts``, ``rebuilds``, ``fences``, ``lease_lapses``."""
        return {
            "commits": self._txn.commits,
            "aborts": self._txn.aborts,
            "rebuilds": self._txn.rebuilds,
            "fences": self._fence_count,
            "lease_lapses": self._lease.lapses,
        }

    # -- runs ------------------------------------------------------------------------------------
    def start_run(
        self,
        tenant_id: str,
        agent: str,
        input: Any,
        run_id: str | None = None,
        *,
        user_id: str | None = None,
        traceparent: str | None = None,
    ) -> RunHandle:
        """Start a new run: add it to the owned set, publish RUN_STARTED (seq 1, epoch 1; non-durable).

        Args:
            tenant_id: owning tenant.
            agent: agent name.
            input: the run's input, JSON-serialisable (recorded as canonical JSON).
            run_id: the run's id (default: a uuid4).
            user_id: the user who started it, if any.
            traceparent: W3C trace context for every event of the run (default: the active
                ``runjournal.producers.tracing.current_traceparent`` at each emit).

        Returns:
            The run's :class:`RunHandle`.

        Raises:
            ValueError: a malformed ``traceparent``. Otherwise as ``RunHandle.emit``.
        """
        run_id = run_id or str(uuid.uuid4())
        traceparent = check_traceparent(traceparent)
        self._lease.own(run_id)
        try:
            return RunHandle.start_new(
                self,
                run_id=run_id,
                tenant_id=tenant_id,
                agent=agent,
                input_json=canonical_json(input),
                user_id=user_id,
                traceparent=traceparent,
            )
        except BaseException:
            self.release_run(run_id)
            raise

    def resume(self, run_id: str, *, traceparent: str | None = None) -> RunHandle:
        """Continue a run the recovery job handed to this instance (``runjournal.producers.plan``).

        The handle writes with ``plan.epoch`` from ``seq = plan.last_seq + 1``; ``call`` follows the
        plan's per-call classification. Publishes nothing by itself (RUN_RESUMED is the recovery job's).

        Raises:
            NoRecoveryPlanError: no plan for ``run_id``, or the plan is assigned to another instance.
            ValueError: a malformed ``traceparent``.
        """
        plan = self.plans.get(run_id)
        if plan is None:
            raise NoRecoveryPlanError(f"no recovery plan for run {run_id} ({self.plans.plan_key(run_id)})")
        if plan.assigned_to not in (None, self.producer_id):
            raise NoRecoveryPlanError(
                f"the plan of run {run_id} is assigned to {plan.assigned_to}, not {self.producer_id}"
            )
        self._lease.own(run_id)
        return RunHandle(
            self,
            run_id=run_id,
            tenant_id=plan.tenant_id,
            agent=plan.agent,
            epoch=plan.epoch,
            next_seq=plan.last_seq + 1,
            plan=plan,
            traceparent=check_traceparent(traceparent),
        )

    def check_still_owner(self) -> None:
        """Raise ``ProducerFencedError`` unless this instance still holds its lease (one Redis GET, ~0.2 ms).

        Called between a side effect's acknowledged intent and the tool: an instance paused past its
        lease TTL (GC, SIGSTOP) may have been declared dead and its runs handed over; it must not send
        the request now. This narrows, but cannot close, the window between check and send — only the
        provider can close it, by honouring the idempotency key or a fencing token (the run's epoch;
        DESIGN.md § Zombies, step 3). Redis being unreachable does not fail the check (Kafka fences).
        """
        if not self._lease.still_ours():
            raise ProducerFencedError(
                f"instance {self.producer_id} lost its lease {self._lease.key}: it may have been declared dead "
                "and its runs handed over; not running the tool")

    def claim_assignment(self, timeout_s: float) -> str | None:
        """The next run id assigned to this instance, waiting up to ``timeout_s`` seconds; None if none."""
        return self.plans.claim_assignment(self.producer_id, timeout_s)

    def release_run(self, run_id: str) -> None:
        """Remove ``run_id`` from the owned set (after its terminal event); Redis errors are only logged."""
        try:
            self._lease.disown(run_id)
        except Exception as exc:  # noqa: BLE001 - a hint only; the terminal event is already durable
            log.warning("could not remove run %s from %s: %s", run_id, self._lease.owned_key, exc)

    # -- publishing ----------------------------------------------------------------------------------
    def publish(
        self, event: Event, *, durable: bool, on_lost: Callable[[DeliveryError], None] | None = None
    ) -> None:
        """Low-level: publish one encoded event into the open transaction (used by RunHandle).

        Args:
            event: the event; its key is ``event.key`` and its partition ``murmur2(run_id) % partitions``.
            durable: commit the transaction (broker ack) before returning.
            on_lost: called if the event, once accepted, is later lost (it could not be re-produced).

        Raises:
            EventTooLargeError / InvalidEventError / NaiveDatetimeError: from the codec; nothing was sent.
            PartitionCountChangedError, QueueFullError, DeliveryError (TransactionAbortedError,
            FatalProducerError, ProducerFencedError), JournalError (closed).
        """
        if self._closed:
            raise JournalError("the journal is closed")
        if (changed := self._partition_error) is not None:  # a fresh exception per caller
            raise PartitionCountChangedError(
                topic=self.topic, expected=changed.expected, actual=changed.actual
            )
        value = self._codec.encode(event, topic=self.topic)
        headers = [("traceparent", event.traceparent.encode("ascii"))] if event.traceparent else None
        partition = partition_for(event.run_id, self.partitions)
        item = Item(event.run_id, event.key, value, partition, headers, durable, on_lost)
        started = time.perf_counter()
        try:
            gen = self._txn.publish(item)
            if durable and event.type is EventType.TOOL_CALL_INTENDED:
                failpoints.hit("producers.call.before_intent_commit")  # produced, not yet acknowledged
            if durable:
                self._txn.commit_through(gen)
        except DeliveryError:
            self._check_partition_count()
            raise
        self._metrics.published(self.producer_id, event, durable=durable, seconds=time.perf_counter() - started)

    def flush(self, timeout_s: float | None = None) -> None:
        """Commit the open transaction now (non-durable events become visible). ``timeout_s`` is unused:
        each commit is bounded by ``commit_timeout_s``. Raises DeliveryError (and subclasses)."""
        self._txn.flush()

    def close(self, timeout_s: float = 10.0) -> None:
        """Commit what is pending, stop the keeper, delete the lease. Idempotent.

        Unfinished runs stay in the owned set with no lease: the recovery job resumes them.
        Raises DeliveryError when the final commit failed (the lease is released anyway).
        """
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout_s)
        try:
            self._txn.close(timeout_s)
        finally:
            try:
                self._lease.release()
            except Exception as exc:  # noqa: BLE001 - the lease expires by itself
                log.warning("could not release lease %s: %s", self._lease.key, exc)

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------------------
    def _fenced(self) -> None:
        self._fence_count += 1
        log.error(
            "instance %s was fenced (%s); its open runs stop writing", self.producer_id, self.transactional_id
        )

    def _read_partition_count(self) -> int:
        count = self._txn.partition_count(10.0)
        if count is None:
            self._txn.close(1.0)
            raise TopicNotFoundError(f"topic {self.topic} does not exist (run `runjournal topics create`)")
        return count

    def _check_partition_count(self) -> None:
        try:
            count = self._txn.partition_count(5.0)
        except (KafkaException, JournalError) as exc:
            log.warning("partition count check failed: %s", exc)
            return
        if count is not None and count != self.partitions and self._partition_error is None:
            self._partition_error = PartitionCountChangedError(
                topic=self.topic, expected=self.partitions, actual=count
            )
            log.error("%s", self._partition_error)

    def _heartbeat(self) -> None:
        """Lease thread: re-set the lease every ttl/3; separate, so a slow commit cannot starve it."""
        every_s = self._lease.ttl_ms / 3000
        while not self._stop.wait(every_s):
            try:
                self._lease.renew()
            except Exception as exc:  # noqa: BLE001 - keep trying; Kafka's fence is the real guard
                log.warning("lease renewal failed: %s", exc)

    def _keep(self) -> None:
        """Keeper thread: age-bounded commits, partition-count checks, delivery callbacks."""
        tick_s = max(0.02, min(0.25, self._max_txn_age_s / 4))
        next_meta = time.monotonic() + self._metadata_interval_s
        while not self._stop.wait(tick_s):
            if self._txn.txn_age_s() >= self._max_txn_age_s:
                try:
                    self._txn.flush()
                except JournalError as exc:
                    log.warning("background commit failed: %s", exc)
            if time.monotonic() >= next_meta:
                next_meta = time.monotonic() + self._metadata_interval_s
                self._check_partition_count()
            self._txn.poll()

"""Journal: an agent instance's one transactional publisher to the events topic.

Durability design (docs/design/protocol.md § The side-effect protocol, § Zombies: fence first, then read):

* One ``confluent_kafka.Producer`` per Journal — ``acks=all``, ``enable.idempotence=true``,
  ``compression.type=lz4``, ``linger.ms=5`` — with ``transactional.id =
  transactional_id(settings, producer_id)``; ``init_transactions()`` at start. All events of
  the instance go through it (two producers could reorder a run).
* Every event is produced into the open transaction. A **durable** event (``runjournal.schemas.DURABLE_TYPES``:
  TOOL_CALL_INTENDED / COMMITTED / FAILED / RECONCILED, approvals, RUN_RESUMED and terminal events)
  then commits it: ``commit_transaction()`` returning *is* the broker's ack, for it and every
  event before it. Concurrent durable publishes from several threads share one commit.
* **Group commit of outcomes** (``outcome_commit="group"``, the default): the TOOL_CALL_COMMITTED of a tool
  that can ``reconcile()`` is produced into the open transaction and acknowledged by the *next* commit — the
  next durable event of any run of the instance (the next call's intent, typically), the keeper after
  ``outcome_linger_ms`` (default 20 ms), or ``flush()`` / ``close()`` — so a call costs one broker round trip,
  not two. A crash before that commit aborts the transaction: the call is left INTENDED, which recovery
  classifies OUTCOME_UNKNOWN and the resumed run reconciles by key with the provider — the effect is neither
  repeated nor lost. Tools without ``reconcile()``, FAILED and RECONCILED outcomes are always committed before
  ``call`` returns, as is everything with ``outcome_commit="strict"``.
* A **non-durable** event (RUN_STARTED, NODE_*, MESSAGE, USER_CORRECTION, read-only tool calls)
  returns once queued; it is committed by the next durable event, by the keeper thread when the
  transaction is ``max_txn_age_ms`` old (default 1000 ms), or by ``flush()`` / ``close()``.
  Trade-off: a crash can lose the last ≤ ~``max_txn_age_ms`` of non-durable events (the broker
  aborts the open transaction), but never reorders or gaps a run — a lost tail is a clean tail,
  and consumers read ``read_committed``. A side effect is never in that window: its intent commits
  before the tool runs.
* The partition is ``murmur2(run_id) % partitions`` (``runjournal.schemas.keys``), passed
  explicitly; the count is read at start and re-read every ``metadata_check_interval_s`` and
  after a delivery error; a change stops publishing with ``PartitionCountChangedError``.
* Fencing: the recovery job calls ``init_transactions()`` with this instance's transactional id
  (``fence_producer``). The next transactional call here fails as fenced, and from then on every
  publish of this instance raises ``ProducerFencedError`` (checked under the publisher lock, so no
  thread slips a write past the fence). The same transactional.id is never initialised again:
  that would un-fence the zombie. A lapsed lease fences the instance the same way
  (``LeaseLapsedError``; *The instance's life*, below). Restart the process: a Journal started
  under the same producer_id is a new incarnation (``name#n``) with its own transactional id and lease.

**The instance's life**: lease heartbeat and lapse, broker fence, keeper thread. Threads (both daemons,
stopped by ``Journal.close``):

* **lease** — extends the instance's lease every ``ttl/3`` with a compare-and-set (``_lease.py``). A lapse
  (the key gone or holding another value, or Redis unreachable past the lease's validity) fences the
  instance for good: the thread ends, the publisher refuses every publish (``LeaseLapsedError``) and
  handles stop writing. A lapsed lease is never revived: the recovery job may already have listed the
  instance as stale, fenced it and handed its runs over. The process restarts as a new incarnation.
* **keeper** — commits a transaction open ``max_txn_age_ms``, checks the partition count every
  ``metadata_check_interval_s``, serves delivery callbacks.

A fence at the broker works the other way round: the lease is deleted (compare-and-delete) so that no
recovery pass hands runs to a fenced instance and the runs it still owns are recovered.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import orjson
import redis
from confluent_kafka import KafkaException

from runjournal.core import failpoints, kafka, otel
from runjournal.core.crypto.keys import KeyScope
from runjournal.core.crypto.token import is_encrypted
from runjournal.core.ids import AGENT, PRODUCER_ID, RUN_ID, TENANT_ID, USER_ID
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.model.stored import SCALAR_FIELD
from runjournal.producers._digest import canonical_value
from runjournal.producers._lease import InstanceLease
from runjournal.producers._port import OutcomeCommit
from runjournal.producers._txn import Item, TxnPublisher
from runjournal.producers.control import STOPS, ControlRequest, ControlStore
from runjournal.producers.encryption import CONTENT_FIELDS, ContentCrypto
from runjournal.producers.errors import (
    DeliveryError,
    JournalError,
    LeaseLapsedError,
    NoRecoveryPlanError,
    PartitionCountChangedError,
    ProducerFencedError,
    RunSurrenderedError,
    StalePlanError,
    TopicNotFoundError,
)
from runjournal.producers.fencing import default_producer_id, transactional_id
from runjournal.producers.handle import RunHandle
from runjournal.producers.metrics import NO_METRICS, JournalMetrics
from runjournal.producers.plan import PlanStore
from runjournal.producers.results import PayloadRef, ResultStore, digest_bytes, payload_key, split_chunks
from runjournal.producers.spend import SpendLedger
from runjournal.producers.streams import StreamWriter
from runjournal.producers.tracing import check_traceparent
from runjournal.schemas import Event, EventType
from runjournal.schemas.keys import partition_for

__all__ = ["Journal"]

log = logging.getLogger("runjournal.producers.journal")

SCOPES_KEPT = 16_384
"""How many *released* runs' key scopes a journal remembers (``Journal.scope_of``; ~100 bytes each), most recent
first — a live run's is kept until its release, so its content never falls back to the tenant's key."""


class Journal:
    """The agent-side journal: start or resume runs, publish their events durably. Thread-safe.

    Starts on construction: takes the instance lease (and starts its heartbeat thread), calls
    ``init_transactions()``, reads the events topic's partition count and starts the keeper thread
    (age-bounded commits, partition-count checks). Use as a context manager, or call :meth:`close`.

    Args:
        settings: ``runjournal.core.settings.Settings`` (bootstrap, redis_url, topic_prefix → events topic).
        producer_id: this instance's name (default ``{host}-{pid}-{8 hex}``; the rules of
            ``runjournal.core.ids.PRODUCER_ID``: at most 128 bytes, no ``#``, ``{ }`` or control character). Each
            Journal started
            under a name is a new **incarnation**: the n-th is the instance ``name`` (n = 1) or ``name#n``,
            and that instance id (``journal.producer_id``) is what events carry and what the transactional
            id, the lease, the owned set and the assignment list derive from (``runjournal.producers._lease``).
            A restart under the same name therefore never takes over the earlier incarnation's lease or
            runs: recovery fences that one and resumes its runs.
        codec: an ``runjournal.schemas.EventCodec`` (default ``runjournal.schemas.codec_from_settings(settings)``).
        redis_client: a Redis client (default: ``runjournal.core.redis_client.client(settings)`` — one server or a
            Redis Cluster, with the settings' ACL user and TLS).
        redis_prefix: Redis key prefix (default ``settings.topic_prefix``).
        lease_ttl_ms: lease TTL in ms (default 10 000); renewed every ttl/3.
        linger_ms: producer ``linger.ms`` (default 5).
        compression: producer ``compression.type`` (default ``lz4``).
        max_txn_age_ms: the keeper commits an open transaction this old, ms (default 1000) — the
            bound on how long a non-durable event stays uncommitted.
        metadata_check_interval_s: seconds between partition-count checks (default 30).
        commit_timeout_s: timeout of each commit/abort/init call, seconds (default 30).
        inline_result_bytes: results (and args) up to this many bytes of canonical JSON go inline in
            events; larger results go by reference to ``{prefix}.payloads`` (default 8192; see
            ``runjournal.producers.results``).
        queue_full_retries: bounded retries of a full local queue before ``QueueFullError`` (default 20).
        outcome_retries: bounded retries (50 ms doubling backoff) of the event stating a tool's outcome
            before ``OutcomeNotDurableError`` (default 5; the handle keeps the event and sends it first later).
        txn_settle_ms: a durable publish opening a transaction less than this many ms after the last
            commit waits out the rest (default 0: off). Right after a commit a slow (cold or loaded)
            broker is still writing markers and librdkafka answers the next AddPartitionsToTxn's
            CONCURRENT_TRANSACTIONS with a fixed 20 ms backoff. Measured on the local 1-node broker:
            back-to-back durable publishes p50 ~35 ms cold vs ~4 ms warm with 0; ~9-14 ms either way
            with 5. Set it when your brokers show the cold profile.
        outcome_commit: ``"group"`` or ``"strict"`` (default: ``settings.outcome_commit``, env
            ``RUNJOURNAL_OUTCOME_COMMIT``, itself ``"group"``). ``group``: a reconcilable tool's TOOL_CALL_COMMITTED
            rides the next commit (module docstring; docs/guide/side-effect-boundary.md); ``strict``: every
            outcome is committed before ``call`` returns (two round trips per call).
        outcome_linger_ms: in group mode, the longest a deferred outcome waits for another commit before the
            keeper commits it, ms (default 20): the bound on the window in which a crash leaves a call
            OUTCOME_UNKNOWN rather than COMMITTED. Costs the caller nothing; a commit per call when calls are
            further apart than this.
        producer_config: extra librdkafka settings (override the defaults above).
        metrics: opt-in Prometheus metrics (``runjournal.producers.metrics.JournalMetrics``: the host
            application's registry, or a port of its own); default None exports nothing.
        on_acked: called after every committed transaction with ``[(key, partition, offset)]`` of the events
            it held on the events topic (offsets from the delivery reports, -1 when none was served; records on
            other topics — framework records, large results' chunks — are not reported): what the broker acknowledged
            to this instance, e.g. for an independent witness (``runjournal demo`` writes it to an ack log).
            Runs on the publishing thread under the publisher's lock: it must be quick and must not raise.
        hold_after_s: a durable wait (``RunHandle.sleep``, ``wait_signal``) longer than this many seconds releases
            the run (``RunWaitingError``) instead of holding a thread; the recovery service resumes it when it ends
            (default 30; docs/design/decisions/0050-durable-waits.md).
        connect_timeout_s: how long the first answers of Redis (a PING, when the Journal builds its own client)
            and of a broker (a metadata request) may take at start, seconds (default 5); past it,
            ``StackUnavailableError`` names the setting and ``runjournal stack up``.
        content: how events' content fields are sealed and read back (default: ``ContentCrypto(settings)`` —
            encrypted with ``RUNJOURNAL_ENCRYPTION=on`` under the local key directory;
            docs/design/decisions/0059-encryption-and-crypto-shredding.md). An application with its own key service
            passes ``ContentCrypto(settings, cipher=FieldCipher(its_kms))``.

    Raises:
        StackUnavailableError: Redis (``RUNJOURNAL_REDIS_URL``) or every broker (``RUNJOURNAL_BOOTSTRAP``) did not
            answer within ``connect_timeout_s`` (``runjournal.core.errors``; the message names the setting and
            ``runjournal stack up``).
        ConfigError: Redis or the broker refused the credentials or the TLS handshake (the settings named);
            ``RUNJOURNAL_KMS`` names a key service not built in this release (with encryption on).
        TopicNotFoundError: the events topic does not exist.
        FatalProducerError: ``init_transactions`` failed.
        JournalError: no free incarnation of ``producer_id`` (16 live leases hold the next ids).
        InvalidIdError: ``producer_id`` breaks its rules (``#``, braces, a control character …), before the lease.
        ValueError: ``outcome_commit`` is neither ``group`` nor ``strict``;
            ``outcome_linger_ms`` or ``connect_timeout_s`` is not positive.
        redis.RedisError: a given ``redis_client`` is unreachable.
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
        outcome_retries: int = 5,
        txn_settle_ms: float = 0.0,
        outcome_commit: OutcomeCommit | None = None,
        outcome_linger_ms: float = 20.0,
        producer_config: dict[str, Any] | None = None,
        metrics: JournalMetrics | None = None,
        on_acked: Callable[[list[tuple[str, int, int]]], None] | None = None,
        connect_timeout_s: float = 5.0,
        hold_after_s: float = 30.0,
        content: ContentCrypto | None = None,
    ) -> None:
        if codec is None:
            from runjournal.schemas import codec_from_settings

            codec = codec_from_settings(settings)
        probe_redis = redis_client is None
        if redis_client is None:
            from runjournal.core import redis_client as redis_clients

            redis_client = redis_clients.client(settings)
        self.settings = settings
        otel.apply_setting(settings.tracing)  # Settings(tracing=...) given in code (docs/guide/tracing.md)
        prefix = redis_prefix or settings.topic_prefix
        # Arguments checked before the lease: a Journal that fails to start must leave no live-looking instance
        # behind (recovery would hand runs to it until its lease expired).
        name = PRODUCER_ID.check(default_producer_id() if producer_id is None else producer_id)
        mode = settings.outcome_commit if outcome_commit is None else outcome_commit
        if mode not in ("group", "strict"):
            raise ValueError(f"outcome_commit must be 'group' or 'strict', got {mode!r}")
        if outcome_linger_ms <= 0:
            raise ValueError(f"outcome_linger_ms must be > 0, got {outcome_linger_ms}")
        if hold_after_s < 0:
            raise ValueError(f"hold_after_s must be >= 0, got {hold_after_s}")
        if connect_timeout_s <= 0:
            raise ValueError(f"connect_timeout_s must be > 0, got {connect_timeout_s}")
        # the content fields' encryption (decision 0059): a key service not built is a ConfigError before the lease
        self.content = content if content is not None else ContentCrypto(settings)
        """Seals every published event's content fields (encrypting with ``RUNJOURNAL_ENCRYPTION=on``) and opens
        what this journal reads back (``runjournal.producers.encryption``)."""
        self._live_scopes: dict[str, KeyScope] = {}
        """run id → whose key seals the run's content: its tenant and subject (RUN_STARTED ``user_id``, or the
        plan's), for every run this journal started or resumed and has not released (:meth:`release_run`): a live
        run never falls back to its tenant's key, however many runs start after it."""
        self._scopes: OrderedDict[str, KeyScope] = OrderedDict()
        """The same for the :data:`SCOPES_KEPT` runs released last (a framework may still write a finished run's
        thread)."""
        self._scopes_lock = threading.Lock()
        if probe_redis:  # a Redis that does not answer: named within connect_timeout_s, not a redis-py traceback
            from runjournal.core import redis_client as redis_clients

            redis_clients.probe(settings, timeout_s=connect_timeout_s)
        # Lease first: a new incarnation's own instance id (init_transactions() with the transactional id of
        # a live instance would fence it), heartbeating at once (a cold broker's first init can outlast a TTL).
        self._lease = InstanceLease(redis_client, prefix, name, lease_ttl_ms)
        self.producer_id = self._lease.acquire(lambda instance: transactional_id(settings, instance))
        """This incarnation's instance id (``name`` or ``name#n``): events, transactional id, lease, owned set."""
        try:  # nothing below may leave a live-looking instance behind: the lease goes with any failure
            self.name = self._lease.name
            """The producer_id this Journal was given."""
            self.incarnation = self._lease.incarnation
            """1 for the first Journal under ``name``, n for the n-th."""
            self.transactional_id = transactional_id(settings, self.producer_id)
            self.topic = settings.events_topic
            self.inline_result_bytes = inline_result_bytes
            self.hold_after_s = hold_after_s
            """A durable wait (``RunHandle.sleep`` / ``wait_signal``) longer than this (s) releases the run."""
            self.outcome_retries = outcome_retries
            self.run_events_warn = settings.run_events_warn
            """Events of a run past which it is reported once (``Settings.run_events_warn``; 0: never)."""
            self.run_events_max = settings.run_events_max
            """Events of a run past which new work is refused (``Settings.run_events_max``; 0: no limit)."""
            self._over_budget = 0
            self._over_budget_lock = threading.Lock()
            self.outcome_commit: OutcomeCommit = mode
            """``group`` or ``strict``: how a reconcilable tool's outcome is acknowledged (see the class docstring)."""
            self._outcome_linger_s = outcome_linger_ms / 1000
            self._codec = codec
            self.plans = PlanStore(redis_client, prefix)
            self._redis = redis_client
            self._prefix = prefix
            self.results = ResultStore(redis_client, prefix, settings)
            self._spend: SpendLedger | None = None
            self.max_result_bytes = settings.max_result_bytes
            """Largest result (and call arguments) recorded, bytes (``Settings.max_result_bytes``)."""
            self._max_txn_age_s = max_txn_age_ms / 1000
            self._metadata_interval_s = metadata_check_interval_s
            self._fence_count = 0
            self._lapse_lock = threading.Lock()
            self._lapse_done = False
            self._partition_error: PartitionCountChangedError | None = None
            self._closed = False
            self._streams: StreamWriter | None = None
            self._compression = compression
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
                on_acked=on_acked,
            )
            self.partitions = 0
            """The events topic's partition count, read at start."""
            self._partition_of: dict[str, int] = {}
            """run_id -> partition for ``self.partitions`` (``_memoise_partition``)."""
            self._run_locks: dict[str, threading.RLock] = {}
            self._run_locks_guard = threading.Lock()
            self._surrendered: dict[str, int] = {}
            """run_id -> the epoch this instance gave up (:meth:`surrender`): nothing of it at or below is published."""
            self._surrenders = 0
            self.controls = ControlStore(redis_client, prefix)
            """Operators' cancel / pause requests (``runjournal.producers.control``)."""
            self._requests: dict[str, ControlRequest] = {}
            """run_id -> the operator request pending on it, as last read (replaced whole: read without a lock)."""
            self._controls_seen = -1
            self._seen_key = RedisKeys(prefix).control_seen(self.producer_id)
            self._stop = threading.Event()
            self._threads = [
                threading.Thread(target=self._heartbeat, name=f"journal-lease-{self.producer_id}", daemon=True),
                threading.Thread(target=self._keep, name=f"journal-keeper-{self.producer_id}", daemon=True),
            ]
            self._threads[0].start()
            try:
                self._txn.start(connect_timeout_s)  # no broker: StackUnavailableError within connect_timeout_s
                self.partitions = self._read_partition_count()
            except BaseException:
                self._stop.set()
                self._threads[0].join()
                raise
        except BaseException:
            self._lease.release()
            raise
        self._threads[1].start()
        self._metrics.attach(self)

    # -- properties ------------------------------------------------------------------------------
    @property
    def metrics(self) -> Any:
        """This instance's journal metrics (``runjournal.producers.metrics``; a no-op set unless given)."""
        return self._metrics

    @property
    def spend_ledger(self) -> SpendLedger:
        """This instance's spend ledger (``runjournal.producers.spend``): the tenant budgets ``RunHandle.reserve``
        checks, with the prices and default budgets of ``Settings.spend_*`` (made on first use)."""
        if self._spend is None:
            self._spend = SpendLedger(self._redis, self._prefix, self.settings.spend_policy())
        return self._spend

    @property
    def fence_count(self) -> int:
        """How many times this instance was found fenced; a handle created before a fence stops writing."""
        return self._fence_count

    @property
    def lapsed(self) -> bool:
        """True once this instance's lease lapsed: it is fenced for good (``LeaseLapsedError``)."""
        return self._lease.lapsed

    @property
    def stats(self) -> dict[str, int]:
        """Counters: ``commits``, ``aborts``, ``rebuilds``, ``fences``, ``lease_lapses``, ``surrendered`` (runs handed
        to the recovery job by :meth:`surrender`), ``runs_over_event_budget`` (runs that reached
        ``Settings.run_events_warn`` here: :meth:`event_budget_reached`)."""
        return {
            "commits": self._txn.commits,
            "aborts": self._txn.aborts,
            "rebuilds": self._txn.rebuilds,
            "fences": self._fence_count,
            "lease_lapses": self._lease.lapses,
            "surrendered": self._surrenders,
            "runs_over_event_budget": self._over_budget,
        }

    def event_budget_reached(self, run_id: str, seq: int) -> None:
        """A handle of ``run_id`` is about to publish its event ``seq``, at or past ``Settings.run_events_warn``
        (once per handle): log a warning and count ``runs_over_event_budget`` (README § Limits). Thread-safe."""
        with self._over_budget_lock:
            self._over_budget += 1
        log.warning("run %s reached its event budget: event %d, budget %d (RUNJOURNAL_RUN_EVENTS_WARN)%s", run_id,
                    seq, self.run_events_warn,
                    f"; new work is refused past {self.run_events_max} (RUNJOURNAL_RUN_EVENTS_MAX)"
                    if self.run_events_max else "")

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
        """Start a new run: claim its id, own it, publish RUN_STARTED (seq 1, epoch 1; non-durable).

        Every id and the input are checked first (``runjournal.core.ids``; docs/reference/identifiers.md), then the
        id is claimed (``rj:{P:r:<run_id>}:claim``, SET NX, in the same round trip as the owned-set add): an
        existing run is never started again under its id.

        Args:
            tenant_id: owning tenant (at most 128 bytes, no control character).
            agent: agent name (at most 128 bytes, no control character).
            input: the run's input, JSON values (recorded as canonical JSON; ``canonical_value``).
            run_id: the run's id (default: a uuid4; at most 256 bytes, no control character, no ``{ }``).
            user_id: the user who started it, if any (at most 256 bytes, no control character).
            traceparent: W3C trace context for every event of the run (default: the active
                ``runjournal.producers.tracing.current_traceparent`` at each emit).

        Returns:
            The run's :class:`RunHandle`.

        Raises:
            InvalidIdError: an id breaks its rules; nothing was claimed or published.
            NonCanonicalValueError: ``input`` has no exact canonical JSON form (a set, NaN, a datetime …).
            RunExistsError: ``run_id`` is the id of an existing run (continue a failed run with
                ``runjournal.consumers.recovery.continue_run``); nothing was published.
            LeaseLapsedError: this instance's lease lapsed (restart it).
            ValueError: a malformed ``traceparent``. Otherwise as ``RunHandle.emit``.
        """
        run_id = str(uuid.uuid4()) if run_id is None else RUN_ID.check(run_id)
        TENANT_ID.check(tenant_id)
        AGENT.check(agent)
        USER_ID.check_optional(user_id)
        input_json = canonical_value(input, "input")
        traceparent = check_traceparent(traceparent)
        self._raise_if_lapsed()
        self._lease.claim_run_id(run_id)
        try:
            return RunHandle.start_new(
                self,
                run_id=run_id,
                tenant_id=tenant_id,
                agent=agent,
                input_json=input_json,
                user_id=user_id,
                traceparent=traceparent,
            )
        except BaseException:
            self.release_run(run_id)
            self._lease.unclaim_run_id(run_id)  # RUN_STARTED was not produced: the id is free again
            raise

    def resume(self, run_id: str, *, traceparent: str | None = None) -> RunHandle:
        """Continue a run the recovery job handed to this instance (``runjournal.producers.plan``).

        The handle writes with ``plan.epoch`` from ``seq = plan.last_seq + 1``; ``call`` follows the
        plan's per-call classification. Publishes nothing by itself (RUN_RESUMED is the recovery job's).

        Raises:
            InvalidIdError: ``run_id`` breaks the run-id rules (a run started before them whose id holds a control
                character or braces: its keys may be another run's; recovery parks such a run).
            NoRecoveryPlanError: no plan for ``run_id``, or the plan is assigned to another instance.
            EncryptedContentError: the run's recorded content is encrypted and this journal cannot open it (no key
                directory, a destroyed key: docs/guide/encryption.md); nothing was owned.
            LeaseLapsedError: this instance's lease lapsed (restart it).
            ValueError: a malformed ``traceparent``.
        """
        RUN_ID.check(run_id)
        self._raise_if_lapsed()
        plan = self.plans.get(run_id)
        if plan is None:
            raise NoRecoveryPlanError(f"no recovery plan for run {run_id} ({self.plans.plan_key(run_id)})")
        if plan.assigned_to not in (None, self.producer_id):
            raise NoRecoveryPlanError(
                f"the plan of run {run_id} is assigned to {plan.assigned_to}, not {self.producer_id}"
            )
        gave_up = self._surrendered.get(run_id)
        if gave_up is not None and plan.epoch <= gave_up:
            raise StalePlanError(
                f"this instance surrendered run {run_id} at epoch {gave_up}; the plan resumes epoch {plan.epoch}: wait "
                "for the recovery job to hand it over under a new epoch", plan_epoch=plan.epoch, newest_epoch=gave_up)
        newest = self._projected_epoch(run_id)
        if newest is not None and newest > plan.epoch:
            raise StalePlanError(
                f"the plan of run {run_id} resumes epoch {plan.epoch} but the journal already shows epoch {newest}: "
                "a later recovery took the run; this instance must not write it", plan_epoch=plan.epoch,
                newest_epoch=newest)
        plan = self.content.open_plan(plan)  # the handle works with plain text (EncryptedContentError: no key)
        self._note_scope(run_id, KeyScope(plan.tenant_id, plan.user_id))
        self._lease.own(run_id)
        self._note_request(run_id)
        self._mark_stream_gap(run_id, plan.epoch)
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

    @property
    def streams(self) -> StreamWriter:
        """This instance's writer of ``{prefix}.streams`` (``run.stream()``; its producer is made on first use)."""
        if self._streams is None:
            self._streams = StreamWriter(self.settings, self._redis, self._prefix, self._memoise_partition,
                                         content=self.content, scope_of=self.scope_of,
                                         compression=self._compression)
        return self._streams

    def _mark_stream_gap(self, run_id: str, epoch: int) -> None:
        """The gap a dead epoch left in the run's stream (``StreamWriter.mark_gap``); a failure is logged, not
        raised: the stream is not the run, and the handle's first ``run.stream()`` tries again."""
        try:
            self.streams.mark_gap(run_id, epoch)
        except Exception as exc:  # noqa: BLE001 - streams never stop a resume
            log.warning("run %s: could not mark its stream's gap at resume: %s", run_id, exc)

    def _projected_epoch(self, run_id: str) -> int | None:
        """The run's epoch in its projected state (Redis), or None when not projected (the projector may lag: a
        missing or older state never refuses a plan; only a newer epoch does)."""
        key = RedisKeys(self._prefix).run(self._memoise_partition(run_id), run_id)
        try:
            raw = self._redis.hget(key, SCALAR_FIELD)  # the run's hash: its scalar field holds the epoch
        except redis.ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
            raw = self._redis.get(key)  # a projection written before the hash: the whole state as JSON
        if raw is None:
            return None
        try:
            return int(orjson.loads(raw)["epoch"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None

    def probe_lease(self, window_ms: int = 0) -> Future[bool]:
        """Start reading this instance's lease (one Redis script in the lease's probe thread) for a later
        :meth:`check_still_owner`, so the read overlaps the intent's commit instead of following it.

        Args:
            window_ms: the ``timeout_ms`` of the tool whose request follows: the same script raises the instance's
                effect window to cover it (``rj:{P:i:<instance>}:window``; docs/design/protocol.md § Zombies).
        """
        return self._lease.probe(window_ms)

    def check_still_owner(self, probe: Future[bool] | None = None, window_ms: int = 0) -> None:
        """Raise ``LeaseLapsedError`` unless this instance still holds its lease.

        Called between a side effect's acknowledged intent and the tool: an instance paused past its
        lease TTL (GC, SIGSTOP) may have been declared dead and its runs handed over; it must not send
        the request now. Two checks, both must pass:

        * the lease's **local validity**: ``lease_ttl_ms`` since the last successful renewal began has not
          passed. The key cannot have expired in Redis before that, so a pause long enough for recovery to
          find the instance dead (its key gone) always fails here, however long ago the GET below was sent;
        * the key still holds this instance's value: the answer of ``probe`` (:meth:`probe_lease`, sent before
          the intent's commit and read after it: the GET costs the call nothing) or, without one, a GET now
          (~0.2 ms). This catches what the clock cannot: the key deleted or overwritten (a forced
          ``recover --instance``, a Redis that lost it).

        With ``window_ms`` (the tool's ``timeout_ms``), the same read raised the instance's effect window so the
        recovery job waits out a request sent now by Redis's clock (docs/design/protocol.md § Zombies); a window
        that could not be raised (Redis unreachable, none stored that covers it) counts as a lost lease.

        A lost lease fences the whole instance (as the heartbeat does). This narrows, but cannot close, the
        window between check and send — only the provider can close it, by honouring the idempotency key or a
        fencing token (the run's epoch; docs/design/protocol.md § Zombies, step 3). Redis unreachable: the lease
        counts as held only within ``lease_ttl_ms`` of its last renewal.
        """
        ours = probe.result() if probe is not None else self._lease.still_ours(window_ms)
        if ours and window_ms > self._lease.window_ms:  # the answer came from the local clock: no window stored
            self._lease.mark_lapsed(f"the effect window could not be raised to {window_ms} ms before a tool call")
            ours = False
        if not ours:
            self._lapse("the lease was lost before a tool call")
        elif self._lease.expired_locally():
            self._lease.mark_lapsed("the lease's validity ran out before a tool call (paused past its TTL?)")
            self._lapse("the lease's validity ran out before a tool call")
        self._raise_if_lapsed()

    def run_lock(self, run_id: str) -> threading.RLock:
        """The lock of ``run_id`` in this instance: every handle of the run and the framework record stores writing
        it (``runjournal.adapters``) hold it while they decide and publish, so threads and tasks sharing a run write
        one at a time (docs/operations/concurrency.md). Forgotten when the run ends here (:meth:`release_run`)."""
        with self._run_locks_guard:
            lock = self._run_locks.get(run_id)
            if lock is None:
                lock = self._run_locks[run_id] = threading.RLock()
            return lock

    def surrender(self, handle: RunHandle, why: str | None = None) -> None:
        """Give ``handle``'s run up to the recovery job, visibly, without stopping this instance: the handle broke
        (an event's fate is unknown, so its seq cannot be reused) and nothing of the run at its epoch may be
        written here again (docs/design/protocol.md § Surrender). Returns at once; a daemon thread then, in order:

        1. waits until every side-effect request the handle sent has returned (``RunHandle.wait_idle``; a broken
           handle sends none), so no request of the run can still act when it is handed over;
        2. commits the open transaction (up to 5 tries), so nothing of the run is in flight when the recovery job
           reads the partition's end offset;
        3. moves the run from the owned set to ``rj:{P:i:<instance>}:surrendered`` (one script, while the lease is
           ours). The next ``recover --stale`` pass resumes it under a new epoch, fencing nobody, possibly back to
           this instance (:meth:`resume` refuses the old epoch).

        If a step fails for good (this instance was fenced, its lease lapsed, commits keep failing, Redis stays
        away) the run stays owned here and is recovered as any dead instance's when this instance stops — logged
        as an error. Publishing an event of the run at an epoch given up raises ``RunSurrenderedError``.

        ``why``: what the log says (default: the handle lost an event). An operator's pause gives a run up the same
        way (``RunHandle``, docs/design/decisions/0047-operator-controls.md): the recovery job then holds it for
        nobody instead of resuming it.
        """
        with self._run_locks_guard:
            if self._surrendered.get(handle.run_id, 0) >= handle.epoch:
                return
            self._surrendered[handle.run_id] = handle.epoch
        handle.end_trace("surrendered")
        threading.Thread(target=self._hand_back, args=(handle, why or "it lost an event"),
                         name=f"journal-surrender-{self.producer_id}", daemon=True).start()

    def _hand_back(self, handle: RunHandle, why_given: str) -> None:
        """:meth:`surrender`'s steps 1-3 (its own thread)."""
        run_id, epoch = handle.run_id, handle.epoch
        handle.wait_idle()
        why = ""
        for attempt in range(5):
            if self._closed or self._lapse_done or self._lease.lapsed:
                why = "this instance stopped or was fenced"
                break
            try:
                self._txn.flush()
                failpoints.hit("producers.surrender.after_flush")
                if self._lease.surrender(run_id, epoch):
                    with self._run_locks_guard:
                        self._surrenders += 1
                    log.warning("run %s (epoch %d): %s; handed to the recovery job (%s)", run_id, epoch, why_given,
                                RedisKeys(self._prefix).surrendered(self.producer_id))
                    return
                why = "the lease is no longer ours"
                break
            except Exception as exc:  # noqa: BLE001 - DeliveryError, redis.RedisError: tried again, then logged
                why = str(exc)
                time.sleep(0.2 * 2 ** attempt)
        log.error("run %s could not be handed to the recovery job (%s); it stays owned by %s and is recovered when "
                  "this instance stops", run_id, why, self.producer_id)

    # -- operators' requests (runjournal.producers.control) ---------------------------------------------------
    def request_for(self, run_id: str) -> ControlRequest | None:
        """The operator's cancel or pause request pending on ``run_id`` as this instance last read it (its heartbeat
        reads them every ``lease_ttl_ms / 3`` when the control version changed; :meth:`resume` reads the run's at
        once), or None. ``RunHandle`` checks it at every step boundary (docs/design/decisions/0047). Only the
        requests an owner carries out (``control.STOPS``) are returned: a pending resume is the recovery job's, and an
        action this version does not know is not taken for a stop."""
        request = self._requests.get(run_id)
        return request if request is not None and request.action in STOPS else None

    def _refresh_requests(self) -> None:
        """Heartbeat: when the control version moved, read the requests of the runs this instance holds, then record
        the version as seen (``rj:{P:i:<instance>}:ctlseen``: an operator waits for it). Errors are logged: the next
        beat reads again."""
        try:
            version = self.controls.version()
            if version != self._controls_seen:
                with self._run_locks_guard:
                    runs = list(self._run_locks)
                self._requests = self.controls.get_many(runs)
                self._redis.set(self._seen_key, version, px=max(60_000, 6 * self._lease.ttl_ms))
                self._controls_seen = version
        except Exception as exc:  # noqa: BLE001 - Redis away: requests are read again on the next beat
            log.warning("could not read operators' requests: %s", exc)

    def _note_request(self, run_id: str) -> None:
        """Read ``run_id``'s pending request now (a run taken by :meth:`resume`: a request stored while nobody owned
        it must stop it before its first step)."""
        request = self.controls.get(run_id)
        requests = dict(self._requests)
        if request is None:
            requests.pop(run_id, None)
        else:
            requests[run_id] = request
        self._requests = requests

    def request_done(self, request: ControlRequest) -> None:
        """Remove a request this instance carried out (its event is durable); errors are logged (whoever finds it
        next — this instance, the recovery job — finds the run ended and removes it)."""
        try:
            self.controls.done(request)
        except Exception as exc:  # noqa: BLE001 - left for the next reader: harmless
            log.warning("could not remove the carried-out %s request of run %s: %s", request.action,
                        request.run_id, exc)
        requests = dict(self._requests)
        if requests.get(request.run_id) == request:
            del requests[request.run_id]
            self._requests = requests

    def claim_assignment(self, timeout_s: float) -> str | None:
        """The next run id assigned to this instance, waiting up to ``timeout_s`` seconds; None if none."""
        return self.plans.claim_assignment(self.producer_id, timeout_s)

    def release_run(self, run_id: str) -> None:
        """Remove ``run_id`` from the owned set (after its terminal event); Redis errors are only logged."""
        with self._run_locks_guard:
            self._run_locks.pop(run_id, None)
        self._retire_scope(run_id)
        try:
            self._lease.disown(run_id)
        except Exception as exc:  # noqa: BLE001 - a hint only; the terminal event is already durable
            log.warning("could not remove run %s from %s: %s", run_id, self._lease.owned_key, exc)

    # -- publishing ----------------------------------------------------------------------------------
    def publish(
        self, event: Event, *, durable: bool, on_lost: Callable[[DeliveryError], None] | None = None,
        deferred: bool = False, smaller: Callable[[], Event | None] | None = None,
    ) -> None:
        """Low-level: publish one encoded event into the open transaction (used by RunHandle).

        Args:
            event: the event; its key is ``event.key`` and its partition ``murmur2(run_id) % partitions``.
            durable: commit the transaction (broker ack) before returning.
            on_lost: called if the event, once accepted, is later lost (it could not be re-produced).
            deferred: (with ``durable=False``) a tool's outcome riding the next commit: the keeper commits
                it within ``outcome_linger_ms`` if no durable publish does first (``outcome_commit="group"``).
            smaller: the same event with its result by reference (same event_id and seq), produced instead if
                the broker refuses this one for its size (``runjournal.producers._txn``, *When a transaction fails*).

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
        gave_up = self._surrendered.get(event.run_id) if self._surrendered else None
        if gave_up is not None and event.epoch <= gave_up:
            raise RunSurrenderedError(f"run {event.run_id} was surrendered to the recovery job at epoch {gave_up}; "
                                      f"this instance writes nothing more of it at epoch {event.epoch}")
        if event.type is EventType.RUN_STARTED:
            self._note_scope(event.run_id, KeyScope(event.tenant_id, event.payload.get("user_id")))
        if event.type in CONTENT_FIELDS:  # encrypted (or escaped) here, after every digest was taken of the text
            event = self.content.seal(event, self.subject_of(event.run_id))
            if smaller is not None:
                smaller = self._sealed(smaller)
        value = self._codec.encode(event, topic=self.topic)
        headers = [("traceparent", event.traceparent.encode("ascii"))] if event.traceparent else None
        partition = self._partition_of.get(event.run_id)
        if partition is None:
            partition = self._memoise_partition(event.run_id)
        item = Item(event.run_id, event.key, value, partition, headers, durable, on_lost, 0, None,  # positional:
                    None if smaller is None else self._encoder_of(smaller), deferred, event.seq,  # cheapest on
                    event.event_id)  # this path
        metered = self._metrics is not NO_METRICS  # without metrics, no clock reads and no no-op call per event
        started = time.perf_counter() if metered else 0.0
        try:
            gen = self._txn.publish(item)
            if durable:
                if event.type is EventType.TOOL_CALL_INTENDED:
                    failpoints.hit("producers.call.before_intent_commit")  # produced, not yet acknowledged
                self._txn.commit_through(gen)
        except DeliveryError:
            self._check_partition_count()
            raise
        if metered:
            self._metrics.published(self.producer_id, event, durable=durable, seconds=time.perf_counter() - started)

    def _sealed(self, make: Callable[[], Event | None]) -> Callable[[], Event | None]:
        """``make``'s event sealed like the event it replaces."""
        def sealed() -> Event | None:
            event = make()
            return None if event is None else self.content.seal(event, self.subject_of(event.run_id))
        return sealed

    def subject_of(self, run_id: str) -> str | None:
        """The subject (user id) whose key encrypts ``run_id``'s content, as this journal knows it (None: the
        tenant's key)."""
        scope = self.scope_of(run_id)
        return None if scope is None else scope.subject

    def scope_of(self, run_id: str) -> KeyScope | None:
        """Whose key seals ``run_id``'s content (tenant and subject), for a run this journal started or resumed
        (live, or one of the last :data:`SCOPES_KEPT` released); None otherwise."""
        scope = self._live_scopes.get(run_id)
        return scope if scope is not None else self._scopes.get(run_id)

    def _note_scope(self, run_id: str, scope: KeyScope) -> None:
        with self._scopes_lock:
            self._live_scopes[run_id] = scope
            self._scopes.pop(run_id, None)

    def _retire_scope(self, run_id: str) -> None:
        """A released run's scope: from the live runs' to the bounded memory of finished ones."""
        with self._scopes_lock:
            scope = self._live_scopes.pop(run_id, None)
            if scope is None:
                return
            self._scopes[run_id] = scope
            self._scopes.move_to_end(run_id)
            while len(self._scopes) > SCOPES_KEPT:
                self._scopes.popitem(last=False)

    def _encoder_of(self, make: Callable[[], Event | None]) -> Callable[[], bytes | None]:
        """``make``'s event encoded for this journal's topic (None when ``make`` has none)."""
        def encoded() -> bytes | None:
            event = make()
            return None if event is None else self._codec.encode(event, topic=self.topic)
        return encoded

    def publish_record(self, topic: str, key: str, value: bytes | None, *, run_id: str, durable: bool) -> None:
        """Low-level: produce one record to another topic **in the same transaction** as the run's events.

        For records that belong with a run but are not events of its stream (an adapter's framework state, e.g.
        LangGraph checkpoints on ``{prefix}.checkpoints``): they commit and abort with the journal's events and
        are fenced with them — a fenced or lapsed instance can write none. The partition is
        ``murmur2(run_id) % partitions`` of the events topic (the other topic must have as many partitions).

        Args:
            topic: the topic (must exist).
            key: the record key (UTF-8).
            value: the record value; None writes a tombstone (compacted topics).
            run_id: the run the record belongs to (partitioning, and lost-record tracking).
            durable: commit the transaction (broker ack) before returning.

        Raises:
            As :meth:`publish` (without the codec's errors).
        """
        if self._closed:
            raise JournalError("the journal is closed")
        item = Item(run_id, key, value, partition_for(run_id, self.partitions), None, durable, None, topic=topic)
        gen = self._txn.publish(item)
        if durable:
            self._txn.commit_through(gen)

    def publish_payload(self, run_id: str, text: str) -> str:
        """Low-level: write a large result to ``{prefix}.payloads`` and return its reference (used by RunHandle).

        The text (UTF-8) is cut into records of ``Settings.payload_chunk_bytes``, keyed
        ``runjournal.producers.results.payload_key`` under a fresh payload id, produced in order into the open
        transaction on the run's partition, and committed (the transaction commits whatever else it holds, as a
        durable publish does); the reference names the committed records' offsets from their delivery reports and
        the text's sha256 (``runjournal.producers.results``). Redis is not written (it caches results read back:
        a write-time copy of every large result would double its I/O and hold it in Redis's memory). The
        event that carries the reference is published after this returns, in a later transaction (decision 0052).

        Raises:
            ValueError: the text is over ``Settings.max_result_bytes`` (the handle checks first; a sealed result's
                token may be 4/3 of it); nothing produced.
            As :meth:`publish` (without the codec's errors); DeliveryError when a record's offset never came back.
        """
        if self._closed:
            raise JournalError("the journal is closed")
        data = text.encode("utf-8")
        sha = digest_bytes(data)
        # the handle checked the plain text against max_result_bytes; its token (decision 0059) is base64, 4/3 of it
        limit = self.max_result_bytes * 4 // 3 + 1024 if is_encrypted(text) else self.max_result_bytes
        if len(data) > limit:
            raise ValueError(f"a {len(data)}-byte result is over max_result_bytes ({self.max_result_bytes})")
        payload_id = PayloadRef.new_id()
        partition = self._partition_of.get(run_id)
        if partition is None:
            partition = self._memoise_partition(run_id)
        topic = self.settings.payloads_topic
        items = [Item(run_id, payload_key(run_id, payload_id, i), piece, partition, None, True, None, topic=topic)
                 for i, piece in enumerate(split_chunks(data, self.settings.payload_chunk_bytes))]
        del data
        keys = [i.key for i in items]
        gen = self._txn.publish_all(items)
        try:
            self._txn.await_delivery(keys)  # in the broker's log, in the open transaction
            failpoints.hit("producers.result.before_payload_commit")  # records produced, their commit not acknowledged
            self._txn.commit_through(gen)
        except BaseException:
            self._txn.offsets_of(keys, timeout_s=0)  # forget them
            raise
        offsets = self._txn.offsets_of(keys)
        if min(offsets) < 0 or offsets != sorted(offsets):
            raise DeliveryError(f"run {run_id}: the payload's records committed without usable delivery offsets "
                                f"({offsets[:3]}…); the result is written again under a new id on a retry")
        return str(PayloadRef(partition, offsets[0], offsets[-1], len(items), payload_id, sha))

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
        self._txn.deferred_arrived.set()  # wake the keeper
        for thread in self._threads:
            thread.join(timeout_s)
        if self._streams is not None:
            self._streams.close(timeout_s)
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

    # -- instance life: lease, fence, keeper -----------------------------------------------------------------
    def _raise_if_lapsed(self) -> None:
        """Raise ``LeaseLapsedError`` after a lapse, ``ProducerFencedError`` after a fence at the broker."""
        if self._lease.lapsed:
            self._lapse("the lease lapsed")  # idempotent: fences the publisher if the heartbeat has not yet
            raise LeaseLapsedError(
                f"instance {self.producer_id} lost its lease {self._lease.key}: it may have been declared dead "
                "and its runs handed over; it is fenced — restart it (a new incarnation)")
        if self._lapse_done:
            raise ProducerFencedError(f"instance {self.producer_id} was fenced at the broker; restart it")

    def _fenced(self) -> None:
        """Called under the publisher lock when the broker fenced this instance: its runs belong to a recovery
        job now. The lease goes too (compare-and-delete), so no recovery pass assigns runs to a fenced
        instance and the runs it still owns are recovered as any dead instance's are."""
        with self._lapse_lock:
            self._lapse_done = True
            self._fence_count += 1
        try:
            self._lease.release()
        except Exception as exc:  # noqa: BLE001 - it expires by itself (the heartbeat has stopped renewing)
            log.warning("could not delete lease %s after the fence: %s", self._lease.key, exc)
        log.error(
            "instance %s was fenced (%s); its open runs stop writing", self.producer_id, self.transactional_id
        )

    def _read_partition_count(self) -> int:
        """The events topic's partition count, checked against the count the journal was created with (the topic
        identity the projector or the recovery job stored, ``rj:<prefix>:topic``): a topic whose partitions were
        added since would place this instance's runs elsewhere than their earlier events
        (docs/design/protocol.md § Topic layout).

        Raises:
            TopicNotFoundError: no events topic.
            PartitionCountChangedError: the count is not the journal's (``at_start``).
        """
        count = self._txn.partition_count(10.0)
        if count is None:
            self._txn.close(1.0)
            raise TopicNotFoundError(f"topic {self.topic} does not exist (run `runjournal topics create`)")
        raw = self._redis.get(RedisKeys(self._prefix).topic_identity())
        stored = _stored_partitions(raw)
        if stored is not None and stored != count:
            self._txn.close(1.0)
            raise PartitionCountChangedError(topic=self.topic, expected=stored, actual=count, at_start=True)
        return count

    def _memoise_partition(self, run_id: str) -> int:
        """``partition_for(run_id, self.partitions)``, remembered in ``_partition_of``: a pure function of the run
        and the partition count, which is read once at start (a change stops publishing: ``_partition_error``).
        At most 65,536 runs are kept (then it starts over)."""
        if len(self._partition_of) >= 65_536:
            self._partition_of.clear()
        partition = self._partition_of[run_id] = partition_for(run_id, self.partitions)
        return partition

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
        """Lease thread: extend the lease every ttl/3 (compare-and-set); separate, so a slow commit cannot
        starve it. A lapse — the key gone or another value, or Redis unreachable past the lease's validity —
        fences the instance and ends the thread: a lapsed lease is never revived."""
        every_s = self._lease.ttl_ms / 3000
        while not self._stop.wait(every_s):
            try:
                if not self._lease.renew():
                    break
            except Exception as exc:  # noqa: BLE001 - Redis unreachable: the local clock decides
                if self._lease.expired_locally():
                    self._lease.mark_lapsed(f"Redis unreachable past the lease's validity ({exc})")
                    break
                log.warning("lease renewal failed: %s", exc)
                continue
            self._refresh_requests()
        if self._lease.lapsed:
            self._lapse("the heartbeat found the lease lapsed")

    def _lapse(self, why: str) -> None:
        """Fence this instance for good after its lease lapsed (any thread; idempotent; a no-op once fenced)."""
        with self._lapse_lock:
            if self._lapse_done:
                return
            self._lapse_done = True
            self._fence_count += 1
        self._lease.mark_lapsed(why)
        self._txn.fence_locally(f"instance {self.producer_id} lost its lease {self._lease.key} ({why}); it is "
                                "fenced — restart it (it comes back as a new incarnation)")

    def _keep(self) -> None:
        """Keeper thread: age-bounded commits (``max_txn_age_ms``; ``outcome_linger_ms`` once the transaction
        holds a deferred outcome), partition-count checks, delivery callbacks."""
        tick_s = max(0.02, min(0.25, self._max_txn_age_s / 4))
        next_meta = time.monotonic() + self._metadata_interval_s
        arrived = self._txn.deferred_arrived
        while not self._stop.is_set():
            deferred_age = self._txn.deferred_age_s()
            wait_s = tick_s if deferred_age is None else max(0.0, self._outcome_linger_s - deferred_age)
            arrived.wait(min(tick_s, wait_s))
            arrived.clear()
            if self._stop.is_set():
                break
            deferred_age = self._txn.deferred_age_s()
            linger_over = deferred_age is not None and deferred_age >= self._outcome_linger_s
            if linger_over or self._txn.txn_age_s() >= self._max_txn_age_s:
                try:
                    self._txn.flush()
                except JournalError as exc:
                    log.warning("background commit failed: %s", exc)
            if time.monotonic() >= next_meta:
                next_meta = time.monotonic() + self._metadata_interval_s
                self._check_partition_count()
            self._txn.poll()


def _stored_partitions(raw: Any) -> int | None:
    """The ``partitions`` of a stored topic identity (JSON), or None (none stored, or unreadable)."""
    if not raw:
        return None
    try:
        return int(orjson.loads(raw)["partitions"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None

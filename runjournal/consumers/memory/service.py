"""The memory extractor: a consumer group turning journal events into advisory memory in Qdrant.

Its own group (``{prefix}.memory``), its own process: it may lag, fail or be down without slowing
or failing any run, the projector or recovery — it shares no client, no offsets and no store with
them. Per poll (numbered as in the code):

1. ``consume`` up to ``batch_size`` records (``read_committed``: aborted transactions are never seen).
2. Decode each record. An undecodable one is dead-lettered with its offset; a tombstone (erased
   event) cuts the batch into segments and erases the items extracted from that record.
3. Let the :class:`Extractor` find statements; for an event that yields any, the run's owner and context
   come from the journal itself (:class:`~runjournal.consumers.memory.owners.RunOwners`: RUN_STARTED, else
   the projection, else the run's partition — never only what this process happened to see). The
   service adds scope (tenant from the envelope, always) and provenance. An event without a tenant is
   dead-lettered: items without a tenant are refused at write.
4. Embed the segment's items in one call.
5. Upsert them (``wait=True``): deterministic ids, supersession settled in the store.
6. Flush the memory DLQ (durable before the offset passes a dead-lettered record).
7. Commit the group offset (last handled + 1).

Failures (steps 2-5) go through the one failure policy (``runjournal.consumers.runtime.failures``). An outage
(:class:`StoreUnavailableError`, registry unreachable, Redis or broker away) is waited out with capped
backoff, logged and counted, for up to ``max_outage_s`` (then the extractor stops non-zero naming the
dependency) — the offset does not move, so nothing is lost. Any other error is retried ``max_attempts``
times for the batch, then record by record (an undecodable record is not retried: the bytes will
not change); a record that still fails is dead-lettered to
``{prefix}.memory.dlq`` with its source offset. The offset never passes a record that was neither
written nor dead-lettered. Redelivery is harmless: writes are idempotent by point id.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import Consumer, Message, TopicPartition
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from runjournal.consumers.memory.extract import Extractor, RuleExtractor
from runjournal.consumers.memory.headroom import CpuHeadroom
from runjournal.consumers.memory.items import MemoryItem, Provenance, Scope
from runjournal.consumers.memory.metrics import ExtractorMetrics
from runjournal.consumers.memory.owners import RunOwners
from runjournal.consumers.memory.payload import point_id
from runjournal.consumers.memory.sealing import KeyGrant, MemoryCrypto
from runjournal.consumers.memory.store import QdrantMemoryStore
from runjournal.consumers.runtime.dlq import DeadLetters
from runjournal.consumers.runtime.failures import (
    TRANSIENT,
    DependencyUnavailableError,
    FailurePolicy,
    FatalDependencyError,
    classify,
    kafka_error_verdict,
    stops_consumer,
)
from runjournal.consumers.runtime.group import LagExport, commit_pending, group_consumer_config, partition_lags
from runjournal.consumers.runtime.topic_identity import TopicMismatchError
from runjournal.consumers.vectors.embed import Embedder, default_embedder
from runjournal.consumers.vectors.errors import MemoryPlaneError
from runjournal.core import kafka, otel
from runjournal.core.crypto.errors import EncryptedContentError
from runjournal.core.crypto.token import encode_plain
from runjournal.core.settings import Settings
from runjournal.schemas import EventCodec, codec_from_settings
from runjournal.schemas.errors import RegistryError
from runjournal.schemas.events import Event

__all__ = ["ExtractorStats", "MemoryExtractor", "memory_group"]

log = logging.getLogger("runjournal.consumers.memory")
T = TypeVar("T")


def memory_group(settings: Settings) -> str:
    """The memory extractor's consumer group id: ``{prefix}.memory``."""
    return f"{settings.topic_prefix}.memory"


@dataclass
class ExtractorStats:
    """Counters of one :meth:`MemoryExtractor.run` (events = records handled, including no-ops)."""

    events: int = 0
    items: int = 0
    dead_lettered: int = 0
    erased: int = 0
    retries: int = 0
    batches: int = 0
    embed_s: float = 0.0
    headroom_wait_s: float = 0.0
    elapsed_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-able summary with ``events_per_s`` and ``items_per_s`` (over ``elapsed_s``)."""
        def rate(n: int) -> float:
            return round(n / self.elapsed_s, 1) if self.elapsed_s > 0 else 0.0
        return {"events": self.events, "items": self.items, "dead_lettered": self.dead_lettered,
                "erased": self.erased, "retries": self.retries, "batches": self.batches,
                "embed_s": round(self.embed_s, 3),
                "headroom_wait_s": round(self.headroom_wait_s, 3), "elapsed_s": round(self.elapsed_s, 3),
                "events_per_s": rate(self.events), "items_per_s": rate(self.items)}


@dataclass
class _Unit:
    """One consumed record and what became of it."""

    msg: Message
    items: list[MemoryItem]
    sealed: bool = False
    """The items were drawn from encrypted content: they are stored sealed (``sealing.MemoryCrypto.seal_item``)."""


class MemoryExtractor:
    """Consumes ``{prefix}.events`` into a :class:`~runjournal.consumers.memory.store.QdrantMemoryStore`.

    Args:
        settings: bootstrap, topic prefix, Qdrant path or URL.
        store: where items go (default: :meth:`QdrantMemoryStore.open` with ``embedder``).
        embedder: default :func:`~runjournal.consumers.vectors.embed.default_embedder` (ignored when ``store`` is given:
            the store's embedder names the collection).
        extractor: default :class:`~runjournal.consumers.memory.extract.RuleExtractor`.
        batch_size: records per consume call (default 500).
        poll_timeout_s: consume timeout, seconds.
        group_id: consumer group (default ``{prefix}.memory``).
        max_attempts: tries of a non-outage failure before dead-lettering (default 4).
        backoff_base_s, backoff_cap_s: exponential backoff start and cap, seconds (0.1, 5.0).
        codec: event codec (default from settings).
        max_outage_s: longest one dependency outage is waited out before the extractor stops (s, 240).
        headroom: waited on before each batch after the first of a backlog (:class:`CpuHeadroom`; default None:
            no gate — ``runjournal memory-extractor`` builds one from ``memory_headroom_cores`` /
            ``memory_headroom_wait_ms``); the time waited is ``stats.headroom_wait_s`` and
            ``runjournal_memory_headroom_wait_seconds_total``.
        metrics: Prometheus families (default: a private registry; the CLI serves it with ``--metrics-port``); the
            failure policy's waits are counted in the same registry.
        key_grant: the tenants whose encrypted content is opened (default: ``RUNJOURNAL_MEMORY_KEY_GRANT``; empty:
            none, encrypted content makes no memory); items drawn from encrypted content are stored sealed
            (:mod:`runjournal.consumers.memory.sealing`, docs/guide/encryption.md § Memory).
        crypto: the opener and sealer to use with the grant (default: built from ``settings``' key service).

    Raises:
        StoreLockedError: local mode and the Qdrant directory is held by another process.
        EmbedderUnavailableError, ModelIntegrityError: the default embedder cannot be built.
        ConfigError: a key grant is given and the key service cannot be built (not in this release, or the
            ``cryptography`` package is missing).
    """

    def __init__(self, settings: Settings, *, store: QdrantMemoryStore | None = None,
                 embedder: Embedder | None = None, extractor: Extractor | None = None, batch_size: int = 500,
                 poll_timeout_s: float = 0.2, group_id: str | None = None, max_attempts: int = 4,
                 backoff_base_s: float = 0.1, backoff_cap_s: float = 5.0, codec: EventCodec | None = None,
                 session_timeout_ms: int = 10_000, max_outage_s: float = 240.0,
                 metrics: ExtractorMetrics | None = None, headroom: CpuHeadroom | None = None,
                 key_grant: KeyGrant | None = None, crypto: MemoryCrypto | None = None) -> None:
        self.settings = settings
        grant = key_grant if key_grant is not None else KeyGrant.parse(settings.memory_key_grant)
        self.crypto = crypto if crypto is not None else (MemoryCrypto(settings, grant) if grant else None)
        self.headroom = headroom
        self.topic = settings.events_topic
        self.store = store or QdrantMemoryStore.open(settings, embedder or default_embedder())
        self.embedder = self.store.embedder
        self.extractor = extractor or RuleExtractor()
        self.codec = codec or codec_from_settings(settings)
        self.owners = RunOwners(settings, self.codec,
                                opener=self.crypto.open_input if self.crypto is not None else None)
        self.batch_size = batch_size
        self.poll_timeout_s = poll_timeout_s
        self.max_attempts = max_attempts
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s
        self.group_id = group_id or memory_group(settings)
        self.dlq = DeadLetters(settings, settings.memory_dlq_topic)
        self.stats = ExtractorStats()
        self.metrics = metrics or ExtractorMetrics()
        self._lag_export = LagExport(self.metrics.lag)
        self._stop = threading.Event()
        self.policy = FailurePolicy("memory", log, registry=self.metrics.registry, max_wait_s=max_outage_s,
                                    backoff_base_s=backoff_base_s, backoff_cap_s=backoff_cap_s, stop=self._stop,
                                    on_wait=self._count_wait)
        self._done: dict[int, int] = {}
        self._pending_commit: dict[int, int] = {}
        self._assigned_once = threading.Event()
        self._mismatch: TopicMismatchError | None = None
        self.consumer = kafka.consumer(settings, **group_consumer_config(self.group_id,
                                                                         session_timeout_ms=session_timeout_ms))

    # -- assignment -------------------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in consumer.committed(partitions, timeout=10):
            _low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, tp.partition), timeout=10,
                                                        cached=False)
            if tp.offset > high:  # a stored offset beyond the log: another (re-created or truncated) topic
                self._mismatch = TopicMismatchError(
                    f"the memory group {self.group_id} committed offset {tp.offset} on partition {tp.partition} of "
                    f"{self.topic}, which ends at {high}: the topic was re-created or truncated",
                    repair=f"kafka-consumer-groups.sh --delete --group {self.group_id} (the extractor then re-reads "
                           "the topic; writes are idempotent by event id)")
                return  # nothing assigned: the main loop stops on the mismatch
            self._done[tp.partition] = tp.offset - 1 if tp.offset >= 0 else -1
        consumer.incremental_assign(partitions)
        self._assigned_once.set()
        log.info("assigned", extra={"partitions": [tp.partition for tp in partitions]})

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._commit({tp.partition for tp in partitions}, asynchronous=False)  # nothing in flight here
        for tp in partitions:
            self._done.pop(tp.partition, None)
        consumer.incremental_unassign(partitions)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._done.pop(tp.partition, None)
            self._pending_commit.pop(tp.partition, None)
        consumer.incremental_unassign(partitions)

    # -- main loop ------------------------------------------------------------------------------
    def run(self, *, until_caught_up: bool = False, stop: threading.Event | None = None) -> ExtractorStats:
        """Consume until ``stop`` is set (or, with ``until_caught_up``, until lag is 0 everywhere).

        A batch interrupted by ``stop`` while waiting out an outage is not committed (it is redelivered).

        Returns:
            :class:`ExtractorStats` of this run.

        Raises:
            KafkaException: a fatal consumer error.
            DeadLetterError: the memory DLQ did not acknowledge (the offset was not moved).
        """
        self._stop = self.policy.stop = stop or threading.Event()
        started = time.monotonic()
        self.consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_lost)
        try:
            msgs: list[Message] = []
            while not self._stop.is_set():
                if msgs and self.headroom is not None:  # after a batch: let the critical path have the CPU first
                    waited = self.headroom.wait(self._stop)
                    if waited:
                        self.stats.headroom_wait_s += waited
                        self.metrics.headroom_wait.inc(waited)
                msgs = self.consumer.consume(self.batch_size, timeout=self.poll_timeout_s)  # step 1
                self.metrics.observe_poll([m.timestamp()[1] for m in msgs if not m.error() and m.timestamp()[1] > 0],
                                          int(time.time() * 1000))
                self._lag_export.maybe(self.consumer, self._done)
                if self._mismatch is not None:
                    raise self._mismatch
                if msgs:
                    try:
                        self._handle(msgs)
                    except Exception as exc:
                        if self._stop.is_set() and classify(exc).kind == TRANSIENT:
                            break  # stopped while waiting out an outage: not committed
                        raise
                    self._commit(set(self._pending_commit), asynchronous=True)  # step 7
                elif until_caught_up and self._caught_up():
                    break
            self._commit(set(self._pending_commit), asynchronous=False)
        finally:
            self.stats.elapsed_s = time.monotonic() - started
            self.consumer.close()
        return self.stats

    def _handle(self, msgs: list[Message]) -> None:
        links = otel.header_links(msgs) if otel.tracer() is not None else None  # the runs' traces
        with otel.step_span("runjournal.memory.batch", {"runjournal.records": len(msgs)}, links):
            self._handle_batch(msgs)

    def _handle_batch(self, msgs: list[Message]) -> None:
        started = time.perf_counter()
        segment: list[_Unit] = []
        for msg in msgs:
            if msg.error():
                if stops_consumer(msg.error()):
                    raise FatalDependencyError("kafka", kafka_error_verdict(msg.error()).cause)
                log.warning("consumer error", extra={"error": str(msg.error())})
                continue
            if msg.value() is None:  # step 2: a tombstone; write what precedes it first
                self._write(segment)
                segment = []
                self._erase(msg)
            else:
                segment.append(self._extract(msg))  # steps 2-3
        self._write(segment)  # steps 4-5
        if self.dlq.sent:
            self.dlq.flush()  # step 6
        for msg in msgs:
            if not msg.error():
                self._done[msg.partition()] = max(self._done.get(msg.partition(), -1), msg.offset())
                self._pending_commit[msg.partition()] = self._done[msg.partition()] + 1
                self.metrics.events.labels(str(msg.partition())).inc()
        self.stats.events += len(msgs)
        self.stats.batches += 1
        self.metrics.batch_seconds.observe(time.perf_counter() - started)

    def _extract(self, msg: Message) -> _Unit:
        try:
            decoded = self._retry("decode", lambda: self.codec.decode(
                msg.value(), topic=msg.topic(), partition=msg.partition(), offset=msg.offset()))
            event, sealed = decoded, False
            if self.crypto is not None:  # the key grant: granted content opened (a key service outage waits)
                event, sealed = self._retry("decrypt", functools.partial(self.crypto.open_event, decoded))
            if not self._retry("extract", lambda: self.extractor.extract(event, None), on=(Exception,)):
                return _Unit(msg, [])  # nothing to remember: no owner lookup
            ctx = self._retry("owner", lambda: self.owners.context(event, msg))  # from the journal (owners.py)
            ctx = ctx if ctx is not None and ctx.tenant_id == event.tenant_id else None
            drafts = self._retry("extract", lambda: self.extractor.extract(event, ctx), on=(Exception,))
            if not drafts:
                return _Unit(msg, [])
            sealed = sealed or (ctx is not None and ctx.sealed)
            user = event.payload.get("user_id") or (ctx.user_id if ctx else None)
            scope = Scope(event.tenant_id, user_id=user or None, agent_id=ctx.agent if ctx else None)
        except Exception as exc:  # noqa: BLE001 - any failure of one record is dead-lettered, never skipped
            if isinstance(exc, DependencyUnavailableError | FatalDependencyError) or (
                    self._stop.is_set() and classify(exc).kind == TRANSIENT):
                raise  # an outage or a fatal dependency failure is never the record's fault
            self._dead_letter(msg, exc)
            return _Unit(msg, [])
        if sealed and (self.crypto is None or not self.crypto.grant.covers(event.tenant_id)):
            return _Unit(msg, [])  # encrypted content outside the grant makes no memory (not even a run's outcome)
        return _Unit(msg, [MemoryItem(text=d.text, kind=d.kind, subject=d.subject, scope=scope,
                                      created_at=event.occurred_at, provenance=self._provenance(msg, event, index))
                           for index, d in enumerate(drafts)], sealed=sealed)

    def _provenance(self, msg: Message, event: Event, index: int) -> Provenance:
        key = msg.key()
        return Provenance(run_id=event.run_id, event_id=event.event_id, event_type=event.type.value,
                          topic=msg.topic(), partition=msg.partition(), offset=msg.offset(),
                          schema=_writer_schema(msg.value()), extractor=self.extractor.version, item_index=index,
                          event_key=key.decode("utf-8", "replace") if key else None)

    def _write(self, segment: list[_Unit]) -> None:
        units = [u for u in segment if u.items]
        if not units:
            return
        items = sum((len(u.items) for u in units), 0)
        try:
            with otel.step_span("runjournal.memory.write", {"runjournal.items": items}):
                self._write_items(units)
            return
        except MemoryPlaneError:
            if self._stop.is_set():
                raise  # stopped while waiting: not committed
        for unit in units:  # the batch failed for a reason other than an outage: record by record
            try:
                self._write_items([unit])
            except MemoryPlaneError as exc:
                if self._stop.is_set():
                    raise
                self._dead_letter(unit.msg, exc)

    def _write_items(self, units: list[_Unit]) -> None:
        started = time.perf_counter()
        items = [i for u in units for i in u.items]
        vectors = self._retry("embed", lambda: self.embedder.embed([i.text for i in items]))  # step 4
        embedded = time.perf_counter()
        self.stats.embed_s += embedded - started
        stored, keep = self._stored(units)  # sealed after embedding: the vector is the plain text's
        if len(keep) != len(items):
            vectors = vectors[keep]
        written = self._retry("upsert", lambda: self.store.upsert(stored, vectors)) if stored else 0  # step 5
        if written and self.crypto is not None:
            written = max(0, written - self._forget_erased_owners(stored))
        self.stats.items += written
        self.metrics.embed_seconds.observe(embedded - started)
        self.metrics.commit_seconds.observe(time.perf_counter() - embedded)
        self.metrics.items.inc(written)

    def _stored(self, units: list[_Unit]) -> tuple[list[MemoryItem], list[int]]:
        """The items as stored — sealed under their owner's key when drawn from encrypted content, plain text
        escaped otherwise (``encode_plain``) — and the indexes of those kept (an owner whose key was destroyed
        meanwhile: its items are dropped, never stored in clear).

        Raises:
            DependencyUnavailableError: the key service stayed away past the outage budget.
        """
        stored: list[MemoryItem] = []
        keep: list[int] = []
        index = -1
        for unit in units:
            for item in unit.items:
                index += 1
                if not unit.sealed:
                    stored.append(item if encode_plain(item.text) is item.text
                                  else dataclasses.replace(item, text=encode_plain(item.text)))
                    keep.append(index)
                    continue
                if self.crypto is None:  # _extract makes no sealed unit without one
                    continue
                pid = point_id(item.provenance.event_id, item.provenance.item_index)
                try:
                    stored.append(self._retry("seal", functools.partial(self.crypto.seal_item, item, pid)))
                except EncryptedContentError:
                    continue  # the owner's key was destroyed: no memory, never plain text
                keep.append(index)
        return stored, keep

    def _forget_erased_owners(self, stored: list[MemoryItem]) -> int:
        """Delete the points just written of owners erased meanwhile; returns how many were deleted.

        ``erase --tenant/--subject`` destroys the owner's key and then deletes the owner's points; this writer
        upserts and then asks whether the owner's key was destroyed. Whatever the interleaving, no point of an
        erased owner stays: either the erase's delete comes after this upsert, or this question comes after the
        destroy (decision 0059). Without it, an extractor holding a cached data key (its TTL) could write a sealed
        item — and its vector, an embedding of the plain text — after the erase had deleted the owner's points.
        An erase writes a tombstone for a key never made too, so this holds for items stored in plain text.

        Raises:
            DependencyUnavailableError: the key service or Qdrant stayed away past the outage budget.
        """
        crypto = self.crypto
        if crypto is None:
            return 0
        deleted = 0
        for tenant_id, user_id in sorted({(i.scope.tenant_id, i.scope.user_id) for i in stored},
                                         key=lambda o: (o[0], o[1] or "")):
            if self._retry("erased", functools.partial(crypto.erased, tenant_id, user_id)):
                deleted += self._retry("erase", functools.partial(self.store.delete_by_owner, tenant_id, user_id))
                log.warning("memory items of an erased owner (tenant %s) written during its erase were deleted",
                            tenant_id)
        return deleted

    def _erase(self, msg: Message) -> None:
        key = (msg.key() or b"").decode("utf-8", "replace")
        if key:
            erased = self._retry("erase", lambda: self.store.delete_by_event_key(key))
            self.stats.erased += erased
            self.metrics.erased.inc(erased)

    def _dead_letter(self, msg: Message, exc: BaseException) -> None:
        redact = self.crypto is not None  # with a key grant the error may quote opened content: its class only
        self.dlq.send(msg, exc, redact=redact)
        self.stats.dead_lettered += 1
        self.metrics.dead_lettered.labels(type(exc).__name__).inc()
        log.warning("dead-lettered", extra={"topic": msg.topic(), "partition": msg.partition(),
                                            "offset": msg.offset(),
                                            "error": type(exc).__name__ if redact else f"{type(exc).__name__}: {exc}"})

    # -- retry ----------------------------------------------------------------------------------
    def _retry(self, what: str, fn: Callable[[], T],
               on: tuple[type[BaseException], ...] = (MemoryPlaneError, RegistryError)) -> T:
        """``fn()`` under the failure policy: a transient failure waits (``self.policy``, bounded by
        ``max_outage_s``); another error of a type in ``on`` is tried ``max_attempts`` times in all.

        Raises:
            DependencyUnavailableError / FatalDependencyError: the outage outlasted the budget / a fatal failure.
        """
        def item_fault(exc: BaseException) -> bool:
            return isinstance(exc, on) and not isinstance(exc, DependencyUnavailableError | FatalDependencyError) \
                and classify(exc).kind != TRANSIENT

        retrying = Retrying(
            retry=retry_if_exception(item_fault),
            stop=stop_after_attempt(self.max_attempts) | (lambda _s: self._stop.is_set()),
            wait=wait_exponential(multiplier=self.backoff_base_s, max=self.backoff_cap_s),
            sleep=self._stop.wait,
            before_sleep=lambda rs: self._on_retry(what, rs),
            reraise=True,
        )
        return retrying(lambda: self.policy.call(what, fn))

    def _count_wait(self) -> None:
        self.stats.retries += 1

    def _on_retry(self, what: str, state: RetryCallState) -> None:
        self.stats.retries += 1
        exc = state.outcome.exception() if state.outcome else None
        self.metrics.retries.labels(what, type(exc).__name__).inc()
        log.warning("retrying", extra={"op": what, "attempt": state.attempt_number,
                                       "error": f"{type(exc).__name__}: {exc}"})

    # -- offsets --------------------------------------------------------------------------------
    def _commit(self, partitions: set[int], *, asynchronous: bool) -> None:
        # A failed commit (e.g. the member left the group during a long outage) means redelivery, harmless.
        commit_pending(self.consumer, self.topic, self._pending_commit, partitions, asynchronous=asynchronous,
                       log=log)

    def _caught_up(self) -> bool:
        if not self._assigned_once.is_set():
            return False
        return not any(partition_lags(self.consumer, self._done).values())


def _writer_schema(value: bytes | None) -> str:
    """``avro-so:<fingerprint hex>`` (single-object), ``registry:<id>`` (Confluent framing) or ``unknown``."""
    if value and value[:2] == b"\xc3\x01" and len(value) >= 10:
        return f"avro-so:{int.from_bytes(value[2:10], 'little'):016x}"
    if value and value[:1] == b"\x00" and len(value) >= 5:
        return f"registry:{int.from_bytes(value[1:5], 'big')}"
    return "unknown"

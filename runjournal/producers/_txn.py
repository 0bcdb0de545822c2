"""One transactional ``confluent_kafka.Producer`` shared by every run of a Journal, with group commit.

Transactions are numbered by *generation*. Every produce goes into the open transaction
(generation ``gen``); a durable publish then asks for "everything up to my generation to be
committed" (:meth:`TxnPublisher.commit_through`). One commit covers every event produced
before it, from any thread, so concurrent durable publishes share commits (group commit).

A *deferred* item (``Item.deferred``: a tool's outcome in group-commit mode) waits in the open transaction for
the next commit like a non-durable one; :meth:`TxnPublisher.deferred_age_s` tells the keeper how long it has
waited, and ``deferred_arrived`` wakes the keeper when the first one arrives.

All producer calls (begin / produce / commit / abort / rebuild) happen under one lock: a
Kafka transactional producer has one open transaction at a time, and a run's events must
enter it in publish order.

A failed transaction is aborted and re-run, or dropped, as *When a transaction fails* (below) describes.

**When a transaction fails.** Every method of that part runs with the publisher's lock held. Order of
decisions for a failed transaction (generation *g*):

1. **Abort** it (``abort_transaction``) unless the error is fatal or fenced; a failing abort
   escalates to fatal (or fenced).
2. **Re-run** it when the error was abortable and transient — none of its records was refused by
   the broker and none was produced ``MAX_RESENDS`` times yet: the very same records (same bytes,
   ``event_id`` and ``seq``) go into a new transaction, in order, and the commit is retried. Nothing
   is dropped or reordered and the callers see nothing. (librdkafka needs this: after a refused
   record the next transaction fails once with OUT_OF_ORDER_SEQUENCE_NUMBER while it bumps the
   producer epoch.)
3. Otherwise **drop** it: *g* is resolved as failed, every durable publisher waiting on *g* raises
   (TransactionAbortedError / FatalProducerError / ProducerFencedError) and its seq is free again;
   fatal → the producer is rebuilt (``init_transactions``); fenced → the publisher stays fenced for
   good (re-initialising the same transactional.id would un-fence the zombie) and every later
   publish raises ProducerFencedError. Non-durable records of *g* are produced again at the head
   of the next transaction, except those of a run that had a record refused (or re-produced too
   often): such a run is told through ``on_lost`` and stops, rather than continue with a gap in its seqs.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from runjournal.core import failpoints, kafka
from runjournal.producers._kafka_errors import Failure, Severity, classify, kafka_error
from runjournal.producers.errors import (
    DeliveryError,
    DuplicateSeqError,
    FatalProducerError,
    JournalError,
    LeaseLapsedError,
    ProducerFencedError,
    QueueFullError,
    TransactionAbortedError,
)
from runjournal.producers.fencing import init_transactions

__all__ = ["Item", "MAX_RESENDS", "TxnPublisher"]

log = logging.getLogger("runjournal.producers.txn")

#: A record is produced again at most this many times before its run is declared lost.
MAX_RESENDS = 3
_MAX_KEPT_FAILURES = 1024
#: Delivery errors meaning the broker will never take the record (or the batch holding it).
_SIZE = frozenset(
    {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_MSG_SIZE}
)
_REFUSED = _SIZE | {KafkaError.INVALID_RECORD, KafkaError.INVALID_MSG}
_KIND = {Severity.FENCED: ProducerFencedError, Severity.FATAL: FatalProducerError}


@dataclass(slots=True)
class Item:
    """One encoded event waiting in (or produced again into) a transaction."""

    run_id: str
    key: str
    value: bytes | None
    partition: int
    headers: list[tuple[str, bytes]] | None
    durable: bool
    on_lost: Callable[[DeliveryError], None] | None
    resends: int = 0
    topic: str | None = None
    """Another topic written in the same transaction (``Journal.publish_record``); None: the events topic."""
    smaller: Callable[[], bytes | None] | None = None
    """The same record (same key, event_id and seq) with its result by reference instead of inline, for a broker
    that refuses the record for its size; None when there is no smaller form (``_shrink_refused``)."""
    deferred: bool = False
    """A tool's outcome that rides the next commit (``Journal(outcome_commit="group")``): not durable when
    published, committed by the next durable publish, the keeper after ``outcome_linger_ms``, or a flush."""
    seq: int = 0
    """The event's seq in its run (events topic only; 0 for another topic's record)."""
    event_id: str | None = None
    """The event's id (None for another topic's record): a resend of the same event may reuse its seq."""


class TxnPublisher:
    """See the module docstring. Thread-safe.

    Args:
        config: librdkafka config for ``Producer`` (must hold ``transactional.id``).
        topic: the events topic.
        commit_timeout_s: per ``commit_transaction`` / ``abort_transaction`` / ``init_transactions`` call.
        commit_retries: extra ``commit_transaction`` attempts on a retriable error (e.g. timeout).
        queue_full_retries: bounded retries of a produce that raised ``BufferError``.
        on_fenced: called (under the lock) when the producer is found fenced.
        still_leased: asked before rebuilding after a non-fencing fatal error; False is treated as fenced.
        settle_ms: see :meth:`_settle` (0 disables).
        share_wait_ms: the longest a durable publisher about to commit waits for publishers already waiting
            for the lock to produce into the same transaction, ms (default 2; 0 disables). Only while some are
            waiting: a lone publisher commits at once (see :meth:`commit_through`).
        on_acked: called (under the lock) after each successful commit with ``[(key, partition, offset)]`` of
            every event the committed transaction held, in produce order (records on other topics — framework
            records, large results' chunks — are not reported: their offsets are another topic's); the offset comes
            from the record's delivery report (-1 when none was served). The broker's acknowledgement as the
            caller's witness (the demo's ack log); it must not raise or block.
    """

    def __init__(
        self,
        config: dict[str, Any],
        topic: str,
        *,
        commit_timeout_s: float,
        commit_retries: int,
        queue_full_retries: int,
        on_fenced: Callable[[], None],
        still_leased: Callable[[], bool],
        settle_ms: float = 0.0,
        on_acked: Callable[[list[tuple[str, int, int]]], None] | None = None,
        share_wait_ms: float = 2.0,
    ) -> None:
        self._config = {**config, "error_cb": self._on_error}
        self._deliver = self._on_delivery
        self._topic = topic
        self._timeout_s = commit_timeout_s
        self._commit_retries = commit_retries
        self._queue_full_retries = queue_full_retries
        self._on_fenced = on_fenced
        self._still_leased = still_leased
        self._lock = threading.RLock()
        self._joined = threading.Condition(self._lock)
        """Notified each time a publisher has produced (or failed to): a committer waiting for it wakes."""
        self._arrivals = 0
        """Publishers between announcing themselves and producing: they are waiting for ``_lock``."""
        self._arrivals_lock = threading.Lock()
        self._share_wait_s = share_wait_ms / 1000
        self._producer: Any = None
        self._gen = 1
        self._resolved = 0
        self._failed: dict[int, Failure] = {}
        self._delivery_errors: dict[str, KafkaError] = {}
        self._connect_errors: list[str] = []
        """Names of the errors ``error_cb`` reported since :meth:`_reach` asked (a refused login, TLS)."""
        self._fatal_cause: KafkaError | None = None
        """The fatal error librdkafka reported through ``error_cb`` (e.g. ``_FENCED``); later calls raise ``_FATAL``."""
        self._offsets: dict[str, int] = {}
        self._watched: dict[str, int] = {}
        """Keys of records whose delivery offsets a caller asked for (:meth:`publish_all`) → offset (-1: none yet);
        a re-run transaction's reports overwrite the aborted attempt's."""
        self._on_acked = on_acked
        self._txn_open = False
        self._txn_opened_at = 0.0
        self._deferred_since: float | None = None
        """When the open transaction took its first deferred outcome (monotonic s); None: it holds none."""
        self.deferred_arrived = threading.Event()
        """Set when the open transaction takes its first deferred outcome (the keeper waits on it)."""
        self._items: list[Item] = []
        self._published: dict[str, tuple[int, str | None]] = {}
        """run_id -> (highest seq produced, its event_id): a second event at a seq already produced is refused
        (:class:`DuplicateSeqError`). A dropped durable event frees its seq again (``_fail_open_txn``)."""
        self._closed = False
        self._aborted_clean = False
        """Whether the last abort succeeded (the transaction is known not committed): decides ambiguity."""
        self._fenced_for_good = False
        """Set once the broker fenced this transactional.id (or the lease lapsed): every later publish raises."""
        self._lapse_reason: str | None = None
        self._settle_s = settle_ms / 1000
        self._committed_at = 0.0
        self.commits = 0
        """Transactions committed."""
        self.aborts = 0
        """Transactions aborted or lost."""
        self.rebuilds = 0
        """Producers rebuilt after a fatal error."""

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self, connect_timeout_s: float | None = None) -> None:
        """Create the producer and ``init_transactions()``.

        Args:
            connect_timeout_s: first ask for the cluster's metadata with this timeout, seconds: no answer is a
                missing broker, named at once (None: ``init_transactions`` waits its full ``commit_timeout_s``).

        Raises:
            StackUnavailableError: no broker answered within ``connect_timeout_s``.
            ConfigError: the broker refused the credentials or the TLS handshake.
            FatalProducerError: ``init_transactions`` failed.
        """
        with self._lock:
            self._producer = self._build(connect_timeout_s)

    def _build(self, connect_timeout_s: float | None = None) -> Any:
        self._fatal_cause = None  # a new producer: no fatal state
        producer = Producer(self._config)
        if connect_timeout_s is not None:
            self._reach(producer, connect_timeout_s)
        try:
            init_transactions(producer, self._timeout_s)  # one metadata request first: no 500 ms coordinator stall
        except KafkaException as exc:
            raise FatalProducerError(
                f"init_transactions failed for {self._config['transactional.id']}: {exc}"
            ) from exc
        return producer

    def _reach(self, producer: Any, timeout_s: float) -> None:
        """One metadata request within ``timeout_s`` seconds, or the named error: a refused login or TLS handshake
        (seen by ``error_cb``) is a :class:`ConfigError`, silence a :class:`StackUnavailableError`."""
        self._connect_errors.clear()
        try:
            producer.list_topics(timeout=timeout_s)
        except KafkaException as exc:
            with contextlib.suppress(KafkaException, RuntimeError):
                producer.poll(0.1)  # serve the error callbacks
            bootstrap = kafka.bootstrap_of(self._config)
            refusal = kafka.refused(bootstrap, self._connect_errors)
            if refusal is not None:
                raise refusal from exc
            raise kafka.no_broker(bootstrap, timeout_s, exc) from None

    def close(self, timeout_s: float) -> None:
        """Commit the open transaction (raises like :meth:`flush`), then stop accepting publishes."""
        with self._lock:
            try:
                self.flush()
            finally:
                self._closed = True
                producer, self._producer = self._producer, None
                if producer is not None:
                    try:
                        producer.flush(timeout_s)
                        producer.close()
                    except (KafkaException, RuntimeError) as exc:  # a fatal producer's flush raises its error:
                        log.warning("closing the producer: %s", exc)  # the commit's outcome was reported above

    def fence_locally(self, reason: str) -> None:
        """The instance's lease lapsed: stop for good, as if fenced at the broker (every later publish raises
        ``LeaseLapsedError``). The open transaction is dropped uncommitted (purged; the broker aborts it
        when the recovery job fences this transactional.id, or on ``transaction.timeout.ms``): nothing of
        this instance may land after the recovery job's read. Safe from any thread."""
        self._lapse_reason = reason
        self._fenced_for_good = True  # set before taking the lock: publishes waiting for it see it at once
        with self._lock:
            self._drop_producer()
            if self._txn_open or self._items:
                failure = Failure(LeaseLapsedError, reason, RuntimeError(reason), retryable=False)
                self._notify_lost([i for i in self._items if not i.durable], failure.error())
                self._resolve(failure)

    # -- publishing ---------------------------------------------------------------------------
    def publish(self, item: Item) -> int:
        """Produce ``item`` into the open transaction; returns its generation (for :meth:`commit_through`).

        Raises:
            QueueFullError: the local queue stayed full; ``item`` was not produced.
            DeliveryError: the producer failed (the transaction was recovered); ``item`` was not produced.
            JournalError: the publisher is closed.
        """
        if item.durable:
            self._settle()
        with self._arrivals_lock:
            self._arrivals += 1  # a committer holding the lock may wait for this publisher (commit_through)
        with self._lock:
            try:
                return self._produce_item(item)
            finally:
                with self._arrivals_lock:
                    self._arrivals -= 1
                self._joined.notify_all()

    def publish_all(self, items: list[Item]) -> int:
        """Produce ``items`` in order into the open transaction under one hold of the lock — all in one
        transaction — and keep their delivery offsets for :meth:`offsets_of`; returns the generation (for
        :meth:`commit_through`). Raises as :meth:`publish` (items produced before a failing one stay in the
        transaction: records of another topic that nothing references)."""
        self._settle()
        with self._arrivals_lock:
            self._arrivals += 1
        with self._lock:
            try:
                for item in items:
                    self._watched[item.key] = -1
                gen = self._gen
                for item in items:
                    gen = self._produce_item(item)
                return gen
            except BaseException:
                for item in items:
                    self._watched.pop(item.key, None)
                raise
            finally:
                with self._arrivals_lock:
                    self._arrivals -= 1
                self._joined.notify_all()

    def await_delivery(self, keys: list[str], timeout_s: float = 30.0) -> bool:
        """Wait until every record ``keys`` produced by :meth:`publish_all` has its delivery report (the broker
        holds it, in the open transaction); False when some has none within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while any(self._watched.get(k, -1) < 0 for k in keys):
            if time.monotonic() >= deadline:
                return False
            with self._lock:
                self._serve(0.05)
        return True

    def offsets_of(self, keys: list[str], timeout_s: float = 10.0) -> list[int]:
        """The delivery offsets of the records ``keys`` produced by :meth:`publish_all`, once their transaction is
        committed (:meth:`commit_through` returned): served from the delivery reports, waiting for any not yet
        served at most ``timeout_s``. -1 for a key with no report by then. Forgets the keys."""
        deadline = time.monotonic() + timeout_s
        while any(self._watched.get(k, -1) < 0 for k in keys) and time.monotonic() < deadline:
            with self._lock:
                self._serve(0.05)
        return [self._watched.pop(k, -1) for k in keys]

    def _produce_item(self, item: Item) -> int:
        if self._closed or self._fenced_for_good or self._producer is None:  # checked under the lock
            self._usable()  # raises (closed, fenced) or rebuilds the producer
        if item.event_id is not None:
            self._check_seq(item)
        try:
            if not self._txn_open:
                self._ensure_txn()
            self._produce(item)
        except KafkaException as exc:
            if classify(exc) in (Severity.LOCAL, Severity.RETRIABLE):  # this record only (partition, size)
                refused = DeliveryError(f"produce of {item.key} refused: {exc}")
                refused.refused_keys = frozenset({item.key})
                raise refused from exc
            raise self._fail_open_txn(self._by_fatal_cause(exc)) from exc
        self._items.append(item)
        if item.event_id is not None:
            if len(self._published) >= 65_536:
                self._published.clear()  # bounded: the oldest runs' marks go (each run's handle counts its own seqs)
            self._published[item.run_id] = (item.seq, item.event_id)
        if item.deferred and self._deferred_since is None:
            self._deferred_since = time.monotonic()
            self.deferred_arrived.set()
        self._serve()
        return self._gen

    def _check_seq(self, item: Item) -> None:
        """Refuse an event at a seq this publisher already produced for its run, unless it is that same event
        (a resend: same ``event_id``). Nothing is produced.

        Raises:
            DuplicateSeqError: two writers of one run in this instance.
        """
        last = self._published.get(item.run_id)
        if last is None:
            return
        seq, event_id = last
        if item.seq > seq or (item.seq == seq and item.event_id == event_id):
            return
        raise DuplicateSeqError(
            f"run {item.run_id}: seq {item.seq} was already published by this instance (up to seq {seq}); a second "
            "writer of the run in this process — one handle per run, shared by its threads "
            "(docs/operations/concurrency.md)", run_id=item.run_id, seq=item.seq, published_seq=seq)

    def commit_through(self, gen: int) -> None:
        """Return once generation ``gen`` is committed; raise its error if it was lost.

        Group commit: when other publishers are already waiting for the lock, this one first lets them produce
        into the same transaction — it waits (the lock released) until none is left waiting, at most
        ``share_wait_ms`` — so one commit acknowledges all of them. Without that wait the publisher that just
        produced takes the lock straight back and commits alone, and concurrent durable publishes share almost
        nothing (64 threads gave 1.4× one thread's calls/s). A lone publisher never waits.

        Raises:
            TransactionAbortedError / FatalProducerError / ProducerFencedError: generation ``gen`` was lost.
        """
        with self._lock:
            if self._resolved < gen:
                self._let_others_join()
            if self._resolved < gen:
                self._commit()
            self._raise_if_failed(gen)

    def _let_others_join(self) -> None:
        """Wait (lock released) while publishers wait to produce into the open transaction, at most
        ``share_wait_ms``."""
        deadline = time.monotonic() + self._share_wait_s
        while self._arrivals > 0 and self._txn_open and not self._fenced_for_good:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._joined.wait(left)

    def flush(self) -> None:
        """Commit the open transaction, if any (raises like :meth:`commit_through`)."""
        with self._lock:
            if self._txn_open:
                gen = self._gen
                self._commit()
                self._raise_if_failed(gen)

    def txn_age_s(self) -> float:
        """Seconds the open transaction has been open; 0.0 when none is."""
        return time.monotonic() - self._txn_opened_at if self._txn_open else 0.0

    def deferred_age_s(self) -> float | None:
        """Seconds since the open transaction took its first deferred outcome; None when it holds none
        (an unlocked read: the keeper uses it to decide when to commit)."""
        since = self._deferred_since
        return None if since is None else time.monotonic() - since

    def poll(self) -> None:
        """Serve delivery callbacks (non-blocking; never raises, see :meth:`_serve`)."""
        self._serve(producer=self._producer)

    def partition_count(self, timeout_s: float) -> int | None:
        """The topic's partition count from a metadata request; None when the topic is unknown."""
        producer = self._producer
        if producer is None:
            raise FatalProducerError("no producer (rebuild failed)")
        meta = producer.list_topics(self._topic, timeout=timeout_s)
        topic = meta.topics.get(self._topic)
        if topic is None or topic.error is not None:
            return None
        return len(topic.partitions)

    # -- internals (all called with the lock held) ---------------------------------------------
    def _usable(self) -> None:
        if self._closed:
            raise JournalError("the journal is closed")
        if self._fenced_for_good:  # checked under the lock: no publish slips past a fence
            if self._lapse_reason is not None:
                raise LeaseLapsedError(self._lapse_reason)
            raise ProducerFencedError(
                f"{self._config['transactional.id']} was fenced (a recovery job took this instance's runs); "
                "this instance must stop — restart it (it comes back as a new incarnation)")
        if self._producer is None:
            self.rebuilds += 1
            self._producer = self._build_leased()
            if self._producer is None:
                raise ProducerFencedError(
                    f"{self._config['transactional.id']}: the lease was lost before the producer could be rebuilt; "
                    "this instance must stop — restart it (it comes back as a new incarnation)")

    def _build_leased(self) -> Any | None:
        """A rebuilt producer, or None when this instance's lease is not ours (then it is fenced for good).

        The lease is asked before ``init_transactions`` — which bumps the producer epoch and would un-fence this
        instance behind a recovery job's read (docs/design/protocol.md § Zombies) — and again after it: an answer
        "still ours" after the init means the lease never lapsed in between (a lapsed lease is never revived), so
        no recovery job can have fenced and read before this epoch. Every rebuild goes through here: the deferred
        one of the next publish (:meth:`_usable`) and the immediate one after a fatal error (:meth:`_rebuild`).

        Raises:
            FatalProducerError: ``init_transactions`` failed (retried on the next publish).
        """
        if not self._still_leased():
            self._fence_for_good("the lease is no longer ours: no producer rebuild")
            return None
        producer = self._build()
        if not self._still_leased():
            try:
                producer.purge()
            except (KafkaException, RuntimeError) as exc:
                log.debug("purging the unleased producer: %s", exc)
            self._fence_for_good("the lease lapsed while the producer was rebuilt")
            return None
        return producer

    def _fence_for_good(self, why: str) -> None:
        log.error("%s: treating this instance as fenced", why)
        self._fenced_for_good = True
        self._drop_producer()
        self._on_fenced()

    def _settle(self) -> None:
        """Right after a commit the coordinator is still writing its markers, and librdkafka answers the
        next AddPartitionsToTxn's CONCURRENT_TRANSACTIONS with a fixed 20 ms backoff. A durable publish
        that opens a transaction within ``settle_ms`` of the last commit waits out the rest first: on a
        cold local broker p50 ~10 ms instead of ~35 ms for back-to-back durable publishes (a warm one
        needs no wait: ~4 ms). The wait is outside the lock, so publishes arriving meanwhile still share
        the next commit."""
        if self._txn_open:  # unlocked read: a stale answer only costs or saves one short wait
            return
        wait_s = self._settle_s - (time.monotonic() - self._committed_at)
        if wait_s > 0:
            time.sleep(wait_s)

    def _ensure_txn(self) -> None:
        if not self._txn_open:
            self._producer.begin_transaction()
            self._txn_open = True
            self._txn_opened_at = time.monotonic()

    def _produce(self, item: Item) -> None:
        attempt = 0
        while True:
            try:
                self._producer.produce(
                    item.topic or self._topic,
                    key=item.key,
                    value=item.value,
                    partition=item.partition,
                    headers=item.headers,
                    on_delivery=self._deliver,
                )
                return
            except BufferError:
                if attempt == self._queue_full_retries:
                    break
                attempt += 1
                self._serve(0.05 * attempt)
        raise QueueFullError(
            f"local produce queue full after {self._queue_full_retries} retries ({item.key})",
            retry_after_s=1.0,
        )

    def _commit(self) -> None:
        if not self._txn_open:  # nothing produced since the last resolution
            self._resolve(None)
            return
        retries = 0
        while True:
            try:
                self._producer.commit_transaction(self._timeout_s)
            except KafkaException as raised:
                exc = self._by_fatal_cause(raised)
                severity = classify(exc)
                if severity is Severity.RETRIABLE and retries < self._commit_retries:
                    retries += 1
                    log.warning("commit_transaction: retriable error (%s), retrying", exc)
                    continue
                if severity in (Severity.ABORTABLE, Severity.RETRIABLE):
                    # A commit still retriable after commit_retries is ambiguous only until an abort succeeds: an
                    # aborted transaction did not commit. Its records are then produced again, the same events under
                    # the same keys (a duplicate of an event that did land is the same record: the readers keep one
                    # by event id), so a deferred outcome is re-sent like a strict one — never dropped while the
                    # caller holds its value (docs/design/protocol.md § Durability).
                    self._aborted_clean = False
                    failed = self._rerun(exc)
                    if failed is None:
                        retries = 0
                        continue
                    exc = failed
                self._fail_open_txn(exc, ambiguous=severity is Severity.RETRIABLE and not self._aborted_clean)
                return
            self.commits += 1
            self._committed_at = time.monotonic()
            self._report_acked()
            held_outcome = self._deferred_since is not None
            self._resolve(None)
            if held_outcome:
                failpoints.hit("producers.txn.after_outcome_commit")  # a deferred outcome is durable now
            return

    def _report_acked(self) -> None:
        """Hand the committed transaction's records to ``on_acked`` (see the constructor)."""
        if self._on_acked is None or not self._items:
            return
        self._serve()  # any delivery report not yet served
        acked = [(i.key, i.partition, self._offsets.get(i.key, -1)) for i in self._items if i.topic is None]
        self._offsets.clear()
        try:
            self._on_acked(acked)
        except Exception:  # noqa: BLE001 - a witness must never fail the journal
            log.exception("on_acked raised")

    def _raise_if_failed(self, gen: int) -> None:
        failure = self._failed.get(gen)
        if failure is not None:
            raise failure.error()

    def _by_fatal_cause(self, exc: KafkaException) -> KafkaException:
        """``exc``, or — for a ``_FATAL`` raised by a producer already in its fatal state — the fatal error that
        put it there (from ``error_cb``): a fence must be handled as a fence (the instance stops for good), not as
        a fatal error (a rebuild would ``init_transactions`` the same id and un-fence the zombie)."""
        err = kafka_error(exc)
        if err is None or err.code() != KafkaError._FATAL:  # noqa: SLF001
            return exc
        if self._fatal_cause is None:
            self._serve()  # error_cb is served from poll: the fatal error is queued by now
        cause = self._fatal_cause
        return exc if cause is None else KafkaException(cause)

    def _serve(self, timeout_s: float = 0.0, *, producer: Any = None) -> None:
        """``poll``: serve delivery reports and ``error_cb``. confluent-kafka raises a fatal error from ``poll``
        (after ``error_cb``); it is kept (``_fatal_cause``) for the next transactional call to handle — a
        fence as a fence — and never raised from here: not to a publisher whose record was already accepted,
        not into the keeper thread (which would die and stop the age-bounded commits)."""
        target = producer if producer is not None else self._producer
        if target is None:
            return
        try:
            target.poll(timeout_s)
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is not None and err.fatal():
                self._fatal_cause = err
            log.warning("poll: %s (handled on the next transactional call)", exc)

    def _on_error(self, err: KafkaError) -> None:
        if len(self._connect_errors) < 64:
            self._connect_errors.append(err.name())
        if err.fatal():
            self._fatal_cause = err
            log.error("fatal producer error: %s (handled on the next transactional call)", err)
        else:
            log.debug("producer error: %s", err)

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            key = msg.key().decode("utf-8", "replace") if msg.key() else "?"
            self._delivery_errors[key] = err
            log.warning("delivery failed %s[%s] key=%s: %s", msg.topic(), msg.partition(), key, err)
            return
        if self._on_acked is not None or self._watched:
            key = msg.key().decode("utf-8", "replace")
            if self._on_acked is not None:
                self._offsets[key] = msg.offset()
            if key in self._watched:
                self._watched[key] = msg.offset()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("delivered %s[%s]@%s", msg.topic(), msg.partition(), msg.offset())

    # -- when a transaction fails: steps (module docstring) --------------------------------------------
    def _abort(self, exc: KafkaException) -> tuple[Severity, KafkaException]:
        """Step 1. Returns the (possibly escalated) severity and the exception that decided it."""
        severity = classify(exc)
        if severity in (Severity.FENCED, Severity.FATAL) or not self._txn_open:
            return severity, exc
        try:
            self._producer.abort_transaction(self._timeout_s)
        except KafkaException as abort_exc:
            log.error("abort_transaction failed (%s) after: %s", abort_exc, exc)
            return (Severity.FENCED if classify(abort_exc) is Severity.FENCED else Severity.FATAL), abort_exc
        self._aborted_clean = True  # an aborted transaction did not commit: nothing of it is in the topic
        self._txn_open = False
        self._serve()  # delivery reports: they name refused records
        return severity, exc

    def _rerun(self, exc: KafkaException) -> KafkaException | None:
        """Step 2 for a failed commit. None: the same records are in a new transaction, commit again.
        Otherwise the exception to drop the transaction with (step 3)."""
        ambiguous = classify(exc) is Severity.RETRIABLE
        severity, exc = self._abort(exc)
        if ambiguous and severity is Severity.FATAL and self._items and \
                not any(i.resends >= MAX_RESENDS for i in self._items):
            return self._rerun_rebuilt(exc)
        refused = any(e.code() in _REFUSED for e in self._delivery_errors.values())
        worn = any(i.resends >= MAX_RESENDS for i in self._items)
        if refused and severity is Severity.ABORTABLE and not worn and self._shrink_refused():
            refused = False  # the refused records now carry their results by reference: run it again
        if severity not in (Severity.ABORTABLE, Severity.RETRIABLE) or refused or worn or not self._items:
            return exc
        log.warning("transaction aborted (%s); producing its %d events again", exc, len(self._items))
        self.aborts += 1
        self._delivery_errors.clear()
        return self._reproduce(list(self._items))

    def _rerun_rebuilt(self, exc: KafkaException) -> KafkaException | None:
        """An ambiguous commit whose abort was refused (librdkafka keeps a timed-out commit in its committing state:
        only commit may follow): a new producer for the same transactional id — lease checked before and after
        (:meth:`_build_leased`) — whose ``init_transactions`` lets the coordinator finish or abort the old
        transaction, then the same records produced again. Either way each event is in the topic once more at most,
        under the same key and event id (a duplicate the readers drop). None: commit again; else the exception to
        drop the transaction with."""
        log.warning("commit timed out and the transaction cannot be aborted (%s); a new producer sends its %d "
                    "events again", exc, len(self._items))
        self.rebuilds += 1
        self._drop_producer()
        self._txn_open = False
        try:
            self._producer = self._build_leased()
        except FatalProducerError as rebuilt:
            log.error("producer rebuild failed (%s)", rebuilt)
            return exc
        if self._producer is None:  # the lease is gone: fenced for good (_build_leased)
            return exc
        self.aborts += 1
        self._delivery_errors.clear()
        return self._reproduce(list(self._items))

    def _fail_open_txn(self, exc: KafkaException, *, ambiguous: bool = False) -> DeliveryError:
        """Steps 1 and 3: abort (or escalate) and drop the open transaction. Returns the caller's error."""
        severity, exc = self._abort(exc)
        if severity is Severity.FATAL and not self._still_leased():
            log.error("fatal producer error and the instance lease is no longer ours: treating it as fenced")
            severity = Severity.FENCED
        lost = self._items
        if not ambiguous:  # the commit may have happened: a new event under one of these seqs would share its key
            self._free_seqs([i for i in lost if i.durable])
        refused = {k: e for k, e in self._delivery_errors.items() if e.code() in _REFUSED}
        text = f"transaction lost ({len(lost)} events, {severity}): {exc}"
        if refused:
            text += "; refused by the broker: " + ", ".join(f"{k} {e.name()}" for k, e in refused.items())
        if ambiguous:
            text += " (ambiguous: the commit may have happened)"
        kind = _KIND.get(severity, TransactionAbortedError)
        guilty = _guilty(lost, refused)
        failure = Failure(kind, text, exc, retryable=not (ambiguous or severity is Severity.FENCED),
                          ambiguous=ambiguous, refused_keys=frozenset(guilty))
        log.error("%s", failure.message)
        self.aborts += 1
        self._resolve(failure)
        if severity is Severity.FENCED:
            # Never init_transactions() again with this transactional.id: that would bump the epoch back
            # and un-fence this zombie behind the recovery job's read (docs/design/protocol.md § Zombies). The
            # instance is done; a restart is a new incarnation (a new transactional.id).
            self._fenced_for_good = True
            self._drop_producer()
            self._on_fenced()
        elif severity is Severity.FATAL:
            self._rebuild()
        non_durable = [i for i in lost if not i.durable]
        if not failure.retryable:
            self._notify_lost(non_durable, failure.error())
            return failure.error()
        dead = {i.run_id for i in non_durable if i.key in guilty or i.resends >= MAX_RESENDS}
        self._notify_lost([i for i in non_durable if i.run_id in dead], failure.error())
        again = [i for i in non_durable if i.run_id not in dead]
        if again:
            if self._producer is None:
                error = (ProducerFencedError(f"{len(again)} events lost: this instance is fenced")
                         if self._fenced_for_good else FatalProducerError(f"{len(again)} events lost: no producer"))
                self._notify_lost(again, error)
            elif (err := self._reproduce(again)) is not None:
                self._fail_open_txn(err)
        return failure.error()

    # -- helpers -----------------------------------------------------------------------------------
    def _shrink_refused(self) -> bool:
        """Step 2 for a size refusal: give every record blamed for its size (``_guilty``) its smaller form
        (``Item.smaller``: the result by reference), all or none. True when the transaction may be re-run with
        them — the same events in the same order, so callers see nothing (a tool's outcome refused for its size,
        whether its commit is awaited or rides a later one). False when any refusal is not for size or a blamed
        record has no smaller form: the transaction is dropped as before."""
        refused = {k: e for k, e in self._delivery_errors.items() if e.code() in _REFUSED}
        if any(e.code() not in _SIZE for e in refused.values()):
            return False
        blamed = [i for i in self._items if i.key in _guilty(self._items, refused)]
        if not blamed or any(i.smaller is None for i in blamed):
            return False
        try:
            smaller = [i.smaller() for i in blamed if i.smaller is not None]
        except Exception:  # noqa: BLE001 - no smaller form after all (e.g. Redis refused the result)
            log.exception("could not make the refused records smaller")
            return False
        if any(v is None for v in smaller):
            return False
        for item, value in zip(blamed, smaller, strict=True):
            log.warning("the broker refused %s for its size; producing it again with its result by reference",
                        item.key)
            item.value, item.smaller = value, None
        return True

    def _reproduce(self, items: list[Item]) -> KafkaException | None:
        """Produce ``items`` in order into a new transaction. None on success; else the exception, with
        ``_items`` holding all of ``items`` (they fail together)."""
        self._items = []
        for item in items:  # counted first, so even a failing begin_transaction cannot loop forever
            item.resends += 1
            if item.key in self._watched:
                self._watched[item.key] = -1  # the aborted attempt's offset is not where the record will be
        try:
            self._ensure_txn()
            for item in items:
                self._produce(item)
                self._items.append(item)
                if item.deferred and self._deferred_since is None:
                    self._deferred_since = time.monotonic()
        except KafkaException as exc:
            self._items = items
            return exc
        except QueueFullError as exc:
            self._items = items
            full = KafkaError(KafkaError._QUEUE_FULL, str(exc), txn_requires_abort=True)  # noqa: SLF001
            return KafkaException(full)
        return None

    def _resolve(self, failure: Failure | None) -> None:
        """Close the current generation (committed when ``failure`` is None) and open the next."""
        if failure is not None:
            self._failed[self._gen] = failure
            if len(self._failed) > _MAX_KEPT_FAILURES:
                self._failed.pop(min(self._failed))
        self._resolved = self._gen
        self._gen += 1
        self._txn_open = False
        self._deferred_since = None
        self._items = []
        self._delivery_errors.clear()
        self._offsets.clear()

    def _drop_producer(self) -> None:
        old, self._producer = self._producer, None
        if old is not None:
            try:
                old.purge()  # then dropped: close() would try to abort a transaction it no longer owns
            except (KafkaException, RuntimeError) as exc:
                log.debug("purging the failed producer: %s", exc)

    def _rebuild(self) -> None:
        self.rebuilds += 1
        self._drop_producer()
        try:
            self._producer = self._build_leased()
        except FatalProducerError as exc:
            log.error("producer rebuild failed (%s); will retry on the next publish", exc)

    def _free_seqs(self, dropped: list[Item]) -> None:
        """Dropped durable events: their publishers raise and reuse the seq with a new event, so it is free again."""
        for item in dropped:
            if item.event_id is not None and self._published.get(item.run_id) == (item.seq, item.event_id):
                self._published[item.run_id] = (item.seq - 1, None)

    @staticmethod
    def _notify_lost(items: list[Item], error: DeliveryError) -> None:
        for item in items:
            if item.on_lost is not None:
                item.on_lost(error)


def _guilty(lost: list[Item], refused: dict[str, KafkaError]) -> set[str]:
    """Keys of the records refused for themselves. The broker refuses a whole batch; for a size error only
    the largest refused record of each partition is blamed, the others are collateral and are produced
    again (bounded by ``MAX_RESENDS``, so a wrong guess cannot loop)."""
    by_key = {i.key: i for i in lost}
    guilty: set[str] = set()
    sized: dict[int, list[Item]] = {}
    for key, err in refused.items():
        if key not in by_key:
            continue
        if err.code() in _SIZE:
            sized.setdefault(by_key[key].partition, []).append(by_key[key])
        else:
            guilty.add(key)
    guilty.update(max(items, key=lambda i: len(i.value or b"")).key for items in sized.values())
    return guilty

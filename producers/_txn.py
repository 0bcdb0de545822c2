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

A failed transaction is aborted and re-run, or dropped, as ``runjournal.producers._txn_failures`` describes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from runjournal.core import failpoints
from runjournal.producers._kafka_errors import Failure, Severity, classify, kafka_error
from runjournal.producers._txn_failures import FailureHandling, Item
from runjournal.producers.errors import (
    DeliveryError,
    FatalProducerError,
    JournalError,
    LeaseLapsedError,
    ProducerFencedError,
    QueueFullError,
)
from runjournal.producers.fencing import init_transactions

__all__ = ["Item", "TxnPublisher"]

log = logging.getLogger("runjournal.producers.txn")


class TxnPublisher(FailureHandling):
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
            every record the committed transaction held, in produce order; the offset comes from the record's
            delivery report (-1 when none was served). The broker's acknowledgement as the caller's witness
            (the demo's ack log); it must not raise or block.
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
        self._fatal_cause: KafkaError | None = None
        """The fatal error librdkafka reported through ``error_cb`` (e.g. ``_FENCED``); later calls raise ``_FATAL``."""
        self._offsets: dict[str, int] = {}
        self._on_acked = on_acked
        self._txn_open = False
        self._txn_opened_at = 0.0
        self._deferred_since: float | None = None
        """When the open transaction took its first deferred outcome (monotonic s); None: it holds none."""
        self.deferred_arrived = threading.Event()
        """Set when the open transaction takes its first deferred outcome (the keeper waits on it)."""
        self._items: list[Item] = []
        self._closed = False
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
    def start(self) -> None:
        """Create the producer and ``init_transactions()``. Raises FatalProducerError on failure."""
        with self._lock:
            self._producer = self._build()

    def _build(self) -> Any:
        self._fatal_cause = None  # a new producer: no fatal state
        producer = Producer(self._config)
        try:
            init_transactions(producer, self._timeout_s)  # one metadata request first: no 500 ms coordinator stall
        except KafkaException as exc:
            raise FatalProducerError(
                f"init_transactions failed for {self._config['transactional.id']}: {exc}"
            ) from exc
        return producer

    def close(self, timeout_s: float) -> None:
        """Commit the open transaction (raises like :meth:`flush`), then stop accepting publishes."""
        with self._lock:
            try:
                self.flush()
            finally:
                self._closed = True
                producer, self._producer = self._producer, None
                if producer is not None:
                    producer.flush(timeout_s)
                    producer.close()

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

    def _produce_item(self, item: Item) -> int:
        if self._closed or self._fenced_for_good or self._producer is None:  # checked under the lock
            self._usable()  # raises (closed, fenced) or rebuilds the producer
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
        if item.deferred and self._deferred_since is None:
            self._deferred_since = time.monotonic()
            self.deferred_arrived.set()
        self._serve()
        return self._gen

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
            self._producer = self._build()

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
                if severity is Severity.ABORTABLE:
                    failed = self._rerun(exc)
                    if failed is None:
                        continue
                    exc = failed
                self._fail_open_txn(exc, ambiguous=severity is Severity.RETRIABLE)
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
        acked = [(i.key, i.partition, self._offsets.get(i.key, -1)) for i in self._items]
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
        if self._on_acked is not None:
            self._offsets[msg.key().decode("utf-8", "replace")] = msg.offset()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("delivered %s[%s]@%s", msg.topic(), msg.partition(), msg.offset())

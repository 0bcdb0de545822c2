"""What the transactional publisher does when a transaction fails (mixed into ``TxnPublisher``).

Every method here runs with the publisher's lock held. Order of decisions for a failed
transaction (generation *g*):

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

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from runjournal.producers._kafka_errors import Failure, Severity, classify
from runjournal.producers.errors import (
    DeliveryError,
    FatalProducerError,
    ProducerFencedError,
    QueueFullError,
    TransactionAbortedError,
)

__all__ = ["MAX_RESENDS", "FailureHandling", "Item"]

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


class FailureHandling:
    """Failure half of ``TxnPublisher`` (see the module docstring)."""

    _config: dict[str, Any]
    _timeout_s: float
    _producer: Any
    _gen: int
    _resolved: int
    _failed: dict[int, Failure]
    _delivery_errors: dict[str, KafkaError]
    _offsets: dict[str, int]
    _txn_open: bool
    _deferred_since: float | None
    _items: list[Item]
    _on_fenced: Callable[[], None]
    _fenced_for_good: bool
    _still_leased: Callable[[], bool]
    aborts: int
    rebuilds: int

    def _ensure_txn(self) -> None:
        raise NotImplementedError  # pragma: no cover - TxnPublisher

    def _produce(self, item: Item) -> None:
        raise NotImplementedError  # pragma: no cover - TxnPublisher

    def _build(self) -> Producer:
        raise NotImplementedError  # pragma: no cover - TxnPublisher

    def _serve(self, timeout_s: float = 0.0, *, producer: Any = None) -> None:
        raise NotImplementedError  # pragma: no cover - TxnPublisher

    # -- steps ----------------------------------------------------------------------------------
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
        self._txn_open = False
        self._serve()  # delivery reports: they name refused records
        return severity, exc

    def _rerun(self, exc: KafkaException) -> KafkaException | None:
        """Step 2 for a failed commit. None: the same records are in a new transaction, commit again.
        Otherwise the exception to drop the transaction with (step 3)."""
        severity, exc = self._abort(exc)
        refused = any(e.code() in _REFUSED for e in self._delivery_errors.values())
        worn = any(i.resends >= MAX_RESENDS for i in self._items)
        if refused and severity is Severity.ABORTABLE and not worn and self._shrink_refused():
            refused = False  # the refused records now carry their results by reference: run it again
        if severity is not Severity.ABORTABLE or refused or worn or not self._items:
            return exc
        log.warning("transaction aborted (%s); producing its %d events again", exc, len(self._items))
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
            # and un-fence this zombie behind the recovery job's read (DESIGN.md § Zombies). The instance is
            # done; a restart is a new incarnation (a new transactional.id).
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
            self._producer = self._build()
        except FatalProducerError as exc:
            log.error("producer rebuild failed (%s); will retry on the next publish", exc)

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

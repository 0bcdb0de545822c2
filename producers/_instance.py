"""The Journal's instance life: lease heartbeat and lapse, broker fence, keeper thread (mixed into ``Journal``).

Threads (both daemons, stopped by ``Journal.close``):

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
from typing import TYPE_CHECKING

from confluent_kafka import KafkaException

from runjournal.producers._lease import InstanceLease
from runjournal.producers.errors import (
    JournalError,
    LeaseLapsedError,
    PartitionCountChangedError,
    ProducerFencedError,
    TopicNotFoundError,
)
from runjournal.producers.partitioner import partition_for

if TYPE_CHECKING:
    from runjournal.producers._txn import TxnPublisher

__all__ = ["InstanceLife"]

log = logging.getLogger("runjournal.producers.journal")


class InstanceLife:
    """Lease, fence and keeper half of :class:`~runjournal.producers.journal.Journal` (see the module docstring)."""

    producer_id: str
    transactional_id: str
    topic: str
    partitions: int
    _lease: InstanceLease
    _txn: TxnPublisher
    _stop: threading.Event
    _lapse_lock: threading.Lock
    _lapse_done: bool
    _fence_count: int
    _partition_error: PartitionCountChangedError | None
    _partition_of: dict[str, int]
    _max_txn_age_s: float
    _outcome_linger_s: float
    _metadata_interval_s: float

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
        count = self._txn.partition_count(10.0)
        if count is None:
            self._txn.close(1.0)
            raise TopicNotFoundError(f"topic {self.topic} does not exist (run `runjournal topics create`)")
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

"""Write-behind: the Redis apply of one partition batch runs on a worker thread while the main loop decodes and
folds the next batch. The round trip (send, the script in Redis, the reply) releases the GIL, so the two overlap.

Rules that keep the projection exactly-once in effect (docs/design/protocol.md § Projector; ``service.py``
applies them):

1. **One write in flight.** Its outcome is taken (:meth:`WriteBehind.wait`, on the main thread) before the next
   write is submitted: a batch is only ever written after every earlier batch of its partition is known applied.
2. **The next batch folds from the in-flight one.** Its partition's applied offset and state cache move to the
   in-flight batch's end when it is submitted; a run the cache lacks is taken from the in-flight batch
   (:meth:`WriteBehind.pending_states`) before Redis, which does not hold that batch yet.
3. **Offsets follow confirmed writes.** The group offset of a batch is stored for commit only when its outcome
   says applied; the states and the partition's applied offset land in one script, atomically, or not at all.
4. **Anything else re-seeks.** A refused batch (conflict, or Redis already ahead) or a failed write (Redis away,
   or a lost reply — applied or not, nobody knows) drops the partition's cache and any batch folded after it, and
   the partition is re-read from the applied offset Redis holds. A SIGKILL at any point leaves Redis either
   before or after one whole batch, and a restart seeks to Redis's offset: nothing is lost or applied twice.
5. **Rebalances wait.** A revoke or a loss takes the in-flight write's outcome before the partitions go, so the
   offsets committed for a revoked partition are the ones Redis holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from runjournal.consumers.projector._cache import StateCache
from runjournal.consumers.projector.store import ApplyResult, PreparedBatch, ProjectionStore
from runjournal.core import failpoints, otel
from runjournal.model.reducer import RunState

__all__ = ["PendingWrite", "WriteBehind", "WriteOutcome", "states_at"]


@dataclass(frozen=True)
class PendingWrite:
    """One partition batch handed to the write-behind thread."""

    batch: PreparedBatch
    """Keys and arguments of the apply script (serialised on the main thread)."""
    view: int
    """The partition's view generation the batch was folded from (``Projector._views``)."""
    dirty: Mapping[str, RunState | None]
    """run_id -> the state the batch writes (None: erased)."""
    before: Mapping[str, RunState | None]
    """run_id -> the state the batch folded from (for the outcome metrics once it is applied)."""
    records: int
    """Records the batch handled (no-ops included)."""

    @property
    def partition(self) -> int:
        """The source partition."""
        return self.batch.partition

    @property
    def last(self) -> int:
        """The last offset the batch handled."""
        return self.batch.new_offset


@dataclass(frozen=True)
class WriteOutcome:
    """How a :class:`PendingWrite` ended."""

    write: PendingWrite
    """The write."""
    result: ApplyResult | None
    """The script's answer; None when the call failed (see ``error``)."""
    error: Exception | None
    """Why the call failed (a redis-py error after its own quick retries); None when it answered."""
    seconds: float
    """Duration of the script call, seconds."""
    done_at: float
    """``time.perf_counter()`` when the call ended."""


class WriteBehind:
    """At most one apply-script call in flight, on a thread of its own.

    Args:
        run: the call (``ProjectionStore.run_batch``); thread-safe.
    """

    def __init__(self, run: Callable[[PreparedBatch], ApplyResult]) -> None:
        self._run = run
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rj-projector-write")
        self._inflight: tuple[PendingWrite, Future[WriteOutcome]] | None = None

    @property
    def in_flight(self) -> PendingWrite | None:
        """The write submitted and not yet taken by :meth:`wait`, or None."""
        return self._inflight[0] if self._inflight is not None else None

    def pending_states(self, partition: int, offset: int) -> Mapping[str, RunState | None]:
        """The states the in-flight write gives ``partition`` at applied offset ``offset`` (empty when it is another
        partition's or ends elsewhere); None values are runs it erases."""
        write = self.in_flight
        if write is None or write.partition != partition or write.last != offset:
            return {}
        return write.dirty

    def submit(self, write: PendingWrite) -> None:
        """Start ``write`` on the worker thread.

        Raises:
            RuntimeError: a write is in flight (take its outcome with :meth:`wait` first: rule 1).
        """
        if self._inflight is not None:
            raise RuntimeError("a write is in flight: wait() for its outcome before the next one")
        self._inflight = (write, self._pool.submit(self._execute, write, otel.current_link()))

    def aside(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the write thread after what is queued there (a side write nobody waits for, such as a lag
        sample); ``job`` handles its own failures."""
        self._pool.submit(job)

    def wait(self) -> WriteOutcome | None:
        """Block until the in-flight write ends and return its outcome (None when none is in flight)."""
        if self._inflight is None:
            return None
        _write, future = self._inflight
        outcome = future.result()  # _execute returns every failure as an outcome
        self._inflight = None
        return outcome

    def close(self) -> None:
        """Let a write still in flight end (its outcome is dropped: nothing is committed for it) and stop the
        thread."""
        self._inflight = None
        self._pool.shutdown(wait=True)

    def _execute(self, write: PendingWrite, link: Any = None) -> WriteOutcome:
        """``write`` on the write thread (a ``runjournal.projector.write`` span when traced, linked to its batch's
        apply span ``link``); every failure is returned in the outcome."""
        started = time.perf_counter()
        try:
            with otel.step_span("runjournal.projector.write", {"runjournal.partition": write.partition,
                                                               "runjournal.states": len(write.dirty),
                                                               "runjournal.offset": write.last},
                                links=[link] if link is not None else None):
                failpoints.hit("projector.before_write")
                result = self._run(write.batch)
                failpoints.hit("projector.after_write")
        except Exception as exc:  # noqa: BLE001 - handed to the main thread, which classifies it (failure policy)
            now = time.perf_counter()
            return WriteOutcome(write, None, exc, now - started, now)
        now = time.perf_counter()
        return WriteOutcome(write, result, None, now - started, now)


def states_at(cache: StateCache, writer: WriteBehind, store: ProjectionStore, partition: int, offset: int,
              run_ids: set[str]) -> dict[str, RunState | None]:
    """The states ``run_ids`` of ``partition`` have at applied offset ``offset`` (rule 2): from the cache when it is
    valid there, else from the write in flight (which Redis may not hold yet; None: it erases the run), else from
    Redis (``ProjectionStore.load``: one pipeline). Runs found nowhere are absent (nothing of them was applied).

    Raises:
        redis.RedisError: Redis unreachable (step 8 waits and folds the batch again).
    """
    cached, missing = cache.split(partition, offset, run_ids)
    states: dict[str, RunState | None] = dict(cached)
    pending = writer.pending_states(partition, offset) if missing else {}
    if pending:
        states.update((run_id, pending[run_id]) for run_id in missing if run_id in pending)
        missing = [run_id for run_id in missing if run_id not in pending]
    states.update(store.load(partition, missing))
    return states

"""Steps 3-4 of the projector per record: quarantine what cannot be decoded, fold the rest, count what changed.

The fold itself is the pure reducer's (``runjournal.model.reducer.apply``, or ``block`` for an undecodable record);
this module is the projector's bookkeeping around it (DLQ copies sent once, the blocked/erased/parked counters).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from confluent_kafka import Message

from runjournal.consumers.dlq import DeadLetters
from runjournal.consumers.projector._decode import Decoded
from runjournal.consumers.projector.metrics import ProjectorMetrics, count_outcomes
from runjournal.consumers.projector.stats import ProjectorStats
from runjournal.model.reducer import RunState, RunStatus, apply, block
from runjournal.schemas.errors import SchemaError
from runjournal.schemas.events import Event

__all__ = ["BatchFolder"]


class BatchFolder:
    """Folds decoded partition batches into run states for one projector.

    Args:
        critical: unknown writer types that block a run (``Settings.critical_types``).
        stats: the projector's counters (blocked, parked, erased, dead-lettered).
        metrics: the projector's Prometheus families.
        dlq: where undecodable records are copied.
        log: the projector's logger.
    """

    def __init__(self, critical: frozenset[str], stats: ProjectorStats, metrics: ProjectorMetrics,
                 dlq: DeadLetters, log: logging.Logger) -> None:
        self.critical = critical
        self.stats = stats
        self.metrics = metrics
        self.dlq = dlq
        self.log = log
        self.quarantined: set[tuple[int, int]] = set()
        """``(partition, offset)`` of records copied to the DLQ and not yet covered by an applied write: a batch
        folded again (after an outage, a refused or failed write) sends nothing twice."""

    def quarantine(self, fresh: Sequence[Message], decoded: Sequence[Decoded]) -> None:
        """Copy each undecodable record of a batch to the DLQ once (flushed by the caller before the write)."""
        for msg, (run_id, item) in zip(fresh, decoded, strict=True):
            if not isinstance(item, SchemaError):
                continue
            where = (msg.partition(), msg.offset())
            if where in self.quarantined:
                continue
            self.quarantined.add(where)
            self.dlq.send(msg, item)
            self.stats.dead_lettered += 1
            self.metrics.dead_lettered.labels(type(item).__name__).inc()
            self.log.warning("quarantined", extra={"topic": msg.topic(), "partition": msg.partition(),
                                                   "offset": msg.offset(), "error": str(item), "run_id": run_id})

    def fold(self, partition: int, fresh: Sequence[Message], decoded: Sequence[Decoded],
             states: dict[str, RunState | None]) -> dict[str, RunState | None]:
        """Fold every record of a batch into ``states`` (run_id -> state, updated in place).

        Returns:
            The runs that changed: run_id -> new state (None: erased by a tombstone).
        """
        dirty: dict[str, RunState | None] = {}
        critical = self.critical
        for msg, (run_id, item) in zip(fresh, decoded, strict=True):
            if run_id is None:
                continue
            state = states.get(run_id)
            if type(item) is Event:
                new = apply(state, item, partition=partition, offset=msg.offset(), critical=critical)
            else:
                new = self._other(state, item, partition, msg.offset(), run_id)
            if new is not state:
                states[run_id] = dirty[run_id] = new
        return dirty

    def _other(self, state: RunState | None, item: SchemaError | Event | None, partition: int, offset: int,
               run_id: str) -> RunState | None:
        """A tombstone (None: the run is erased) or an undecodable record (the run is BLOCKED)."""
        if item is None:
            if state is not None:
                self.stats.erased += 1
                self.metrics.erased.inc()
            return None
        if run_id not in self.stats.blocked_runs:
            self.metrics.blocked.inc()
        self.stats.blocked_runs.add(run_id)
        return block(state, run_id, f"{type(item).__name__}: {item}", partition=partition, offset=offset)

    def applied(self, partition: int, last: int, dirty: Mapping[str, RunState | None],
                before: Mapping[str, RunState | None]) -> None:
        """A batch of ``partition`` up to offset ``last`` is in Redis: count its parked runs and call outcomes, and
        forget its quarantined records."""
        for run_id, state in dirty.items():
            if state is not None and state.status is RunStatus.GAP and run_id not in self.stats.parked_runs:
                self.stats.parked_runs.add(run_id)
                self.metrics.parked.inc()
        count_outcomes(self.metrics, before, dirty)
        if self.quarantined:
            self.quarantined = {w for w in self.quarantined if w[0] != partition or w[1] > last}

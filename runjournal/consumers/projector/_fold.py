"""Steps 3-4 of the projector per record: decode, fold, quarantine what cannot be decoded, count what changed.

The decode is the codec's (:meth:`~runjournal.schemas.codec.EventCodec.decode`: the same events, the same errors as
any reader), the fold the pure reducer's (``runjournal.model.reducer.apply``, or ``block`` for an undecodable
record); this module is the projector's loop and bookkeeping around them (DLQ copies sent once, the
blocked/erased/parked counters). Each record is decoded and folded at once, so its event is freed before the next is
decoded: the decoder runs in warm memory, as a bare decode loop does (decoding a whole batch first and then folding
it cost ~6 % more CPU on pair 3).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import Message

from runjournal.consumers.projector.metrics import ProjectorMetrics, count_outcomes
from runjournal.consumers.projector.stats import ProjectorStats
from runjournal.consumers.runtime.dlq import DeadLetters
from runjournal.consumers.runtime.failures import TRANSIENT, classify
from runjournal.model.reducer import RunState, RunStatus, apply, block
from runjournal.schemas import EventCodec
from runjournal.schemas.errors import SchemaError
from runjournal.schemas.events import Event
from runjournal.schemas.keys import KeyFormatError, parse_event_key, run_id_of_key

__all__ = ["BatchFolder", "Folded", "run_id_from_key"]


@dataclass(frozen=True)
class Folded:
    """A batch folded by :meth:`BatchFolder.decode_fold`."""

    states: dict[str, RunState | None]
    """Every run the batch touched (or its keys named) -> its state after the batch."""
    before: dict[str, RunState | None]
    """The same runs -> their state before it (absent: none)."""
    dirty: dict[str, RunState | None]
    """The runs that changed -> their new state (None: erased)."""


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

    def _quarantine(self, msg: Message, run_id: str | None, exc: SchemaError) -> None:
        where = (msg.partition(), msg.offset())
        if where in self.quarantined:
            return
        self.quarantined.add(where)
        self.dlq.send(msg, exc)
        self.stats.dead_lettered += 1
        self.metrics.dead_lettered.labels(type(exc).__name__).inc()
        self.log.warning("quarantined", extra={"topic": msg.topic(), "partition": msg.partition(),
                                               "offset": msg.offset(), "error": str(exc), "run_id": run_id})

    def decode_fold(self, codec: EventCodec, topic: str, partition: int, fresh: Sequence[Message],
                    load: Callable[[set[str]], dict[str, RunState | None]]) -> Folded:
        """Steps 3-4 in one pass: decode each record and fold it at once (its event is freed before the next is
        decoded: the decoder works in warm memory, as a bare decode loop does), then quarantine the undecodable.

        ``load(run_ids)`` gives the states runs have at the batch's start (absent: none); it is called once for the
        runs the record keys name, and again for a run an event names that its key did not.

        Raises:
            RegistryError: the schema registry (or schemas topic) cannot be reached — not a bad record: nothing of
                the batch is quarantined (step 8 waits and folds it again).
        """
        named = {run_id_of_key(k).decode("utf-8", "replace") for k in (m.key() for m in fresh) if k}
        states = load(named)
        before = dict(states)
        dirty: dict[str, RunState | None] = {}
        bad: list[tuple[Message, str | None, SchemaError]] = []
        decode, critical = codec.decode, self.critical
        for msg in fresh:
            offset = msg.offset()
            item = _decode(decode, msg.value(), topic, partition, offset)
            if type(item) is Event:
                run_id = item.run_id
                if run_id not in named:  # the key named another run (or none): load that run's state too
                    named.add(run_id)
                    extra = load({run_id})
                    states.update(extra)
                    before.update(extra)
                state = states.get(run_id)
                new = apply(state, item, partition=partition, offset=offset, critical=critical)
            else:
                key_run = run_id_from_key(msg.key())
                if isinstance(item, SchemaError):
                    bad.append((msg, key_run, item))
                if key_run is None:
                    continue
                run_id, state = key_run, states.get(key_run)
                new = self._other(state, item, partition, offset, run_id)
            if new is not state:
                states[run_id] = dirty[run_id] = new
        for msg, bad_run, exc in bad:
            self._quarantine(msg, bad_run, exc)
        return Folded(states, before, dirty)

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


def run_id_from_key(key: bytes | None) -> str | None:
    """``run_id`` from a key ``{run_id}:{epoch}:{seq}``; None when the key is not of that form."""
    if not key:
        return None
    try:
        return parse_event_key(key).run_id
    except KeyFormatError:
        return None


def _decode(decode: Callable[..., Event], value: bytes | None, topic: str, partition: int,
            offset: int) -> Event | SchemaError | None:
    """One record's value decoded: the event, None for a tombstone, or the error that makes it undecodable.

    Raises:
        RegistryError: the registry (or schemas topic) is away: a transient failure, not a bad record.
    """
    if value is None:
        return None
    try:
        return decode(value, topic=topic, partition=partition, offset=offset)
    except SchemaError as exc:
        if classify(exc).kind == TRANSIENT:
            raise
        return exc

"""Fold the tail of each partition onto the Redis snapshot: the recovery job's view of a run.

For each partition: the projector's applied offset ``a`` is read from Redis first, then the
run states (a :class:`Snapshot` at or after ``a``: one pipelined round trip for every partition's
offset, one pipeline of HGETALLs per partition); records ``a+1 … end-1`` of the runs of interest are folded onto
them with the pure reducer, which skips what a state already holds (by position). So the snapshot
may be read at any time before the fold — the recovery job reads the named runs' snapshots before
it fences, to learn their owners, and folds from them in every round. ``end`` is the high watermark
read once, after fencing, by a ``read_uncommitted`` query: nothing of a fenced zombie can land
before it unseen. It must be the high watermark, not the last stable offset a ``read_committed``
reader is shown: a live instance's open transaction holds the LSO back, and a record
committed beyond it (e.g. a RUN_RESUMED of an earlier pass) would be missed.

The tail is read ``read_committed`` by :func:`runjournal.consumers.runtime.partitions.read_ranges`, which decides
from positions against ``end`` (control markers, aborted records, an empty, truncated or compacted
tail all count), and waits (bounded) while a transaction that started before ``end`` is still open.
A partition that cannot be read to its end — that transaction stays open, or the schema registry
stays away longer than the failure policy waits — is reported ``complete=False`` with its reason;
its runs get no decision in this pass, and the other partitions' runs are decided as usual.
Cost grows with the tail since the projector's position, not with history.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import Message

from runjournal.consumers.projector.store import ProjectionStore
from runjournal.consumers.runtime.failures import RECORD, DependencyUnavailableError, FailurePolicy, classify
from runjournal.consumers.runtime.partitions import range_consumer, read_ranges, watermarks
from runjournal.core.settings import Settings
from runjournal.model.reducer import RunState, apply, block
from runjournal.schemas import EventCodec
from runjournal.schemas.errors import SchemaError
from runjournal.schemas.keys import run_id_of_key

__all__ = ["PartitionRead", "Snapshot", "end_offsets", "fold_tails", "read_snapshots"]


@dataclass(frozen=True)
class PartitionRead:
    """What recovery read of one partition."""

    partition: int
    """Partition number."""
    start: int
    """First offset read (the projector's applied offset + 1, or the log start offset when that is later)."""
    end: int
    """End offset read at start (exclusive): the high watermark after fencing."""
    records: int
    """Records consumed from the tail (all runs)."""
    folded: int
    """Records of the recovered runs folded onto their snapshots."""
    complete: bool = True
    """False: the partition was not read to ``end`` (see ``reason``); its runs were not decided."""
    reason: str | None = None
    """Why it is incomplete."""


@dataclass(frozen=True)
class Snapshot:
    """The projection's view of some runs of one partition: where a tail fold starts."""

    applied: int
    """The partition's applied offset, read before the states (-1: none); the fold starts at ``applied + 1``."""
    states: Mapping[str, RunState]
    """run_id -> projected state, read after ``applied`` (at or after it); a run not projected is absent."""
    runs: frozenset[str]
    """The run ids that were read (projected or not)."""

    def merged(self, other: Snapshot) -> Snapshot:
        """Both views: the lower applied offset (each state is at or after it), ``other``'s states first."""
        return Snapshot(min(self.applied, other.applied), {**self.states, **other.states}, self.runs | other.runs)


def read_snapshots(store: ProjectionStore, policy: FailurePolicy,
                   runs_by_partition: Mapping[int, Iterable[str]]) -> dict[int, Snapshot]:
    """The applied offset, then the states, of every partition's runs (two pipelined Redis round trips).

    Args:
        store: the projection.
        policy: the failure policy (a Redis outage waits, bounded).
        runs_by_partition: partition -> run ids.

    Returns:
        partition -> :class:`Snapshot`.

    Raises:
        DependencyUnavailableError: Redis stayed away longer than the policy waits.
        FatalDependencyError: Redis refused (e.g. the ACL user may not read the projection).
    """
    wanted = {p: frozenset(runs) for p, runs in runs_by_partition.items()}
    read = policy.call("load states", lambda: store.snapshot(wanted))
    return {p: Snapshot(applied, states, wanted[p]) for p, (applied, states) in read.items()}


def end_offsets(settings: Settings, partitions: list[int] | set[int], *,
                timeout_s: float = 10.0) -> dict[int, tuple[int, int]]:
    """``(log start offset, high watermark)`` of each partition (a ``read_uncommitted`` ListOffsets)."""
    return watermarks(settings, sorted(partitions), timeout_s=timeout_s)


def fold_tails(
    settings: Settings, store: ProjectionStore, codec: EventCodec, runs_by_partition: dict[int, set[str]],
    bounds: Mapping[int, tuple[int, int]], *, policy: FailurePolicy, timeout_s: float = 30.0,
    snapshots: Mapping[int, Snapshot] | None = None,
) -> tuple[dict[str, RunState | None], list[PartitionRead]]:
    """Snapshot + tail fold for every run in ``runs_by_partition``.

    Args:
        bounds: partition -> ``(log start offset, end offset)`` from :func:`end_offsets`, read after fencing.
        policy: the failure policy (Redis and registry outages wait, bounded).
        timeout_s: longest the tails are read, seconds; partitions not finished by then are incomplete.
        snapshots: snapshots already read (:func:`read_snapshots`, at any time before: the fold from their
            applied offset reaches ``bounds`` whenever they were read); runs they do not cover are read now.
            Never modified.

    Returns:
        ``(states, reads)``: run_id -> state (None: the run has no fact at all), and one
        :class:`PartitionRead` per partition (``complete=False``: decide nothing from that partition's runs).

    Raises:
        KafkaException: the broker is unreachable.
        DependencyUnavailableError: Redis stayed away longer than the policy waits.
    """
    snaps = _covering(store, policy, runs_by_partition, snapshots or {})
    states: dict[str, RunState | None] = {r: snaps[p].states.get(r) for p, runs in runs_by_partition.items()
                                          for r in runs}
    starts = {p: max(snaps[p].applied + 1, bounds[p][0]) for p in runs_by_partition}
    ranges = {p: (starts[p], bounds[p][1]) for p in runs_by_partition}
    counts = {p: [0, 0] for p in runs_by_partition}
    reasons: dict[int, str] = {}
    wanted = {p: {r.encode() for r in runs} for p, runs in runs_by_partition.items()}
    critical = settings.critical_types

    def on_record(msg: Message) -> bool:
        p = msg.partition()
        counts[p][0] += 1
        rid = run_id_of_key(msg.key())
        if rid not in wanted[p]:
            return True
        counts[p][1] += 1
        run_id = rid.decode()
        try:  # the policy's retry loop costs more than the fold itself: enter it only when a fold fails
            states[run_id] = _fold_one(codec, states[run_id], run_id, msg, critical)
        except Exception:  # noqa: BLE001 - the same (pure) fold again under the policy, which classifies and waits
            try:
                states[run_id] = policy.call("decode", lambda: _fold_one(codec, states[run_id], run_id, msg, critical))
            except DependencyUnavailableError as exc:
                reasons[p] = str(exc)
                return False
        return True

    consumer = range_consumer(settings, "recovery")
    try:
        unfinished = read_ranges(consumer, settings.events_topic, ranges, on_record, timeout_s=timeout_s)
    finally:
        consumer.close()
    for p in unfinished:
        reasons.setdefault(p, f"not read to end offset {ranges[p][1]} within {timeout_s:.0f} s (a transaction "
                              "opened before it is still undecided)")
    reads = [PartitionRead(p, starts[p], ranges[p][1], counts[p][0], counts[p][1], p not in reasons, reasons.get(p))
             for p in sorted(runs_by_partition)]
    return states, reads


def _covering(store: ProjectionStore, policy: FailurePolicy, runs_by_partition: dict[int, set[str]],
              snapshots: Mapping[int, Snapshot]) -> dict[int, Snapshot]:
    """``snapshots`` completed with a read of the runs they do not cover (merged per partition)."""
    missing = {p: set(runs) - (snapshots[p].runs if p in snapshots else frozenset())
               for p, runs in runs_by_partition.items()}
    missing = {p: runs for p, runs in missing.items() if runs}
    fresh = read_snapshots(store, policy, missing) if missing else {}
    out = dict(snapshots)
    for p, snap in fresh.items():
        out[p] = out[p].merged(snap) if p in out else snap
    return out


def _fold_one(codec: EventCodec, state: RunState | None, run_id: str, msg: Message,
              critical: frozenset[str]) -> RunState | None:
    """Fold one record; an undecodable one BLOCKs the run, a registry outage raises (the policy waits);
    an unknown event type declared ``critical`` BLOCKs it too (see ``runjournal.model.reducer.apply``)."""
    value = msg.value()
    p, off = msg.partition(), msg.offset()
    if value is None:
        return None  # tombstone: the run is being erased
    try:
        event = codec.decode(value, topic=msg.topic(), partition=p, offset=off)
    except SchemaError as exc:
        if classify(exc).kind != RECORD:
            raise
        return block(state, run_id, f"{type(exc).__name__}: {exc}", partition=p, offset=off)
    return apply(state, event, partition=p, offset=off, critical=critical)

"""The runs index: a small summary of every run, written with its state in the projector's atomic batch.

``rj:{P.p}:index`` is a Redis hash (run_id → summary JSON) in the partition's hash slot, so the projector's one
script per partition batch writes a run's state and its summary together (``store.ProjectionStore.apply_batch``):
the index is never ahead of or behind the states. It exists for lists (``runjournal console``): reading it costs
one HGETALL of ~200 bytes per run per partition instead of every run's whole state with its execution records
(10k runs: ~2 MB instead of ~30 MB; ``bench/console.py``). A projection written before the index existed is
read from the states for the runs the index lacks (:func:`read_index`), until the next ``projector --rebuild``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from runjournal.model.pmap import RecordMap
from runjournal.model.reducer import CallStatus, RunState, RunStatus

__all__ = ["RunSummary", "attention", "read_entries", "read_index", "summary_json"]

_PARKED = {RunStatus.GAP.value, RunStatus.BLOCKED.value}
_TERMINAL = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value, RunStatus.CANCELLED.value}
_WAITING = RunStatus.WAITING_APPROVAL.value


def summary_json(state: RunState) -> bytes:
    """The index entry of ``state``: compact JSON (UTF-8) of the fields a runs list filters, sorts and shows.

    Keys: ``id`` run, ``s`` status, ``t`` tenant, ``a`` agent, ``u`` user, ``e`` epoch, ``q`` last seq, ``o`` owner,
    ``b`` / ``m`` / ``f`` started / updated / finished (ms since the epoch), ``c`` calls, ``k`` OUTCOME_UNKNOWN
    calls, ``r`` RECONCILED calls, ``p`` pending approvals. O(1): the records' counts are kept by their
    :class:`~runjournal.model.pmap.RecordMap` (a plain mapping is counted).
    """
    import orjson

    records = state.records
    if isinstance(records, RecordMap):  # counted as the reducer set them: O(1) (issue 29)
        unknown, reconciled = records.unknown, records.reconciled
    else:
        unknown = reconciled = 0
        for record in records.values():
            if record.status is CallStatus.OUTCOME_UNKNOWN:
                unknown += 1
            elif record.status is CallStatus.RECONCILED:
                reconciled += 1
    return orjson.dumps({"id": state.run_id, "s": state.status.value, "t": state.tenant_id, "a": state.agent,
                         "u": state.user_id, "e": state.epoch, "q": state.last_seq, "o": state.owner,
                         "b": state.started_at_ms, "m": state.updated_at_ms, "f": state.finished_at_ms,
                         "c": len(state.records), "k": unknown, "r": reconciled, "p": len(state.pending_approvals)})


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One run as the runs list shows it (from the index entry)."""

    run_id: str
    """The run."""
    partition: int
    """Its partition of the events topic."""
    status: str
    """``RunStatus`` value."""
    tenant_id: str | None
    """Owning tenant."""
    agent: str | None
    """RUN_STARTED ``agent``."""
    user_id: str | None
    """RUN_STARTED ``user_id``."""
    epoch: int
    """Ownership epoch (> 1: the run was recovered)."""
    last_seq: int
    """Seq of its last event."""
    owner: str | None
    """The current epoch's writer."""
    started_at_ms: int | None
    """RUN_STARTED time, ms since the epoch."""
    updated_at_ms: int | None
    """Last execution-state change, ms since the epoch."""
    finished_at_ms: int | None
    """Terminal event time, ms since the epoch."""
    calls: int
    """Execution records (tool calls)."""
    unknown_calls: int
    """Calls in OUTCOME_UNKNOWN."""
    reconciled_calls: int
    """Calls settled through the provider (RECONCILED)."""
    pending_approvals: int
    """Approvals requested and not decided."""

    @property
    def parked(self) -> bool:
        """GAP or BLOCKED."""
        return self.status in _PARKED

    @property
    def attention(self) -> int:
        """Sort rank, most urgent first: 0 parked, 1 an OUTCOME_UNKNOWN call, 2 waiting for approval,
        3 running, 4 terminal."""
        if self.status in _PARKED:
            return 0
        if self.unknown_calls:
            return 1
        if self.status == _WAITING or self.pending_approvals:
            return 2
        return 4 if self.status in _TERMINAL else 3

    @classmethod
    def from_dict(cls, partition: int, d: dict[str, Any]) -> RunSummary:
        """From a decoded index entry written by :func:`summary_json`."""
        return cls(d["id"], partition, d["s"], d["t"], d["a"], d["u"], d["e"], d["q"], d["o"], d["b"], d["m"],
                   d["f"], d["c"], d["k"], d["r"], d["p"])


def attention(entry: dict[str, Any]) -> int:
    """:attr:`RunSummary.attention` of a decoded index entry (lists sort 10k entries without building objects)."""
    status = entry["s"]
    if status in _PARKED:
        return 0
    if entry["k"]:
        return 1
    if status == _WAITING or entry["p"]:
        return 2
    return 4 if status in _TERMINAL else 3


def read_entries(client: Any, store: Any, partitions: Iterable[int]) -> list[dict[str, Any]]:
    """Every run of ``partitions`` as its decoded index entry (keys as written by :func:`summary_json`, plus
    ``pt``: the partition), from one pipelined HVALS per partition; runs the index lacks (a projection older
    than the index) are summarised from their states.

    Args:
        client: redis-py client.
        store: the :class:`~runjournal.consumers.projector.store.ProjectionStore` of the prefix.
        partitions: which partitions to read.

    Raises:
        redis.RedisError: Redis unreachable.
    """
    import orjson

    parts = list(partitions)
    pipe = client.pipeline(transaction=False)
    for p in parts:
        pipe.hvals(store.index_key(p))
        pipe.scard(store.runs_key(p))
    replies = pipe.execute()
    out: list[dict[str, Any]] = []
    for i, p in enumerate(parts):
        values: list[bytes] = replies[2 * i]
        # one parse per partition: the entries joined as a JSON array (10k entries: one orjson call, not 10k)
        entries: list[dict[str, Any]] = orjson.loads(b"[" + b",".join(values) + b"]")
        if int(replies[2 * i + 1]) > len(entries):
            known = {e["id"] for e in entries}
            missing = {r for r in store.run_ids(p) if r not in known}
            entries += [orjson.loads(summary_json(st)) for st in store.load(p, missing).values()]
        for entry in entries:
            entry["pt"] = p
        out += entries
    return out


def read_index(client: Any, store: Any, partitions: Iterable[int]) -> list[RunSummary]:
    """:func:`read_entries` as :class:`RunSummary` objects."""
    return [RunSummary.from_dict(e["pt"], e) for e in read_entries(client, store, partitions)]

"""Second implementations of the execution store contracts, run through the same contract suites as the real ones
(tests/test_store_contracts.py): an in-memory EventStore (a fake, style note 21) and a StateStore /
ExecutionRecordStore / CheckpointStore that folds the run's events from any EventStore on every read (the
reference the Redis projection must agree with)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from runjournal.model import ExecutionRecord, RunState, fold, unsettled_calls
from runjournal.producers.partitioner import partition_for
from runjournal.schemas.events import Event
from runjournal.stores import Authority, Checkpoint, EventPosition, EventStore, Plane, StoredEvent


class InMemoryEventStore:
    """TEST FAKE of :class:`~runjournal.stores.EventStore`: one list per partition, murmur2 partitioning."""

    plane = Plane.EXECUTION
    authority = Authority.AUTHORITATIVE

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self._logs: list[list[StoredEvent]] = [[] for _ in range(partitions)]

    def append(self, events: Sequence[Event]) -> list[EventPosition]:
        out = []
        for event in events:
            p = partition_for(event.run_id, self.partitions)
            self._logs[p].append(StoredEvent(p, len(self._logs[p]), event.key, event))
            out.append(EventPosition(p, len(self._logs[p]) - 1))
        return out

    def read_run(self, run_id: str) -> list[StoredEvent]:
        return [r for r in self._logs[partition_for(run_id, self.partitions)] if r.key.startswith(f"{run_id}:")]

    def read_from(self, partition: int, offset: int, *, limit: int = 1000) -> list[StoredEvent]:
        return self._logs[partition][max(offset, 0):max(offset, 0) + limit]


class FoldingRunStore:
    """StateStore + ExecutionRecordStore + CheckpointStore folded from ``events`` on every read (no cache)."""

    plane = Plane.EXECUTION
    authority = Authority.DERIVED

    def __init__(self, events: EventStore) -> None:
        self.events = events

    def get(self, run_id: str) -> RunState | None:
        return fold((r.event, r.partition, r.offset) for r in self.events.read_run(run_id) if r.event is not None)

    def version(self, run_id: str) -> tuple[int, int] | None:
        state = self.get(run_id)
        return (state.applied_partition, state.applied_offset) if state else None

    def records(self, run_id: str) -> Mapping[str, ExecutionRecord]:
        state = self.get(run_id)
        return dict(state.records) if state else {}

    def record(self, run_id: str, call_id: str) -> ExecutionRecord | None:
        return self.records(run_id).get(call_id)

    def checkpoint(self, run_id: str) -> Checkpoint | None:
        state = self.get(run_id)
        if state is None:
            return None
        return Checkpoint(run_id, state, state.applied_partition, state.applied_offset,
                          self.applied_offset(state.applied_partition), tuple(sorted(state.pending_approvals)),
                          unsettled_calls(state))

    def applied_offset(self, partition: int) -> int:
        offset, tail = 0, -1
        while batch := self.events.read_from(partition, offset, limit=1000):
            tail, offset = batch[-1].offset, batch[-1].offset + 1
        return tail

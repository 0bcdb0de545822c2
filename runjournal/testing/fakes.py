"""In-memory fakes of the store contracts, run through the same contract suites as the real backends
(:mod:`runjournal.testing.contracts`)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from runjournal.model import ExecutionRecord, RunState, fold, unsettled_calls
from runjournal.schemas.events import Event
from runjournal.schemas.keys import parse_event_key, partition_for
from runjournal.stores import Authority, Checkpoint, EventPosition, EventStore, Plane, StoredEvent

__all__ = ["FoldingRunStore", "HashingEmbedder", "InMemoryEventStore"]


class InMemoryEventStore:
    """A fake :class:`~runjournal.stores.EventStore`: one list per partition, murmur2 partitioning (the topic's).

    Args:
        partitions: the partition count (>= 1), as the events topic's.
    """

    plane = Plane.EXECUTION
    authority = Authority.AUTHORITATIVE

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self._logs: list[list[StoredEvent]] = [[] for _ in range(partitions)]

    def append(self, events: Sequence[Event]) -> list[EventPosition]:
        """Append ``events`` in order, each to its run's partition; returns their positions."""
        out = []
        for event in events:
            p = partition_for(event.run_id, self.partitions)
            self._logs[p].append(StoredEvent(p, len(self._logs[p]), event.key, event))
            out.append(EventPosition(p, len(self._logs[p]) - 1))
        return out

    def read_run(self, run_id: str) -> list[StoredEvent]:
        """Every stored event of ``run_id``, in offset order."""
        return [r for r in self._logs[partition_for(run_id, self.partitions)]
                if parse_event_key(r.key).run_id == run_id]

    def read_from(self, partition: int, offset: int, *, limit: int = 1000) -> list[StoredEvent]:
        """Up to ``limit`` stored events of ``partition`` from ``offset`` on."""
        return self._logs[partition][max(offset, 0):max(offset, 0) + limit]


class FoldingRunStore:
    """StateStore + ExecutionRecordStore + CheckpointStore folded from ``events`` on every read (no cache): the
    reference a projection must agree with.

    Args:
        events: any :class:`~runjournal.stores.EventStore`.
    """

    plane = Plane.EXECUTION
    authority = Authority.DERIVED

    def __init__(self, events: EventStore) -> None:
        self.events = events

    def get(self, run_id: str) -> RunState | None:
        """The run's state: the fold of its stored events; None when it has none."""
        return fold((r.event, r.partition, r.offset) for r in self.events.read_run(run_id) if r.event is not None)

    def version(self, run_id: str) -> tuple[int, int] | None:
        """``(partition, offset)`` of the state's last applied event, or None."""
        state = self.get(run_id)
        return (state.applied_partition, state.applied_offset) if state else None

    def records(self, run_id: str) -> Mapping[str, ExecutionRecord]:
        """The run's execution records by call id."""
        state = self.get(run_id)
        return dict(state.records) if state else {}

    def record(self, run_id: str, call_id: str) -> ExecutionRecord | None:
        """One execution record, or None."""
        return self.records(run_id).get(call_id)

    def checkpoint(self, run_id: str) -> Checkpoint | None:
        """The state with the offset it covers and what is pending, or None."""
        state = self.get(run_id)
        if state is None:
            return None
        return Checkpoint(run_id, state, state.applied_partition, state.applied_offset,
                          self.applied_offset(state.applied_partition), tuple(sorted(state.pending_approvals)),
                          unsettled_calls(state))

    def applied_offset(self, partition: int) -> int:
        """The last offset of ``partition`` (-1 when empty): a fold applies everything stored."""
        offset, tail = 0, -1
        while batch := self.events.read_from(partition, offset, limit=1000):
            tail, offset = batch[-1].offset, batch[-1].offset + 1
        return tail


class HashingEmbedder:
    """TEST DOUBLE of :class:`~runjournal.consumers.vectors.Embedder`: words and character trigrams hashed (blake2b)
    into ``dimension`` signed buckets, L2-normalised. Similarity is word overlap, nothing more; its
    ``embedder_id`` starts with ``TEST-DOUBLE`` so its vectors never share a collection with a real model's.

    Args:
        dimension: vector length (default 64).
        fail_on: raise ``EmbedderError`` for any batch holding a text containing this string (dead-letter tests).
    """

    embedder_id = "TEST-DOUBLE-hashing@1"

    def __init__(self, dimension: int = 64, fail_on: str | None = None) -> None:
        self.dimension = dimension
        self.fail_on = fail_on
        self.calls = 0
        """Batches embedded so far."""

    def embed(self, texts: Sequence[str]) -> Any:
        """A ``(len(texts), dimension)`` float32 array (numpy), each row of norm 1.

        Raises:
            EmbedderError: a text holds ``fail_on``.
        """
        import numpy as np

        from runjournal.consumers.vectors.errors import EmbedderError

        self.calls += 1
        if self.fail_on is not None and any(self.fail_on in t for t in texts):
            raise EmbedderError(f"test double refuses texts containing {self.fail_on!r}")
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            words = re.findall(r"[a-z0-9]+", text.lower())
            grams = [w[i:i + 3] for w in words for i in range(max(1, len(w) - 2))]
            for feature in [*words, *grams] or [text]:
                digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
                bucket = int.from_bytes(digest[:4], "little") % self.dimension
                out[row, bucket] += 1.0 if digest[4] & 1 else -1.0
            norm = float(np.linalg.norm(out[row]))
            if norm == 0.0:
                out[row, 0], norm = 1.0, 1.0
            out[row] /= norm
        return out

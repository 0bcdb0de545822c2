"""``runtime.partitions.read_ranges`` returns as soon as a range is read: a small read (a run's history for
``inspect``, the console's run page, approve, erase) never waits out a batch timeout.

A stand-in for the consumer keeps librdkafka's timing rules on a simulated clock — ``consume(n, timeout)`` waits its
whole timeout unless ``n`` records arrive, ``poll(timeout)`` returns the next record as soon as there is one — so
the test counts the seconds a read would have waited instead of timing it (speed goals live in ``make bench``).
"""

from __future__ import annotations

import types
from typing import Any

from confluent_kafka import KafkaError

from runjournal.consumers.runtime.partitions import read_ranges


class _Record:
    def __init__(self, offset: int, error: KafkaError | None = None) -> None:
        self._offset, self._error = offset, error

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def error(self) -> KafkaError | None:
        return self._error


class _Partition:
    """Partition 0 holding ``records`` records, then its EOF event; ``waited_s`` adds what each call would wait."""

    def __init__(self, records: int) -> None:
        self.queue = [_Record(o) for o in range(records)] + [_Record(records, KafkaError(KafkaError._PARTITION_EOF))]  # noqa: SLF001
        self.waited_s = 0.0
        self.read_to = 0

    def assign(self, _partitions: Any) -> None:
        pass

    def pause(self, _partitions: Any) -> None:
        pass

    def _take(self, n: int) -> list[_Record]:
        out, self.queue = self.queue[:n], self.queue[n:]
        self.read_to = max([self.read_to, *(r.offset() + (r.error() is None) for r in out)])
        return out

    def consume(self, n: int, timeout: float = -1) -> list[_Record]:
        out = self._take(n)
        if len(out) < n:
            self.waited_s += max(timeout, 0)  # fewer than n arrived: the whole timeout is waited out
        return out

    def poll(self, timeout: float = -1) -> _Record | None:
        out = self._take(1)
        if not out:
            self.waited_s += max(timeout, 0)
        return out[0] if out else None

    def position(self, partitions: Any) -> list[Any]:
        return [types.SimpleNamespace(partition=tp.partition, offset=self.read_to) for tp in partitions]


def test_a_small_range_is_read_without_waiting_out_a_batch() -> None:
    partition = _Partition(10)
    seen: list[int] = []
    left = read_ranges(partition, "t.events", {0: (0, 10)}, lambda m: seen.append(m.offset()), timeout_s=5)  # type: ignore[arg-type]
    assert left == set() and seen == list(range(10))
    assert partition.waited_s == 0.0  # before: 0.2 s (consume(1000, timeout=0.2) for 10 records)


def test_a_large_range_is_read_in_batches_as_before() -> None:
    partition = _Partition(2500)
    seen: list[int] = []
    assert read_ranges(partition, "t.events", {0: (0, 2500)}, lambda m: seen.append(m.offset()), timeout_s=5) == set()  # type: ignore[arg-type]
    assert seen == list(range(2500)) and partition.waited_s == 0.0

"""Run-to-partition mapping: Kafka's murmur2, bit for bit, as the Java default partitioner uses it.

DESIGN.md § Topic layout: *the partition is chosen from ``run_id`` alone (Kafka's murmur2,
as the Java default partitioner would for key=run_id), so one run is one ordered stream.*
Every event of a run carries the key ``{run_id}:{epoch}:{seq}``, so the client's own
partitioner would scatter a run; the journal therefore computes the partition here, from
``run_id`` alone, and passes it explicitly to ``produce()``.

:func:`murmur2` reproduces ``org.apache.kafka.common.utils.Utils.murmur2(byte[])`` (seed
``0x9747b28c``, signed 32-bit result) and :func:`to_positive` ``Utils.toPositive`` (``h &
0x7fffffff``), so :func:`partition_for` equals
``Utils.toPositive(Utils.murmur2(runId.getBytes(UTF_8))) % numPartitions`` — the Java
``BuiltInPartitioner.partitionForKey`` result, and librdkafka's ``murmur2_random``.
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["murmur2", "partition_for", "to_positive"]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 hash of ``data``, as a *signed* int (like Java's ``int``).

    Args:
        data: the bytes to hash (for a run: ``run_id.encode("utf-8")``).

    Returns:
        The hash in ``[-2**31, 2**31)``, identical to ``Utils.murmur2(data)`` in the Java client.
    """
    length = len(data)
    h = (_SEED ^ length) & _MASK
    n4 = length - (length % 4)
    for i in range(0, n4, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> _R
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length % 4
    # Java's switch falls through 3 -> 2 -> 1; the tail bytes are signed (byte & 0xff).
    if rest == 3:
        h ^= data[n4 + 2] << 16
    if rest >= 2:
        h ^= data[n4 + 1] << 8
    if rest >= 1:
        h ^= data[n4]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(number: int) -> int:
    """``Utils.toPositive``: clear the sign bit of a 32-bit int (not ``abs``: ``MIN_VALUE`` maps to 0)."""
    return number & 0x7FFFFFFF


def partition_for(run_id: str, num_partitions: int) -> int:
    """The partition of every event of ``run_id`` in a topic of ``num_partitions`` partitions.

    Args:
        run_id: the run's id; hashed as its UTF-8 bytes.
        num_partitions: the events topic's partition count (fixed at creation; >= 1).

    Returns:
        ``to_positive(murmur2(run_id.encode("utf-8"))) % num_partitions``.

    Raises:
        ValueError: ``num_partitions`` < 1.
    """
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    return _partition(run_id, num_partitions)


@lru_cache(maxsize=65_536)
def _partition(run_id: str, num_partitions: int) -> int:
    """Memoised: murmur2 in pure Python costs ~6 µs, and every event of a run asks again (pure function)."""
    return to_positive(murmur2(run_id.encode("utf-8"))) % num_partitions

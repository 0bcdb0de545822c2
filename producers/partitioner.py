"""Run-to-partition mapping: Kafka's murmur2, as the Java default partitioner uses it.

DESIGN.md § Topic layout: *the partition is chosen from ``run_id`` alone (Kafka's murmur2,
as the Java default partitioner would for key=run_id), so one run is one ordered stream.*
Every event of a run carries the key ``{run_id}:{epoch}:{seq}``, so the client's own
partitioner would scatter a run; the journal therefore computes the partition here, from
``run_id`` alone, and passes it explicitly to ``produce()``.

:func:`partition_for` is ``confluent_kafka.murmur2`` (librdkafka's C murmur2, Java-compatible: it
equals ``Utils.toPositive(Utils.murmur2(runId.getBytes(UTF_8))) % numPartitions``, the Java
``BuiltInPartitioner.partitionForKey`` result). The tests hold it against an independent
pure-Python murmur2 (Kafka's UtilsTest vectors; 100k random keys, several partition counts).
"""

from __future__ import annotations

from confluent_kafka import murmur2 as _murmur2

__all__ = ["partition_for"]


def partition_for(run_id: str, num_partitions: int) -> int:
    """The partition of every event of ``run_id`` in a topic of ``num_partitions`` partitions.

    Args:
        run_id: the run's id; hashed as its UTF-8 bytes.
        num_partitions: the events topic's partition count (fixed at creation; >= 1).

    Returns:
        ``toPositive(murmur2(run_id as UTF-8)) % num_partitions``, in ``[0, num_partitions)``.

    Raises:
        ValueError: ``num_partitions`` < 1.
    """
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    return int(_murmur2(run_id.encode("utf-8"), num_partitions))

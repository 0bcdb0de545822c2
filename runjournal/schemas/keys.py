"""The topic contract's two formats, owned here and nowhere else: an event's record key and a run's partition.

**Record key** ``{run_id}:{epoch}:{seq}`` (docs/design/protocol.md § Topic layout): unique per event, so the
compacted events topic keeps every event and removes only tombstoned (erased) ones. ``epoch`` and ``seq`` are
decimal integers, so the key parses from the right: a run id may itself contain ``:``. :func:`event_key` builds
it, :func:`parse_event_key` and :func:`run_id_of_key` read it (every reader uses these: the projector, the
recovery job's tail, replay, erase).

**Partition** ``toPositive(murmur2(run_id as UTF-8)) % partitions`` — the partition is chosen from ``run_id``
alone (Kafka's murmur2, as the Java default partitioner would for key=run_id), so one run is one ordered stream.
The record key differs per event, so the client's own partitioner would scatter a run; the journal therefore
computes the partition here and passes it explicitly to ``produce()``. :func:`partition_for` is
``confluent_kafka.murmur2`` (librdkafka's C murmur2, Java-compatible: it equals
``Utils.toPositive(Utils.murmur2(runId.getBytes(UTF_8))) % numPartitions``, the Java
``BuiltInPartitioner.partitionForKey`` result). The tests hold it against an independent pure-Python murmur2
(Kafka's UtilsTest vectors; 100k random keys, several partition counts).
"""

from __future__ import annotations

from typing import NamedTuple

from confluent_kafka import murmur2 as _murmur2

__all__ = ["EventKey", "KeyFormatError", "event_key", "parse_event_key", "partition_for", "run_id_of_key"]


class KeyFormatError(ValueError):
    """A record key is not ``{run_id}:{epoch}:{seq}`` (an empty run id, or an epoch or seq that is not a
    decimal integer)."""


class EventKey(NamedTuple):
    """A parsed record key."""

    run_id: str
    """The run (may contain ``:``)."""
    epoch: int
    """The ownership epoch that wrote the event."""
    seq: int
    """The event's seq in its run."""


def event_key(run_id: str, epoch: int, seq: int) -> str:
    """``{run_id}:{epoch}:{seq}``: the record key of the event ``seq`` of ``run_id`` written under ``epoch``."""
    return f"{run_id}:{epoch}:{seq}"


def parse_event_key(key: str | bytes) -> EventKey:
    """The parts of a record key (UTF-8 bytes or text).

    Raises:
        KeyFormatError: not of the form ``{run_id}:{epoch}:{seq}`` (or not UTF-8).
    """
    try:
        text = key.decode("utf-8") if isinstance(key, bytes) else key
        run_id, epoch, seq = text.rsplit(":", 2)
        parsed = EventKey(run_id, int(epoch), int(seq))
    except (ValueError, UnicodeDecodeError) as exc:
        raise KeyFormatError(f"not an event key {{run_id}}:{{epoch}}:{{seq}}: {key!r}") from exc
    if not run_id:
        raise KeyFormatError(f"not an event key {{run_id}}:{{epoch}}:{{seq}} (empty run id): {key!r}")
    return parsed


def run_id_of_key(key: bytes | None) -> bytes:
    """The run id's UTF-8 bytes of a record key, without decoding or checking the rest (the projector's and the
    recovery tail's per-record filter; a malformed key gives bytes no run has, and its record is decoded and
    quarantined as any other). ``b""`` for no key."""
    return (key or b"").rsplit(b":", 2)[0]


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

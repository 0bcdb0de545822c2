"""Step 3 of the projector (decode a partition batch), in the shape the fold loop reads.

The projector's own loop over :meth:`~runjournal.schemas.codec.EventCodec.decode`: the same decode of every record
(same events, same errors), with the run id parsed from the record key only where the value gives none (a tombstone,
an undecodable record) instead of for every record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from confluent_kafka import Message

from runjournal.consumers.failures import TRANSIENT, classify
from runjournal.schemas import EventCodec
from runjournal.schemas.errors import SchemaError
from runjournal.schemas.events import Event

__all__ = ["Decoded", "decode_batch", "run_id_from_key"]

Decoded = tuple[str | None, Event | SchemaError | None]
"""``(run_id, item)`` of one record: item is the :class:`Event`, None for a tombstone (the run is being erased), or
the :class:`SchemaError` that makes it undecodable; run_id is None when not even the key names a run."""


def decode_batch(codec: EventCodec, topic: str, partition: int, msgs: Sequence[Message]) -> list[Decoded]:
    """Decode ``msgs`` (records of ``topic[partition]``, in offset order), one :data:`Decoded` per record.

    Raises:
        RegistryError: the schema registry (or schemas topic) cannot be reached — a transient failure, not a bad
            record: nothing of the batch may be quarantined or written before it is waited out (step 8).
    """
    decode = codec.decode
    out: list[Decoded] = []
    for m in msgs:
        value = m.value()
        if value is None:
            out.append((run_id_from_key(m.key()), None))
            continue
        try:
            event = decode(value, topic=topic, partition=partition, offset=m.offset())
        except SchemaError as exc:
            if classify(exc).kind == TRANSIENT:
                raise
            out.append((run_id_from_key(m.key()), exc))
            continue
        out.append((event.run_id, event))
    return out


def run_id_from_key(key: Any) -> str | None:
    """``run_id`` from a key ``{run_id}:{epoch}:{seq}`` (bytes); None when the key is not of that form."""
    if not key:
        return None
    try:
        run_id, epoch, seq = key.decode("utf-8").rsplit(":", 2)
        int(epoch), int(seq)
    except ValueError:
        return None
    return run_id or None

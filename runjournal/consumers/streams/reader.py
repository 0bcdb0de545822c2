"""Read a run's durable stream (``{prefix}.streams``, decision 0055) from an offset, with epoch fencing.

The run's records are on its partition (``partition_for`` over the topic's count), keyed by run id; a reader
``assign()``s that partition at an explicit offset (group-less, commits nothing) and keeps the run's records.

Fencing: the reader keeps the newest epoch it has seen in a ``gap`` or any record of the run; a ``chunk`` or
``end`` of an older epoch after it is a zombie's late write and is dropped. Resuming at offset ``X`` (the offset
after the last delivered record, e.g. SSE ``Last-Event-ID`` + 1) reads the record at ``X - 1`` first, only to
restore that epoch: the last delivered record carries the newest epoch the reader had seen (a delivered record is
never older than the fence, and each raises it), so resuming costs one record, not a rescan.

A ``gap`` names the segments a dead epoch left open; the reader adds, per segment, the offset and number of the
last chunk it delivered of it (``last_offset``, ``last_n``; None when it never read one — a reader that resumed
after them).

Sealed records (``RUNJOURNAL_ENCRYPTION=on``, decision 0059) are opened with the reader's keys (``content``): the
event's ``data`` is the plain chunk. A reader that cannot open one (no key directory, an erased subject's destroyed
key, a chunk moved to another run, segment or position) delivers it in its place with ``data`` = ``"encrypted"`` (an
end: ``{"error": "encrypted"}``) and ``encrypted`` naming the error (``KeyDestroyedError``, ``UnknownKeyError``,
``CiphertextBindingError`` …): the stream goes on, the token is never handed out as text.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from runjournal.core import kafka
from runjournal.core.crypto.errors import EncryptedContentError, KeyUnavailableError
from runjournal.core.settings import Settings
from runjournal.producers.encryption import ENCRYPTED, ContentCrypto
from runjournal.producers.streams import decode_record, stream_address
from runjournal.schemas.keys import partition_for

__all__ = ["StreamEvent", "StreamReader", "read_stream"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamEvent:
    """One delivered record of a run's stream."""

    offset: int
    """Its Kafka offset on the run's partition of ``{prefix}.streams`` (resume from ``offset + 1``)."""
    kind: str
    """``chunk``, ``end`` or ``gap``."""
    epoch: int
    """The writer's epoch (for a gap: the new owner's)."""
    segment: str | None
    """The ``run.stream()`` opening (None for a gap)."""
    n: int
    """Chunk number within the segment (for ``end``: chunks written; 0 for a gap)."""
    data: Any
    """The chunk; for ``end`` None or ``{"error": …}``; for a gap ``{"dead_epoch", "segments": [{"segment",
    "epoch", "last_offset", "last_n"}]}``."""
    at_ms: int
    """Writer's wall clock at the write, ms since the epoch."""
    encrypted: str | None = None
    """Set when the record is sealed and this reader could not open it (decision 0059): the named error's class
    (``KeyDestroyedError``, ``UnknownKeyError``, ``CiphertextBindingError``, ``EncryptedContentError`` for a reader
    without keys …); ``data`` is then ``"encrypted"`` (an end's: ``{"error": "encrypted"}``)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form (SSE data, ``--json``); ``encrypted`` only when set."""
        out = {"offset": self.offset, "kind": self.kind, "epoch": self.epoch, "segment": self.segment, "n": self.n,
               "data": self.data, "at_ms": self.at_ms}
        if self.encrypted is not None:
            out["encrypted"] = self.encrypted
        return out


_OWN_KEYS: Any = object()
"""``StreamReader(content=…)``'s default: open sealed records with the settings' key service."""


class StreamReader:
    """A run's stream from an offset: :meth:`poll` returns the next delivered records, fenced.

    Args:
        settings: Kafka client settings and topic prefix.
        run_id: the run.
        from_offset: the first offset to read (``None`` or 0: the partition's beginning).
        timeout_s: metadata timeout, seconds.
        content: opens sealed records (default: ``ContentCrypto(settings, encrypt=False)``, the settings' key
            directory); None: a reader that holds no key (the console) — every sealed record shows ``encrypted``.

    Raises:
        TopicNotFoundError-like ``LookupError``: no ``{prefix}.streams`` topic (run ``runjournal topics create``).
    """

    def __init__(self, settings: Settings, run_id: str, from_offset: int | None = None, *,
                 timeout_s: float = 10.0, content: ContentCrypto | None = _OWN_KEYS) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        self.run_id = run_id
        self.content: ContentCrypto | None = ContentCrypto(settings, encrypt=False) if content is _OWN_KEYS \
            else content
        self.topic = settings.streams_topic
        self._key = run_id.encode("utf-8")
        self._consumer = kafka.consumer(settings, **{"group.id": f"{settings.topic_prefix}.stream-{uuid.uuid4()}",
                                                     "enable.auto.commit": False, "enable.partition.eof": False})
        meta = self._consumer.list_topics(self.topic, timeout=timeout_s)
        parts = meta.topics.get(self.topic)
        if parts is None or parts.error is not None or not parts.partitions:
            self._consumer.close()
            raise LookupError(f"topic {self.topic} does not exist (run `runjournal topics create`)")
        self.partition = partition_for(run_id, len(parts.partitions))
        start = from_offset or 0
        self._lookback = start - 1 if start > 0 else None
        """The offset read only to restore the fence (the last delivered record before a resume)."""
        self._consumer.assign([TopicPartition(self.topic, self.partition,
                                              self._lookback if self._lookback is not None else
                                              (start if from_offset else OFFSET_BEGINNING))])
        self.fence = 0
        """The newest epoch seen: chunks and ends of older epochs are dropped."""
        self.dropped = 0
        """Records of the run dropped by the fence (a zombie's late writes)."""
        self._last: dict[str, tuple[int, int]] = {}
        self.position = start
        """The next offset to read."""

    def high_watermark(self, timeout_s: float = 10.0) -> int:
        """The partition's end offset now (and :attr:`position` moved past what retention already deleted)."""
        from confluent_kafka import TopicPartition

        low, high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, self.partition), timeout=timeout_s)
        self.position = max(self.position, int(low))
        return int(high)

    def poll(self, timeout_s: float = 0.5, max_records: int = 500) -> list[StreamEvent]:
        """The run's next records (possibly none), fenced, within ``timeout_s`` seconds."""
        out: list[StreamEvent] = []
        for msg in self._consumer.consume(max_records, timeout=timeout_s):
            if msg.error() is not None:
                log.warning("stream read %s[%s]: %s", self.topic, self.partition, msg.error())
                continue
            self.position = msg.offset() + 1
            if msg.key() != self._key:
                continue
            record = decode_record(msg.value())
            if record is None or record["run_id"] != self.run_id:
                log.warning("skipping a record that is not a stream record: %s[%s]@%s", self.topic,
                            msg.partition(), msg.offset())
                continue
            if self._lookback is not None and msg.offset() <= self._lookback:
                self.fence = max(self.fence, record["epoch"])  # the last delivered record: the fence it left
                continue
            event = self._fenced(msg.offset(), record)
            if event is not None:
                out.append(event)
        return out

    def _fenced(self, offset: int, record: Any) -> StreamEvent | None:
        epoch, kind = int(record["epoch"]), record["kind"]
        if kind != "gap" and epoch < self.fence:
            self.dropped += 1
            return None
        self.fence = max(self.fence, epoch)
        data = record.get("data")
        if kind == "gap" and isinstance(data, dict):
            data = {**data, "segments": [{**s, "last_offset": self._last.get(s.get("segment"), (None, None))[0],
                                          "last_n": self._last.get(s.get("segment"), (None, None))[1]}
                                         for s in data.get("segments", []) if isinstance(s, dict)]}
        elif kind == "chunk" and record.get("segment") is not None:
            self._last[record["segment"]] = (offset, int(record.get("n", 0)))
        encrypted = None
        if record.get("sealed") is not None and kind in ("chunk", "end"):
            data, encrypted = self._opened(record, data)
        return StreamEvent(offset=offset, kind=kind, epoch=epoch, segment=record.get("segment"),
                           n=int(record.get("n", 0)), data=data, at_ms=int(record.get("at_ms", 0)),
                           encrypted=encrypted)

    def _opened(self, record: Any, data: Any) -> tuple[Any, str | None]:
        """A sealed chunk's or end's data opened, and None; or its stand-in and the named error (decision 0059)."""
        end = record["kind"] == "end"
        token = data.get("error") if end and isinstance(data, dict) else data
        shown: Any = {"error": ENCRYPTED} if end else ENCRYPTED
        if not isinstance(token, str):
            return shown, "TokenFormatError"
        if self.content is None:
            return shown, EncryptedContentError.__name__
        address = stream_address(str(record.get("segment")), None if end else int(record.get("n", 0)))
        try:
            text = self.content.open(token, self.run_id, address, "error" if end else "data")
        except (EncryptedContentError, KeyUnavailableError) as exc:  # named, and the stream goes on
            return shown, type(exc).__name__
        if end:
            return {"error": text}, None
        if record.get("sealed") == "json" and text is not None:
            try:
                return orjson.loads(text), None
            except orjson.JSONDecodeError:
                return shown, "TokenFormatError"
        return text, None

    def close(self) -> None:
        """Close the consumer (idempotent)."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def __enter__(self) -> StreamReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_stream(settings: Settings, run_id: str, from_offset: int | None = None, *, follow: bool = False,
                idle_timeout_s: float = 10.0) -> Iterator[tuple[int, StreamEvent]]:
    """The run's stream records from ``from_offset``, fenced: ``(offset, record)`` pairs in order.

    Args:
        settings: Kafka client settings and topic prefix.
        run_id: the run.
        from_offset: first offset to read (None: the beginning; resume with the last offset seen + 1).
        follow: keep reading new records until ``idle_timeout_s`` passes without one; else stop at the partition's
            end as of the start.
        idle_timeout_s: with ``follow``, seconds without a record before stopping; without, the longest wait for
            the records up to the end, seconds.

    Raises:
        LookupError: no streams topic.
    """
    with StreamReader(settings, run_id, from_offset) as reader:
        end = reader.high_watermark()
        deadline = time.monotonic() + idle_timeout_s
        while True:
            if not follow and reader.position >= end:
                return
            batch = reader.poll(0.2)
            for event in batch:
                yield event.offset, event
            if batch and follow:
                deadline = time.monotonic() + idle_timeout_s
            if time.monotonic() > deadline:
                return

"""Durable streams of partial output: ``run.stream()`` appends chunks to ``{prefix}.streams`` (decision 0055).

A chat UI streams model tokens and tool progress; the tokens must survive the agent's crash but never enter the
journal or recovery. So a stream is its own topic, ``{prefix}.streams`` (``cleanup.policy=delete``, its own
retention), written by a plain idempotent producer (not the journal's transactions: a token costs one ``produce``
and never waits for a commit), keyed by run id and placed on the run's partition (``partition_for``, the same
count as the events topic). Nothing here publishes an event; recovery and the projector never read the topic.

Records (JSON, :class:`StreamRecord`): one ``chunk`` per ``Stream.write``, an ``end`` when the ``with`` block
exits, and a ``gap`` that the run's next owner appends when it resumes: it names the segments (``run.stream()``
openings) a dead epoch opened and never ended. Open segments are found in O(1): the run's Redis hash
``rj:{P:r:<run_id>}:streams`` (segment → epoch) is written at open and cleared at end (``RedisKeys.streams``).

A reader (``runjournal.consumers.streams``) resumes by Kafka offset and fences: once a gap or a record of epoch E
was read, chunks of an older epoch (a zombie's late tokens) are dropped.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypedDict

import orjson

from runjournal.core import kafka
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.producers.errors import JournalError

__all__ = ["STREAM_KINDS", "Stream", "StreamChunkTooLargeError", "StreamDataError", "StreamError", "StreamRecord",
           "StreamWriter", "decode_record", "encode_record"]

log = logging.getLogger(__name__)

STREAM_KINDS = ("chunk", "end", "gap")
"""The record kinds of ``{prefix}.streams``."""

_QUEUE_RETRIES = 50
"""How many times a write retries a full local producer queue (0.1 s each) before raising ``StreamError``."""


class StreamError(JournalError):
    """A stream write was refused (not a journal failure: the run goes on)."""


class StreamDataError(StreamError, TypeError):
    """A chunk is neither a ``str`` nor a JSON value (dict, list, number, bool, None)."""


class StreamChunkTooLargeError(StreamError, ValueError):
    """A chunk's JSON is larger than ``settings.stream_chunk_bytes`` (``RUNJOURNAL_STREAM_CHUNK_BYTES``)."""


class StreamRecord(TypedDict):
    """One record of ``{prefix}.streams`` (its value, JSON; the key is the run id)."""

    run_id: str
    """The run whose stream this is."""
    epoch: int
    """The writer's epoch (1 for a new run, the plan's epoch after a recovery)."""
    segment: str | None
    """The ``run.stream()`` opening it belongs to (``<name>#<epoch>.<k>``); None for a gap."""
    n: int
    """Chunk counter within the segment (1, 2, …); for ``end`` the number of chunks written; 0 for a gap."""
    kind: str
    """``chunk``, ``end`` or ``gap``."""
    data: Any
    """The chunk (a str or JSON value); for ``end`` None or ``{"error": text}``; for a gap
    ``{"dead_epoch": E, "segments": [{"segment": s, "epoch": e}, …]}``."""
    at_ms: int
    """Writer's wall clock at the write, ms since the epoch (producer → reader delay)."""


def encode_record(record: StreamRecord) -> bytes:
    """The record's value bytes (orjson)."""
    return orjson.dumps(record)


def decode_record(value: bytes | None) -> StreamRecord | None:
    """The record in ``value``, or None when it is not a stream record (malformed, unknown kind)."""
    if not value:
        return None
    try:
        raw = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(raw, dict) or raw.get("kind") not in STREAM_KINDS or not isinstance(raw.get("epoch"), int) \
            or not isinstance(raw.get("run_id"), str):
        return None
    return raw  # type: ignore[return-value]


def _chunk_bytes(data: Any, limit: int) -> None:
    """Raise ``StreamDataError`` / ``StreamChunkTooLargeError`` for a chunk the stream must not carry."""
    if not isinstance(data, str | dict | list | int | float | bool) and data is not None:
        raise StreamDataError(f"a stream chunk is a str or a JSON value, not {type(data).__name__}")
    try:
        size = len(data.encode("utf-8")) if isinstance(data, str) else len(orjson.dumps(data))
    except (TypeError, UnicodeEncodeError) as exc:
        raise StreamDataError(f"a stream chunk is not JSON: {exc}") from exc
    if size > limit:
        raise StreamChunkTooLargeError(f"a stream chunk of {size} bytes is over stream_chunk_bytes={limit} "
                                       "(RUNJOURNAL_STREAM_CHUNK_BYTES): cut it into smaller writes")


class StreamWriter:
    """One Journal's writer of ``{prefix}.streams``: a lazily created idempotent producer and the open-segment
    hashes. Get it as ``journal.streams``; use it through ``run.stream()``.

    Args:
        settings: topic prefix, ``stream_chunk_bytes``, Kafka client settings.
        redis_client: the journal's Redis client (open-segment hashes).
        prefix: Redis key prefix.
        partition_of: run id → its partition (the journal's ``partition_for`` over the events topic's count).
    """

    def __init__(self, settings: Settings, redis_client: Any, prefix: str, partition_of: Callable[[str], int]) -> None:
        self.settings = settings
        self.topic = settings.streams_topic
        self._redis = redis_client
        self._keys = RedisKeys(prefix)
        self._partition_of = partition_of
        self._producer: Any = None
        self._lock = threading.Lock()
        self._openings: dict[tuple[str, int], itertools.count[int]] = {}
        self._gap_checked: set[tuple[str, int]] = set()
        self.lost = 0
        """Records the broker never acknowledged (logged): a reader sees them missing, never duplicated."""

    def _client(self) -> Any:
        with self._lock:
            if self._producer is None:
                self._producer = kafka.producer(self.settings, client_id=f"{self.settings.topic_prefix}.streams", **{
                    "enable.idempotence": "true", "acks": "all", "linger.ms": "5", "compression.type": "lz4"})
            return self._producer

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.lost += 1
            log.warning("stream record lost (%s): %s", self.topic, err)

    def append(self, run_id: str, epoch: int, segment: str | None, n: int, kind: str, data: Any) -> None:
        """Produce one record on the run's partition (asynchronous: ``flush`` waits for acknowledgements).

        Raises:
            StreamError: the local producer queue stayed full for ``_QUEUE_RETRIES`` × 0.1 s.
        """
        record: StreamRecord = {"run_id": run_id, "epoch": epoch, "segment": segment, "n": n, "kind": kind,
                                "data": data, "at_ms": int(time.time() * 1000)}
        value, producer = encode_record(record), self._client()
        for _ in range(_QUEUE_RETRIES):
            try:
                producer.produce(self.topic, value=value, key=run_id.encode("utf-8"),
                                 partition=self._partition_of(run_id), on_delivery=self._delivered)
                producer.poll(0)
                return
            except BufferError:
                producer.poll(0.1)
        raise StreamError(f"the stream producer's queue stayed full; run {run_id}'s chunk was not written")

    def open(self, run_id: str, epoch: int, name: str) -> Stream:
        """A new segment of the run's stream (``run.stream()`` calls this), noted open in Redis.

        First marks the gap a dead earlier epoch left (:meth:`mark_gap`), once per (run, epoch) and writer.
        """
        self.mark_gap(run_id, epoch)
        with self._lock:
            k = next(self._openings.setdefault((run_id, epoch), itertools.count(1)))
        segment = f"{name}#{epoch}.{k}"
        self._redis.hset(self._keys.streams(run_id), segment, str(epoch))
        return Stream(self, run_id, epoch, segment)

    def closed(self, run_id: str, segment: str) -> None:
        """Forget an ended segment (its ``end`` record is written)."""
        self._redis.hdel(self._keys.streams(run_id), segment)

    def mark_gap(self, run_id: str, epoch: int, *, timeout_s: float = 5.0) -> bool:
        """Append a ``gap`` record naming the segments older epochs opened and never ended; forget them.

        Called by ``Journal.resume`` and by the first ``run.stream()`` of a handle; idempotent per (run, epoch).

        Args:
            run_id: the run.
            epoch: the new owner's epoch; segments of older epochs are the dead owners'.
            timeout_s: how long to wait for the gap's acknowledgement, seconds.

        Returns:
            True when a gap record was written.
        """
        if (run_id, epoch) in self._gap_checked:
            return False
        key = self._keys.streams(run_id)
        raw = self._redis.hgetall(key) or {}
        dead = sorted(((s.decode() if isinstance(s, bytes) else s), int(e)) for s, e in raw.items()
                      if int(e) < epoch)
        if dead:
            data = {"dead_epoch": max(e for _s, e in dead),
                    "segments": [{"segment": s, "epoch": e} for s, e in dead]}
            self.append(run_id, epoch, None, 0, "gap", data)
            self.flush(timeout_s)
            self._redis.hdel(key, *[s for s, _e in dead])
        self._gap_checked.add((run_id, epoch))
        return bool(dead)

    def flush(self, timeout_s: float = 10.0) -> int:
        """Wait up to ``timeout_s`` seconds for every produced record's acknowledgement; return how many remain."""
        return int(self._producer.flush(timeout_s)) if self._producer is not None else 0

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush and drop the producer (idempotent)."""
        if self._producer is not None:
            left = self.flush(timeout_s)
            if left:
                log.warning("%d stream record(s) unacknowledged at close (%s)", left, self.topic)
            self._producer = None


class Stream:
    """One open segment of a run's stream: ``with run.stream() as s: s.write("tok")``.

    A clean exit writes an ``end`` record; an exception writes ``end`` with ``{"error": text}`` and propagates.
    A process that dies leaves the segment open: its next owner's gap record names it.
    """

    def __init__(self, writer: StreamWriter, run_id: str, epoch: int, segment: str) -> None:
        self.writer = writer
        self.run_id = run_id
        self.epoch = epoch
        self.segment = segment
        self.n = 0
        """Chunks written so far."""
        self.ended = False

    def write(self, data: Any) -> int:
        """Append one chunk; returns its number within the segment (1, 2, …). Does not wait for the broker.

        Args:
            data: a str (a token) or a JSON value (tool progress).

        Raises:
            StreamDataError: not a str or JSON value. StreamChunkTooLargeError: over ``stream_chunk_bytes``.
            StreamError: the segment has ended, or the producer's queue stayed full.
        """
        if self.ended:
            raise StreamError(f"stream segment {self.segment} of run {self.run_id} has ended")
        _chunk_bytes(data, self.writer.settings.stream_chunk_bytes)
        self.n += 1
        self.writer.append(self.run_id, self.epoch, self.segment, self.n, "chunk", data)
        return self.n

    def end(self, error: str | None = None) -> None:
        """Write the ``end`` record and forget the segment (idempotent)."""
        if self.ended:
            return
        self.ended = True
        self.writer.append(self.run_id, self.epoch, self.segment, self.n, "end",
                           None if error is None else {"error": error})
        self.writer.closed(self.run_id, self.segment)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.end(None if exc is None else f"{type(exc).__name__}: {exc}")


class AsyncStream:
    """:class:`Stream` for an ``AsyncRunHandle``: ``async with run.stream() as s: await s.write("tok")``.

    ``write`` produces without waiting (as the sync one); opening and ending touch Redis in the journal's threads.
    """

    def __init__(self, opener: Callable[[], Stream], run_sync: Callable[..., Any]) -> None:
        self._opener = opener
        self._run_sync = run_sync
        self.stream: Stream | None = None

    async def write(self, data: Any) -> int:
        """As :meth:`Stream.write` (raises the same errors)."""
        if self.stream is None:
            raise StreamError("use the stream inside `async with run.stream() as s`")
        return self.stream.write(data)

    async def __aenter__(self) -> AsyncStream:
        self.stream = await self._run_sync(self._opener)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self.stream is not None:
            stream = self.stream
            await self._run_sync(lambda: stream.__exit__(exc_type, exc, tb))

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

With ``RUNJOURNAL_ENCRYPTION=on`` (decision 0059) a chunk's ``data`` (and an ``end`` record's error text) is sealed
under the run's key scope (``Journal.scope_of``: the run's user, else its tenant), bound to ``(run id,
stream:<segment>:<n>, data)`` (an end's error: ``(run id, stream:<segment>:end, error)``), and the record says so in
``sealed`` (``str``: the token holds the text; ``json``: it holds the JSON value's text). A gap's structure
(segments, epochs) stays in clear. A chunk moved to another run, segment or position does not decrypt.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

import orjson

from runjournal.core import kafka
from runjournal.core.errors import RunjournalError
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.producers.errors import JournalError

if TYPE_CHECKING:
    from runjournal.core.crypto.keys import KeyScope
    from runjournal.producers.encryption import ContentCrypto

__all__ = ["STREAM_KINDS", "Stream", "StreamChunkTooLargeError", "StreamDataError", "StreamError", "StreamRecord",
           "StreamWriter", "UnsealableStreamError", "decode_record", "encode_record", "stream_address"]

log = logging.getLogger(__name__)

STREAM_KINDS = ("chunk", "end", "gap")
"""The record kinds of ``{prefix}.streams``."""

ENCRYPTED_ERROR_LOST = "(the error text could not be sealed)"
"""An ``end``'s error when encryption is on and the text could not be sealed (its key gone): never the text."""

_QUEUE_RETRIES = 50
"""How many times a write retries a full local producer queue (0.1 s each) before raising ``StreamError``."""


class StreamError(JournalError):
    """A stream write was refused (not a journal failure: the run goes on)."""


class StreamDataError(StreamError, TypeError):
    """A chunk is neither a ``str`` nor a JSON value (dict, list, number, bool, None)."""


class StreamChunkTooLargeError(StreamError, ValueError):
    """A chunk's JSON is larger than ``settings.stream_chunk_bytes`` (``RUNJOURNAL_STREAM_CHUNK_BYTES``)."""


class UnsealableStreamError(StreamError):
    """Encryption is on and the journal knows no key scope for the run (it neither started nor resumed it): the
    stream cannot be sealed, and it is never written in clear instead (decision 0059)."""


def stream_address(segment: str, n: int | None) -> str:
    """The binding address of a segment's chunk ``n`` (``stream:<segment>:<n>``), or of its end (``n`` None:
    ``stream:<segment>:end``) — decision 0059."""
    return f"stream:{segment}:{'end' if n is None else n}"


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
    sealed: NotRequired[str]
    """Present when ``data`` (a chunk) or ``data["error"]`` (an end) is a token (decision 0059): ``str`` (it holds
    the text) or ``json`` (it holds the JSON value's text). Absent: in clear, as written."""


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
        content: the journal's content sealer (``Journal.content``); when it encrypts, chunks are sealed.
        scope_of: run id → its key scope (``Journal.scope_of``), or None when unknown.
        compression: the producer's ``compression.type`` (the journal's; default ``lz4``).
    """

    def __init__(self, settings: Settings, redis_client: Any, prefix: str, partition_of: Callable[[str], int], *,
                 content: ContentCrypto | None = None,
                 scope_of: Callable[[str], KeyScope | None] | None = None, compression: str = "lz4") -> None:
        self.settings = settings
        self.content = content
        self._scope_of = scope_of
        self._compression = compression
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
                    "enable.idempotence": "true", "acks": "all", "linger.ms": "5",
                    "compression.type": self._compression})
            return self._producer

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.lost += 1
            log.warning("stream record lost (%s): %s", self.topic, err)

    def append(self, run_id: str, epoch: int, segment: str | None, n: int, kind: str, data: Any,
               sealed: str | None = None) -> None:
        """Produce one record on the run's partition (asynchronous: ``flush`` waits for acknowledgements).

        Args:
            sealed: ``str`` / ``json`` when ``data`` is already a token (:meth:`seal`); None in clear.

        Raises:
            StreamError: the local producer queue stayed full for ``_QUEUE_RETRIES`` × 0.1 s.
        """
        record: StreamRecord = {"run_id": run_id, "epoch": epoch, "segment": segment, "n": n, "kind": kind,
                                "data": data, "at_ms": int(time.time() * 1000)}
        if sealed is not None:
            record["sealed"] = sealed
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

    def scope(self, run_id: str) -> KeyScope | None:
        """The key scope a new segment of ``run_id`` is sealed under; None when the journal does not encrypt.

        Raises:
            UnsealableStreamError: encryption is on and the journal knows no scope for the run.
        """
        if self.content is None or not self.content.encrypting:
            return None
        scope = self._scope_of(run_id) if self._scope_of is not None else None
        if scope is None:
            raise UnsealableStreamError(f"encryption is on and this journal writes no run {run_id!r}: its stream "
                                        "cannot be sealed (start or resume the run first)")
        return scope

    def seal(self, scope: KeyScope, run_id: str, address: str, field: str, text: str) -> str:
        """``text`` as a token under ``scope``, bound to ``(run_id, address, field)`` (decision 0059).

        Raises:
            KeyDestroyedError: the scope's key was destroyed (an erased subject). KeyUnavailableError: transient.
        """
        assert self.content is not None
        return self.content.seal_text(text, tenant_id=scope.tenant_id, subject=scope.subject, run_id=run_id,
                                      address=address, field=field)

    def open(self, run_id: str, epoch: int, name: str) -> Stream:
        """A new segment of the run's stream (``run.stream()`` calls this), noted open in Redis.

        First marks the gap a dead earlier epoch left (:meth:`mark_gap`), once per (run, epoch) and writer.

        Raises:
            UnsealableStreamError: encryption is on and the journal knows no key scope for the run.
        """
        scope = self.scope(run_id)
        self.mark_gap(run_id, epoch)
        with self._lock:
            k = next(self._openings.setdefault((run_id, epoch), itertools.count(1)))
        segment = f"{name}#{epoch}.{k}"
        self._redis.hset(self._keys.streams(run_id), segment, str(epoch))
        return Stream(self, run_id, epoch, segment, scope)

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

    def __init__(self, writer: StreamWriter, run_id: str, epoch: int, segment: str,
                 scope: KeyScope | None = None) -> None:
        self.writer = writer
        self.run_id = run_id
        self.epoch = epoch
        self.segment = segment
        self.scope = scope
        """The key scope its chunks are sealed under (None: written in clear)."""
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
            KeyDestroyedError: encrypting, and the run's key was destroyed (an erased subject); nothing is written.
        """
        if self.ended:
            raise StreamError(f"stream segment {self.segment} of run {self.run_id} has ended")
        _chunk_bytes(data, self.writer.settings.stream_chunk_bytes)
        n = self.n + 1
        sealed: str | None = None
        if self.scope is not None:
            sealed = "str" if isinstance(data, str) else "json"
            data = self.writer.seal(self.scope, self.run_id, stream_address(self.segment, n), "data",
                                    data if isinstance(data, str) else orjson.dumps(data).decode("utf-8"))
        self.n = n
        self.writer.append(self.run_id, self.epoch, self.segment, n, "chunk", data, sealed)
        return n

    def end(self, error: str | None = None) -> None:
        """Write the ``end`` record and forget the segment (idempotent)."""
        if self.ended:
            return
        self.ended = True
        sealed: str | None = None
        if error is not None and self.scope is not None:
            try:
                error = self.writer.seal(self.scope, self.run_id, stream_address(self.segment, None), "error", error)
                sealed = "str"
            except RunjournalError as exc:  # the end is still written (the segment closes), its text never clear
                log.warning("run %s: stream %s's error text could not be sealed (%s); written without it",
                            self.run_id, self.segment, type(exc).__name__)
                error = ENCRYPTED_ERROR_LOST
        self.writer.append(self.run_id, self.epoch, self.segment, self.n, "end",
                           None if error is None else {"error": error}, sealed)
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

"""Large tool results: durable as the journal on ``{prefix}.payloads``, cached in Redis, referenced from the journal.

A TOOL_CALL_COMMITTED (or TOOL_CALL_RECONCILED) event carries the result inline (``result_json``) when its canonical
JSON is at most ``Journal(inline_result_bytes=8192)`` bytes. A larger result, up to ``Settings.max_result_bytes``
(256 MiB by default), is written to the compacted topic ``{prefix}.payloads`` (``Settings.payloads_topic``) by the
agent's transactional producer, cut into records of ``Settings.payload_chunk_bytes`` (512 KiB by default), on the
run's partition (``partition_for(run_id, partitions)``), each keyed :func:`payload_key`
``<run_id><SEP>result<SEP><payload id><SEP><index>`` (``SEP`` is U+001F, which no run id holds; the payload id is a
fresh uuid4 per written result, so no two written payloads share a key and compaction never replaces a referenced
record). The event then carries ``result_digest`` (sha256 of the canonical text) and

    ``result_ref = "kafka:<partition>:<first offset>:<last offset>:<chunks>:<payload id>:<sha256 hex>"``

with the offsets of the records' delivery reports: a reader (:meth:`ResultStore.get`) reads that partition from the
first to the last offset (``read_committed``: records of an aborted transaction are never read), O(result size),
takes the records whose key names this payload, in index order, reassembles them and checks the digest —
``ResultCorruptError`` on a mismatch, ``ResultUnavailableError`` when a record is missing (erased).

**When the records are written.** In their own transaction, committed *before* the event that references them is
produced (``Journal.publish_payload``): a transaction that fails is aborted and re-run by the transaction keeper
(``runjournal.producers._txn``) with the same record bytes, so an event produced into the same transaction could
not carry offsets known only once that transaction commits (decision 0052). A crash between the records' commit and
the event's leaves records nothing references (harmless: never read; ``runjournal erase`` removes them with the run);
a crash before their commit leaves an aborted transaction, never read.

**Redis is a cache.** After a read from Kafka the text is put under ``rj:P:result:<sha256 hex>`` (no TTL; a failure
to cache — e.g. the operator's read-only Redis role during a replay — is only logged); a read tries Redis first and
checks a cached text against the digest. A write does not cache (resumes and replays are rare, writes are not).
References of the older form ``sha256:<hex>`` (written before the payloads topic, Redis only) are still read from
Redis: a Redis wipe loses those.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runjournal.core.redis_keys import RedisKeys
from runjournal.producers._digest import digest
from runjournal.producers.errors import ResultCorruptError, ResultUnavailableError
from runjournal.stores.errors import ObjectStoreError

if TYPE_CHECKING:
    from runjournal.core.settings import Settings

__all__ = ["KAFKA_REF_PREFIX", "PayloadRef", "ResultStore", "of_run", "payload_key", "split_chunks",
           "unavailable_reason"]

log = logging.getLogger("runjournal.producers.results")

_REF_PREFIX = "sha256:"
KAFKA_REF_PREFIX = "kafka:"
"""Prefix of a reference to records on ``{prefix}.payloads``."""
SEP = "\x1f"
_KIND = "result"
_REF_RE = re.compile(r"kafka:(\d+):(\d+):(\d+):(\d+):([0-9a-f]{32}):([0-9a-f]{64})")


def payload_key(run_id: str, payload_id: str, index: int) -> str:
    """``<run_id><SEP>result<SEP><payload id><SEP><index>``: the key of chunk ``index`` of a written result (the run
    id first, so erase finds a run's records; ``SEP`` = U+001F, refused in run ids by ``runjournal.core.ids``)."""
    return f"{run_id}{SEP}{_KIND}{SEP}{payload_id}{SEP}{index}"


def of_run(key: bytes | None, run_id: str) -> bool:
    """True when ``key`` is a payload record key of ``run_id`` (exactly :func:`payload_key`'s form)."""
    if key is None:
        return False
    head = f"{run_id}{SEP}{_KIND}{SEP}".encode()
    if not key.startswith(head):
        return False
    pid, sep, index = key[len(head):].partition(SEP.encode())
    return bool(sep) and len(pid) == 32 and index.isdigit()


def digest_bytes(data: bytes) -> str:
    """sha256 hex of ``data`` (the UTF-8 text: the same as ``runjournal.producers._digest.digest`` of the text)."""
    return hashlib.sha256(data).hexdigest()


def split_chunks(data: bytes, chunk_bytes: int) -> list[bytes]:
    """``data`` cut into pieces of at most ``chunk_bytes`` (at least one piece)."""
    return [data[i:i + chunk_bytes] for i in range(0, len(data), chunk_bytes)] or [b""]


@dataclass(frozen=True)
class PayloadRef:
    """Where a large result's records are: ``kafka:<partition>:<first>:<last>:<chunks>:<payload id>:<sha256>``."""

    partition: int
    first: int
    """Offset of the first record (chunk 0)."""
    last: int
    """Offset of the last record (chunk ``chunks - 1``)."""
    chunks: int
    payload_id: str
    digest: str
    """sha256 hex of the canonical text (also the event's ``result_digest``)."""

    def __str__(self) -> str:
        return (f"{KAFKA_REF_PREFIX}{self.partition}:{self.first}:{self.last}:{self.chunks}:{self.payload_id}:"
                f"{self.digest}")

    @classmethod
    def parse(cls, ref: str) -> PayloadRef:
        """The reference ``ref``; ValueError if it is not one."""
        m = _REF_RE.fullmatch(ref)
        if m is None:
            raise ValueError(f"not a payload reference: {ref!r}")
        p, first, last, chunks = (int(m.group(i)) for i in range(1, 5))
        if chunks < 1 or last < first or last - first + 1 < chunks:
            raise ValueError(f"not a payload reference (offsets and chunk count disagree): {ref!r}")
        return cls(p, first, last, chunks, m.group(5), m.group(6))

    @staticmethod
    def new_id() -> str:
        """A fresh payload id (uuid4 hex)."""
        return uuid.uuid4().hex


class ResultStore:
    """Large results: read by reference (Redis cache first, then ``{prefix}.payloads``), cached in Redis.

    Args:
        redis_client: a client from ``runjournal.core.redis_client``.
        prefix: key prefix (``settings.topic_prefix`` by default in the Journal).
        settings: where ``kafka:`` references are read (bootstrap, security, ``payloads_topic``); None: such a
            reference raises ``ResultUnavailableError`` unless Redis holds the text.
        read_timeout_s: longest read of one result's records, seconds.

    Raises:
        redis.RedisError: from ``put`` when Redis fails (``get`` treats a failing cache as a miss for ``kafka:``
            references).
    """

    def __init__(self, redis_client: Any, prefix: str, settings: Settings | None = None, *,
                 read_timeout_s: float = 60.0) -> None:
        self._r = redis_client
        self._prefix = prefix
        self._keys = RedisKeys(prefix)
        self._settings = settings
        self._timeout_s = read_timeout_s

    def key(self, ref: str) -> str:
        """The Redis key of ``ref`` (``sha256:<hex>`` or a ``kafka:`` reference → ``rj:P:result:<hex>``);
        ValueError if bad."""
        if ref.startswith(KAFKA_REF_PREFIX):
            return self._keys.result(PayloadRef.parse(ref).digest)
        if not ref.startswith(_REF_PREFIX) or len(ref) != len(_REF_PREFIX) + 64:
            raise ValueError(f"not a result reference: {ref!r}")
        return self._keys.result(ref[len(_REF_PREFIX) :])

    def put(self, text: str) -> str:
        """Store ``text`` (canonical JSON) in Redis only and return its reference ``sha256:<hex>`` (the older form:
        not durable beyond Redis; the journal writes large results with ``Journal.publish_payload``)."""
        ref = _REF_PREFIX + digest(text)
        self._r.set(self.key(ref), text.encode("utf-8"))
        return ref

    def cache(self, text: str) -> None:
        """Put ``text`` under its digest's key; a Redis failure is logged, never raised (Redis is a cache here)."""
        try:
            self._r.set(self._keys.result(digest(text)), text.encode("utf-8"))
        except Exception as exc:  # noqa: BLE001 - a cache miss later costs one read of the payloads topic
            log.warning("could not cache a %d-character result in Redis: %s", len(text), exc)

    def get(self, ref: str, *, run_id: str | None = None) -> str | None:
        """The text stored under ``ref``, or None when a ``sha256:`` reference is absent from Redis.

        Args:
            ref: the event's ``result_ref``.
            run_id: the run the result belongs to. Given, a ``kafka:`` reference whose records on the payloads topic
                are missing or do not make the text (the run was archived: tombstoned, then compacted) is read from
                the run's archived object instead (:meth:`read_archived_payload`, decision 0058).

        Raises:
            ResultUnavailableError: a ``kafka:`` reference's records are missing (erased, never written, topic gone)
                or cannot be read within the timeout, and the archive (when ``run_id`` is given) does not hold them.
            ResultCorruptError: they are there but do not make the recorded text (key or digest mismatch), and the
                archive does not hold them either.
        """
        if not ref.startswith(KAFKA_REF_PREFIX):
            raw = self._r.get(self.key(ref))
            if raw is None:
                return None
            return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        where = PayloadRef.parse(ref)
        try:
            raw = self._r.get(self._keys.result(where.digest))
        except Exception as exc:  # noqa: BLE001 - the cache is down: read the journal
            log.warning("result cache unavailable (%s); reading %s from the payloads topic", exc, ref)
            raw = None
        if raw is not None:
            text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
            if digest(text) == where.digest:
                return text
            log.warning("cached result %s does not match its digest; reading the payloads topic", where.digest)
        try:
            text = self.read_payload(where)
        except (ResultUnavailableError, ResultCorruptError) as exc:
            if run_id is None:
                raise
            try:
                archived = self.read_archived_payload(where, run_id)
            except ObjectStoreError as unusable:  # the topic's error stays the answer; the archive's is its cause
                raise type(exc)(f"{exc}; the archive could not be read: {unusable}") from unusable
            if archived is None:
                raise
            log.info("result %s of run %s read from the archive (%s)", where.digest, run_id, exc)
            text = archived
        self.cache(text)
        return text

    def read_archived_payload(self, where: PayloadRef, run_id: str) -> str | None:
        """The result ``where`` names, from the payload rows of ``run_id``'s archived object: the rows of partition
        ``where.partition`` with offsets ``where.first`` … ``where.last`` whose key names this payload, reassembled
        and checked against the digest exactly as records read from the topic (decision 0058: the archive keeps each
        row's original partition and offset). None when the archive has no such run, or its object lacks a chunk or
        does not make the recorded text (the caller reports the topic's error).

        Raises:
            ObjectStoreError: the archive's backend is unknown or not installed.
        """
        if self._settings is None:
            return None
        from runjournal.stores.archive_objects import ArchivedObjectMismatchError, read_checked

        try:
            archived = read_checked(self._settings, run_id)
        except ArchivedObjectMismatchError as exc:
            log.warning("result %s: the archive of run %s cannot be used: %s", where, run_id, exc)
            return None
        if archived is None:
            return None
        suffix = f"{SEP}{_KIND}{SEP}{where.payload_id}{SEP}"
        head = f"{run_id}{suffix}"
        parts: dict[int, bytes | None] = {}
        for row in archived.rows:
            if (row["source"] == "payloads" and row["partition"] == where.partition
                    and where.first <= row["offset"] <= where.last and row["key"].startswith(head)
                    and row["key"][len(head):].isdigit()):
                parts[int(row["key"][len(head):])] = row["value"]
        try:
            return self._assembled(where, parts, f"the archive of run {run_id}")
        except (ResultUnavailableError, ResultCorruptError) as exc:
            log.warning("result %s: not in the archive of run %s either: %s", where, run_id, exc)
            return None

    def read_payload(self, where: PayloadRef) -> str:
        """Read, check and reassemble the records ``where`` names from ``{prefix}.payloads`` (Redis not asked).

        Raises:
            ResultUnavailableError / ResultCorruptError: as :meth:`get`.
        """
        if self._settings is None:
            raise ResultUnavailableError(f"result {where} is on the payloads topic and this store has no settings")
        from confluent_kafka import KafkaError, TopicPartition

        from runjournal.core import kafka

        topic = self._settings.payloads_topic
        suffix = f"{SEP}{_KIND}{SEP}{where.payload_id}{SEP}".encode()
        parts: dict[int, bytes | None] = {}
        props: dict[str, Any] = {"group.id": f"rj-result-{uuid.uuid4()}", "enable.auto.commit": False,
                                 "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                                 "enable.partition.eof": True}
        consumer = kafka.consumer(self._settings, **props)
        try:
            consumer.assign([TopicPartition(topic, where.partition, where.first)])
            deadline = time.monotonic() + self._timeout_s
            done = False
            while not done and time.monotonic() < deadline:
                for msg in consumer.consume(64, 0.5):
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:  # noqa: SLF001
                            done = True  # the log ends before the last record: it is gone
                            break
                        if err.fatal() or err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                                         KafkaError.TOPIC_AUTHORIZATION_FAILED):
                            raise ResultUnavailableError(f"result {where}: cannot read {topic}: {err}")
                        continue
                    offset = msg.offset() or 0
                    if offset > where.last:
                        done = True
                        break
                    key = msg.key() or b""
                    head, sep, index = key.rpartition(suffix)
                    if not sep or not index.isdigit():
                        continue  # another run's or payload's record between this payload's
                    parts[int(index)] = msg.value()
                    if offset >= where.last:
                        done = True
                        break
                position = consumer.position([TopicPartition(topic, where.partition)])[0].offset
                if not done and position is not None and position > where.last:
                    done = True  # control markers / compacted records moved the position past the last one
            if not done:
                raise ResultUnavailableError(f"result {where}: {topic}[{where.partition}] not read to offset "
                                             f"{where.last} within {self._timeout_s} s")
        finally:
            consumer.close()
        return self._assembled(where, parts, f"{topic}[{where.partition}]")

    @staticmethod
    def _assembled(where: PayloadRef, parts: dict[int, bytes | None], source: str) -> str:
        """The text of chunks ``parts`` (index -> bytes), checked: every chunk there, none beyond, the digest."""
        missing = [i for i in range(where.chunks) if parts.get(i) is None]
        if missing:
            raise ResultUnavailableError(
                f"result {where}: {len(missing)} of its {where.chunks} record(s) on {source} are "
                f"missing (first: chunk {missing[0]}) — erased, or never committed")
        extra = sorted(i for i in parts if i >= where.chunks)
        if extra:
            raise ResultCorruptError(f"result {where}: records with chunk index {extra[0]} beyond its {where.chunks}")
        data = b"".join(parts[i] or b"" for i in range(where.chunks))
        parts.clear()
        got = digest_bytes(data)
        if got == where.digest:
            return data.decode("utf-8")
        raise ResultCorruptError(f"result {where}: its {where.chunks} record(s) reassemble to digest {got}, "
                                 f"not the recorded {where.digest}")


def unavailable_reason(ref: str) -> str:
    """Why a result stored by ``ref`` cannot be read, in words an operator can act on (the message of a
    ``ResultUnavailableError``)."""
    if ref.startswith("kafka:"):
        return ("its records on {prefix}.payloads are gone (the run or its source was erased and the topic "
                "compacted); the call committed and is never run again")
    return ("it was stored by digest in Redis only (before {prefix}.payloads) and Redis no longer has it; the call "
            "committed and is never run again")

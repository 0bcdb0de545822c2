"""Where LangGraph checkpoints live: records in the journal's transaction, projected into Redis for reads.

Writes. Every checkpoint, channel blob and pending write is a record on ``{prefix}.checkpoints`` (compacted,
as many partitions as the events topic, partition = murmur2(thread_id) like the thread's run), produced by the
instance's **transactional producer, in the same transaction as the run's events** (``Journal.publish_record``):
it commits and aborts with them and is fenced with them, so a fenced or lapsed instance (a zombie) cannot
write graph state behind the recovery job's back. A checkpoint's record is durable (broker ack) before
``put`` returns; its blobs ride in the same transaction before it.

Reads. A projection in Redis (one hash tag per thread, so one MULTI covers a thread on a cluster), written by
the writer right after the broker's ack — so a reader sees its own writes at once — and rebuilt from the
topic by :meth:`FrameworkRecordStore.rebuild` (a resumed run, a wiped Redis): the topic is the authority.

Record: key ``{thread}\\x1f{kind}\\x1f{field}`` (``runjournal.core.checkpoint_records``, shared with ``erase``),
value JSON ``{"kind", "field", "data"}``, kinds ``cp`` (a checkpoint: ``field`` = ``ns\\x1fid``), ``blob``
(``ns\\x1fchannel\\x1fversion``), ``w`` (a pending write: ``ns\\x1fid\\x1ftask_id\\x1fidx``), and for the
Agents SDK adapter ``item`` (a session item, field = its 12-digit index) and ``state`` (a paused ``RunState``).
A tombstone (``delete_thread``, ``pop_item``) removes its key. Thread ids are checked
(``runjournal.core.ids.THREAD_ID``) and fields built with :func:`join_field` (each part checked: no U+001F), so keys
and fields split back into their parts (docs/design/protocol.md § Identifiers and keys).

Large records. A thread's state may outgrow one Kafka record (a long conversation in one channel blob; the broker
refuses records over ``message.max.bytes``, 1 MB by default). A record whose value is over
``Settings.payload_chunk_bytes`` (512 KiB; the large tool results' record size too) is written as parts in the
same transaction, before it: kind ``part``, field ``<i><SEP><kind><SEP><field>`` (``checkpoint_records.part_field``),
each value a slice of the record's value; the record itself then carries ``{"kind", "field", "parts": n, "bytes",
"sha256"}`` instead of ``data``. Rebuild reassembles the slices, checks
the length and the digest (``RecordPartsError`` otherwise), and never reads a part of an aborted transaction
(``read_committed``). The Redis projection keeps the whole data, and in the ``part`` hash each large record's
part count, so ``delete_thread`` and a tombstone remove its parts too; parts left by a record rewritten with fewer
of them are never read (the record's ``parts`` bounds them) and ``runjournal erase`` removes them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

from runjournal.core import kafka
from runjournal.core.checkpoint_records import (
    KINDS,
    PART,
    SEP,
    join_field,
    of_thread,
    part_field,
    record_key,
    split_part_field,
)
from runjournal.core.errors import RunjournalError
from runjournal.core.ids import THREAD_ID
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.producers import Journal
from runjournal.schemas.keys import partition_for

__all__ = ["KINDS", "SEP", "FrameworkRecordStore", "Record", "RecordPartsError", "UnsealableRecordError",
           "checkpoints_topic", "join_field"]

log = logging.getLogger("runjournal.adapters.checkpoints")



class UnsealableRecordError(RunjournalError):
    """Encryption is on (``RUNJOURNAL_ENCRYPTION=on``) and the journal writes no run of the record's thread: there is
    no key scope to seal the record under, and it is never written in clear instead (decision 0059)."""


class RecordPartsError(RuntimeError):
    """A large record's parts do not rebuild it: a part is missing, or the reassembled bytes differ in length or
    SHA-256 from what the record states. Names the thread, kind and field; nothing is projected for the thread."""


def checkpoints_topic(settings: Settings) -> str:
    """``{prefix}.checkpoints`` (``Settings.checkpoints_topic``; ``runjournal topics create`` creates it)."""
    return settings.checkpoints_topic


@dataclass(frozen=True, slots=True)
class Record:
    """One projected entry: ``kind`` hash, ``field``, JSON ``data`` (None = deleted)."""

    kind: str
    """``cp``, ``blob`` or ``w``."""
    field: str
    """The hash field (see the module docstring)."""
    data: str | None
    """JSON text of the entry; None for a tombstone."""


class FrameworkRecordStore:
    """The framework records (LangGraph checkpoints, Agents SDK sessions) and their Redis projection, for one Journal
    (module docstring). Not the design's :class:`runjournal.stores.CheckpointStore` (a run state at an offset).

    Args:
        journal: the instance's :class:`Journal` (its transaction carries the records).
        redis_client: a client from ``runjournal.core.redis_client`` (one server or a cluster; default: from the
            journal's settings).

    Raises (construction):
        KafkaException: ``{prefix}.checkpoints`` could not be created.
    """

    def __init__(self, journal: Journal, redis_client: Any = None) -> None:
        if redis_client is None:
            from runjournal.core import redis_client as redis_clients

            redis_client = redis_clients.client(journal.settings)
        self.journal = journal
        self.settings = journal.settings
        self.topic = checkpoints_topic(journal.settings)
        self._r = redis_client
        self._prefix = journal.settings.topic_prefix
        self._keys = RedisKeys(self._prefix)
        self.part_bytes = journal.settings.payload_chunk_bytes
        """Record values over this many bytes are written as parts (``Settings.payload_chunk_bytes``)."""
        ensure_topic(journal.settings, self.topic, journal.partitions)

    # -- keys -------------------------------------------------------------------------------------------------
    def key(self, thread_id: str, kind: str) -> str:
        """``rj:{P:t:<thread_id>}:lg:<kind>`` (``RedisKeys.checkpoint``: the thread is the hash tag)."""
        return self._keys.checkpoint(thread_id, kind)

    def threads_key(self) -> str:
        """``rj:P:lg:threads``: every thread with a projection (for ``list(None)``; a key of its own slot)."""
        return self._keys.checkpoint_threads()

    # -- writes -----------------------------------------------------------------------------------------------
    def lock(self, thread_id: str) -> threading.RLock:
        """The thread's run lock (``Journal.run_lock``): held by every write of this store and the run's handles, so
        threads or tasks writing one thread serialise (the topic's order is the projection's). Hold it around a
        read-modify-write (a session's next item index)."""
        return self.journal.run_lock(thread_id)

    def write(self, thread_id: str, records: list[Record]) -> None:
        """Produce ``records`` in the journal's transaction (the last one durable), then project them, under the
        thread's lock (:meth:`lock`): concurrent writers of one thread project in the order they produced.

        Raises:
            InvalidIdError: ``thread_id`` breaks the thread-id rules; nothing was written.
            DeliveryError / ProducerFencedError / LeaseLapsedError: nothing was projected.
        """
        THREAD_ID.check(thread_id)
        with self.lock(thread_id):
            self._write(thread_id, records)

    def _write(self, thread_id: str, records: list[Record]) -> None:
        produced: list[tuple[str, bytes | None]] = []
        projected: list[Record] = []
        gone = [rec for rec in records if rec.data is None and rec.kind != PART]
        counts = self.get(thread_id, PART, [join_field_raw(r.kind, r.field) for r in gone]) if gone else []
        for rec, count in zip(gone, counts, strict=True):  # a large record's parts go with it
            if count is not None:
                produced += [(record_key(thread_id, PART, part_field(i, rec.kind, rec.field)), None)
                             for i in range(int(count))]
                projected.append(Record(PART, join_field_raw(rec.kind, rec.field), None))
        for rec in records:
            key = record_key(thread_id, rec.kind, rec.field)
            if rec.data is None:
                produced.append((key, None))
                projected.append(rec)
                continue
            rec = Record(rec.kind, rec.field, self._sealed(thread_id, rec.kind, rec.field, rec.data))
            value = json.dumps({"kind": rec.kind, "field": rec.field, "data": rec.data}).encode()
            if len(value) > self.part_bytes:
                n = -(-len(value) // self.part_bytes)
                produced += [(record_key(thread_id, PART, part_field(i, rec.kind, rec.field)),
                              value[i * self.part_bytes:(i + 1) * self.part_bytes]) for i in range(n)]
                value = json.dumps({"kind": rec.kind, "field": rec.field, "parts": n, "bytes": len(value),
                                    "sha256": hashlib.sha256(value).hexdigest()}).encode()
                projected.append(Record(PART, join_field_raw(rec.kind, rec.field), str(n)))
            produced.append((key, value))
            projected.append(rec)
        for i, (key, value) in enumerate(produced):
            self.journal.publish_record(self.topic, key, value, run_id=thread_id, durable=i == len(produced) - 1)
        self.project(thread_id, projected)

    def project(self, thread_id: str, records: list[Record]) -> None:
        """Apply ``records`` to the Redis projection: the thread listed first, then its kinds in one MULTI (one
        hash slot, so a Redis Cluster accepts it; a crash between leaves a listed thread with no records, which
        reads as empty and is rebuilt from the topic)."""
        self._r.sadd(self.threads_key(), thread_id)
        pipe = self._r.pipeline(transaction=True)
        for rec in records:
            if rec.data is None:
                pipe.hdel(self.key(thread_id, rec.kind), rec.field)
            else:
                pipe.hset(self.key(thread_id, rec.kind), rec.field, rec.data)
        pipe.execute()

    def forget(self, thread_id: str) -> None:
        """Tombstone every record of ``thread_id`` (durable), then drop its projection (``InvalidIdError`` for a bad
        thread id)."""
        THREAD_ID.check(thread_id)
        with self.lock(thread_id):
            records = [Record(kind, field, None) for kind in KINDS if kind != PART
                       for field in self.fields(thread_id, kind)]
            if records:
                self._write(thread_id, records)
            pipe = self._r.pipeline(transaction=True)  # the thread's keys (one slot), then the list
            for kind in KINDS:
                pipe.delete(self.key(thread_id, kind))
            pipe.execute()
            self._r.srem(self.threads_key(), thread_id)

    # -- reads ------------------------------------------------------------------------------------------------
    def fields(self, thread_id: str, kind: str) -> list[str]:
        """Every field of one kind of ``thread_id``."""
        return [_text(f) for f in self._r.hkeys(self.key(thread_id, kind))]

    def entries(self, thread_id: str, kind: str) -> dict[str, str]:
        """``field -> data`` of one kind of ``thread_id`` (sealed data opened: decision 0059)."""
        return {(f := _text(k)): self._opened(thread_id, kind, f, _text(v))
                for k, v in self._r.hgetall(self.key(thread_id, kind)).items()}

    def get(self, thread_id: str, kind: str, fields: list[str]) -> list[str | None]:
        """The data of ``fields`` (None where absent; sealed data opened)."""
        if not fields:
            return []
        return [None if v is None else self._opened(thread_id, kind, f, _text(v))
                for f, v in zip(fields, self._r.hmget(self.key(thread_id, kind), fields), strict=True)]

    # -- sealing (decision 0059) ----------------------------------------------------------------------------------
    def _sealed(self, thread_id: str, kind: str, field: str, data: str) -> str:
        """A record's data as stored: encrypted under the thread's run's key when the journal encrypts (bound to
        ``(thread, <kind>:<field>, data)``), else as it is (JSON text never needs the escape). A part count is
        never sealed.

        Raises:
            UnsealableRecordError: encryption is on and the journal writes no run of ``thread_id`` (no key scope).
        """
        content = getattr(self.journal, "content", None)
        if content is None or not content.encrypting or kind == PART:
            return data
        scope = self.journal.scope_of(thread_id)
        if scope is None:
            raise UnsealableRecordError(f"encryption is on and this journal writes no run of thread {thread_id!r}: "
                                        "its framework record cannot be sealed (start or resume the run first)")
        return str(content.seal_text(data, tenant_id=scope.tenant_id, subject=scope.subject, run_id=thread_id,
                                     address=f"{kind}:{field}", field="data"))

    def _opened(self, thread_id: str, kind: str, field: str, data: str) -> str:
        """Stored data in plain text (a token opened with the journal's keys; plain data as it is).

        Raises:
            EncryptedContentError: a token this journal cannot open (no key, a destroyed one).
        """
        content = getattr(self.journal, "content", None)
        if content is None or kind == PART or not data.startswith("rjenc:"):
            return data
        return str(content.open(data, thread_id, f"{kind}:{field}", "data"))

    def threads(self) -> list[str]:
        """Every projected thread id, sorted."""
        return sorted(_text(t) for t in self._r.smembers(self.threads_key()))

    # -- rebuild ------------------------------------------------------------------------------------------------
    def rebuild(self, thread_id: str, *, timeout_s: float = 60.0) -> int:
        """Rebuild ``thread_id``'s projection from the topic (its partition, start to end); returns records applied
        (a large record counts once, whatever its parts).

        The journal's open transaction is committed first. Cost grows with the partition's size (a resume or
        a repair, not a hot path).

        Raises:
            TimeoutError: the partition cannot be read to its end.
            RecordPartsError: a large record's parts are missing or do not match it; nothing is projected.
        """
        from confluent_kafka import TopicPartition

        from runjournal.consumers.runtime.partitions import range_consumer, read_ranges

        THREAD_ID.check(thread_id)
        self.journal.flush()
        partition = partition_for(thread_id, self.journal.partitions)
        latest: dict[bytes, bytes | None] = {}

        def on_record(msg: Any) -> None:
            if of_thread(msg.key(), thread_id):
                latest[msg.key()] = msg.value()

        consumer = range_consumer(self.settings, "checkpoints-rebuild")
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, partition), timeout=10)
            if read_ranges(consumer, self.topic, {partition: (low, high)}, on_record, timeout_s=timeout_s):
                raise TimeoutError(f"could not read {self.topic}[{partition}] to offset {high}")
        finally:
            consumer.close()
        records = _reassemble(thread_id, latest)
        pipe = self._r.pipeline(transaction=True)
        for kind in KINDS:
            pipe.delete(self.key(thread_id, kind))
        pipe.execute()
        if records:
            self.project(thread_id, records)
        return sum(1 for r in records if r.kind != PART)


def join_field_raw(kind: str, field: str) -> str:
    """The ``part`` hash's field of the record ``(kind, field)``: ``<kind><SEP><field>`` (the field whole)."""
    return f"{kind}{SEP}{field}"


def _reassemble(thread_id: str, latest: dict[bytes, bytes | None]) -> list[Record]:
    """The records of ``latest`` (record key -> its last value in the topic): a large record rebuilt from its
    parts (with a ``part`` entry of its count), parts themselves consumed; tombstones dropped.

    Raises:
        RecordPartsError: a part is missing, or the bytes differ from the record's length or digest.
    """
    parts: dict[tuple[str, str], dict[int, bytes]] = {}
    docs: list[dict[str, Any]] = []
    head = f"{thread_id}{SEP}{PART}{SEP}".encode()
    for key, value in latest.items():
        if value is None:
            continue
        if key.startswith(head):
            index, kind, field = split_part_field(key[len(head):].decode())
            parts.setdefault((kind, field), {})[index] = value
        else:
            docs.append(json.loads(value))
    records = []
    for doc in docs:
        if "parts" in doc:
            kind, field, n = doc["kind"], doc["field"], int(doc["parts"])
            have = parts.get((kind, field), {})
            missing = [i for i in range(n) if i not in have]
            value = b"".join(have[i] for i in range(n)) if not missing else b""
            if missing or len(value) != doc["bytes"] or hashlib.sha256(value).hexdigest() != doc["sha256"]:
                raise RecordPartsError(
                    f"thread {thread_id}: record {kind} {field!r} does not rebuild from its {n} parts "
                    f"({f'missing {missing[:5]}' if missing else 'length or sha256 differ'}); its transaction "
                    "committed them together, so the topic lost records: restore it or erase the thread")
            doc = json.loads(value)
            records.append(Record(PART, join_field_raw(kind, field), str(n)))
        records.append(Record(doc["kind"], doc["field"], doc["data"]))
    return records


def ensure_topic(settings: Settings, topic: str, partitions: int) -> None:
    """Create ``topic`` (compacted, ``partitions`` partitions, the settings' replication) unless it exists."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    admin = kafka.admin_client(settings)
    if topic in admin.list_topics(timeout=10).topics:
        return
    rf = settings.replication_factor
    config = {"cleanup.policy": "compact", **({"min.insync.replicas": "2"} if rf > 1 else {})}
    future = admin.create_topics([NewTopic(topic, partitions, rf, config=config)])[topic]
    try:
        future.result(30)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
    log.info("created %s (%d partitions, replication %d)", topic, partitions, rf)


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)

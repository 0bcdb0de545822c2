"""Erase a run: tombstone every event and framework-record key, delete its Redis state and records, delete its memory.

Order (each step is idempotent, so running ``erase`` again finishes an interrupted one):

1. Read the run's record keys from its partition (``read_committed``; a key whose latest record
   is already a tombstone is skipped) — of the events topic, and of ``{prefix}.checkpoints`` (the framework
   adapters' records of the run's thread, keyed ``<run_id><SEP><kind><SEP><field>``:
   ``runjournal.core.checkpoint_records``; same partition number; a deployment without the topic has none), and of
   ``{prefix}.payloads`` (the run's large results, keyed ``<run_id><SEP>result<SEP><payload id><SEP><index>``:
   ``runjournal.producers.results``; the whole partition is scanned, so chunks no event references — a crash
   between their commit and the event's — go too).
2. Refuse a run that is not finished while its owner holds a live lease (it would write on), unless
   forced — judged from the projected state (a run the projector has not seen yet is not refused). Then mark the
   erase in ``rj:{P:arc}:erased`` (Redis's clock, :func:`mark_erasing`): an archive of the run in flight finds the
   mark after its write and deletes its copy (decision 0057).
3. Produce one tombstone (``value=None``) per key to the run's partition of each topic through a plain
   idempotent producer (``acks=all``), flush, and check every delivery. Both topics are compacted, so the
   broker drops the erased values at the next cleaning; every consumer follows the tombstones: the
   projector deletes the run's state, the memory extractor deletes the items of each record.
4. Delete the run's Redis keys directly too (the projector may be down): its projected state
   (``rj:{P.p}:run:<run_id>`` and its entry in ``rj:{P.p}:runs``), recovery plan
   (``rj:{P:r:<run_id>}:plan``), approval inbox (``rj:{P:r:<run_id>}:approvals`` and pending
   entries), its framework checkpoint projection (``rj:{P:t:<run_id>}:lg:<kind>`` and its entry in
   ``rj:P:lg:threads``), and its entries in instances' owned sets, assignment lists, surrendered hashes (found by
   SCAN on every primary of a Redis Cluster) and the parked set. One command per key: the keys live in several slots.
   Cached results (``rj:P:result:<sha256>``) are content-addressed and may be shared: left alone; so is the
   run-id claim (a run id is used once). A fork (``runjournal fork``) references its parent's large results'
   records rather than copying them: erasing the parent makes them unreadable to the fork as well, once Redis no
   longer caches them (decision 0052).
5. Ask the memory store to delete every point whose provenance is the run (``delete_by_run``). A
   local Qdrant directory held by a running extractor is reported, not an error: the extractor
   erases the items itself when it reads the tombstones.

Not erased: copies of the run's records in the dead-letter topics (delete-policy topics, kept forever). With
encryption on, :func:`shred_keys` reaches those copies too: it destroys a subject's or tenant's key, and every copy of
their content becomes unreadable (decision 0059).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from runjournal.consumers.ops.inspect import read_run_events
from runjournal.consumers.projector.store import ProjectionStore
from runjournal.consumers.recovery.instances import Instances
from runjournal.consumers.runtime import archive_claims as claims
from runjournal.consumers.runtime.partitions import range_consumer, read_ranges, run_partition
from runjournal.core import kafka
from runjournal.core import redis_client as redis_clients
from runjournal.core.checkpoint_records import KINDS, of_thread
from runjournal.core.crypto.keys import KeyManagementService, KeyScope
from runjournal.core.errors import RunjournalError
from runjournal.core.ids import RUN_ID, TENANT_ID, USER_ID
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.producers.approvals import ApprovalInbox
from runjournal.producers.results import of_run
from runjournal.schemas.keys import KeyFormatError, parse_event_key

if TYPE_CHECKING:
    from runjournal.consumers.memory.store import QdrantMemoryStore
    from runjournal.consumers.vectors.embed import Embedder

__all__ = ["ERASE_MARK_MS", "EraseError", "EraseReport", "RunStillLiveError", "ShredReport", "cached_results",
           "check_not_live", "delete_run_redis", "erase_run", "mark_erasing", "run_records", "runs_records",
           "shred_keys", "tombstone", "tombstone_producer"]


class EraseError(RunjournalError):
    """The tombstones could not all be written (nothing after step 3 was done; run erase again)."""


class RunStillLiveError(EraseError):
    """The run is unfinished and its owner holds a live lease: it would keep writing (use ``force``)."""


@dataclass(frozen=True)
class EraseReport:
    """What :func:`erase_run` did."""

    run_id: str
    """The run."""
    partition: int
    """Its partition of the events topic."""
    records_seen: int
    """Records of the run read from the topic (tombstones included; 0: the topic never had the run)."""
    tombstones: int
    """Tombstones written to the events topic (one per key not already tombstoned)."""
    redis_keys_deleted: int
    """Redis keys deleted (state, plan, approvals inbox, the checkpoint projection's kinds)."""
    redis_entries_removed: int
    """Set/list entries removed (runs set and index, pending approvals, owned sets, assignment lists, parked set,
    the checkpoint thread list)."""
    memory_points_deleted: int | None
    """Memory points deleted; None when the store could not be opened now (see ``memory_note``)."""
    memory_note: str | None
    """Why memory was not (or need not be) erased here, when so."""
    checkpoint_records_seen: int = 0
    """Framework records of the run read from ``{prefix}.checkpoints`` (tombstones included)."""
    checkpoint_tombstones: int = 0
    """Tombstones written to ``{prefix}.checkpoints`` (one per record key not already tombstoned)."""
    payload_records_seen: int = 0
    """Records of the run's large results read from ``{prefix}.payloads`` (tombstones included)."""
    payload_tombstones: int = 0
    """Tombstones written to ``{prefix}.payloads`` (one per chunk key not already tombstoned)."""

    def as_dict(self) -> dict[str, Any]:
        """The report as a JSON-able dict."""
        return asdict(self)


@dataclass(frozen=True)
class ShredReport:
    """What :func:`shred_keys` did."""

    tenant_id: str
    subject: str | None
    """The subject (user) erased; None: the whole tenant."""
    shredded: list[dict[str, Any]]
    """One entry per key-encryption key: ``{"scope": "tenant"|"subject", "kek_id", "destroyed"}`` (``destroyed``
    False: it already was, or this key service never had it)."""
    deleted: list[str]
    """What was deleted besides keys: ``memory points: N`` (the subject's or tenant's memory items, their vectors
    included); the runs stay, their content unreadable."""
    note: str
    memory_note: str | None = None
    """Why memory items were not deleted here, when so (the memory store could not be reached)."""

    def as_dict(self) -> dict[str, Any]:
        """The report as a JSON-able dict."""
        return asdict(self)


def shred_keys(settings: Settings, tenant_id: str, subject: str | None = None, *,
               kms: KeyManagementService | None = None, erase_memory: bool = True,
               memory_store: QdrantMemoryStore | None = None, embedder: Embedder | None = None) -> ShredReport:
    """Crypto-shred a subject of a tenant, or a whole tenant: destroy its key-encryption key(s) in the key service
    (``RUNJOURNAL_KMS``), after which every token under them — in the topics and their replicas, the dead-letter
    topics, Redis, backups, archived files — raises ``KeyDestroyedError`` (decision 0059). A tenant's key is destroyed
    first (no new subject key is made under a destroyed tenant), then each subject key it lists, listed again until
    no new one appears (a writer that made one in between). Idempotent.

    Processes that unwrapped a data key of a destroyed key read its tokens until their cache's TTL
    (``RUNJOURNAL_KEY_CACHE_TTL_MS``) has passed.

    With ``erase_memory`` (default) the subject's (tenant's) memory items are deleted too, by their payload's owner
    (``QdrantMemoryStore.delete_by_owner``): their sealed text is already unreadable, and this takes their vectors
    (embeddings of that text) — through the running memory extractor that holds a local directory, the directory,
    or the Qdrant server. A store that cannot be reached is reported in ``memory_note``, not an error: the items'
    text stays unreadable; run the erase again to delete the points.

    Raises:
        InvalidIdError: ``tenant_id`` or ``subject`` breaks its id rules.
        ConfigError: ``RUNJOURNAL_KMS`` names a key service not built in this release.
        KeyUnavailableError: the key service did not answer (nothing or part was destroyed: run it again).
    """
    from runjournal.core.crypto.cipher import kms_from_settings

    TENANT_ID.check(tenant_id)
    USER_ID.check_optional(subject)
    service = kms if kms is not None else kms_from_settings(settings)
    scope = KeyScope(tenant_id, subject)
    shredded = [{"scope": "subject" if subject else "tenant", "kek_id": scope.kek_id,
                 "destroyed": service.destroy(scope.kek_id)}]
    if subject is None:
        for _ in range(3):
            children = service.children(scope.kek_id)
            if not children:
                break
            shredded += [{"scope": "subject", "kek_id": kek, "destroyed": service.destroy(kek)} for kek in children]
    what = f"subject {subject!r} of tenant {tenant_id!r}" if subject else f"tenant {tenant_id!r} and its subjects"
    points, memory_note = (_erase_owner_memory(settings, tenant_id, subject, embedder, memory_store) if erase_memory
                           else (None, "skipped"))
    return ShredReport(tenant_id, subject, shredded, [f"memory points: {points}"] if points else [],
                       f"the content of {what} is unreadable wherever it is stored (runs, ids, digests and timings "
                       "stay); other processes stop reading within their key cache's TTL", memory_note)


def erase_run(settings: Settings, run_id: str, *, force: bool = False, erase_memory: bool = True,
              embedder: Embedder | None = None, memory_store: QdrantMemoryStore | None = None,
              redis_client: Any = None, timeout_s: float = 30.0,
              progress: Callable[[str], None] | None = None) -> EraseReport:
    """Erase ``run_id`` from the journal, Redis and memory (see the module docstring for the steps).

    Args:
        settings: bootstrap, Redis URL, prefix, Qdrant path or URL.
        run_id: the run.
        force: erase even an unfinished run whose owner holds a live lease.
        erase_memory: step 5 (default True).
        embedder: names the memory collection (default: ``runjournal.consumers.memory.default_embedder()``).
        memory_store: an open store to delete from (default: opened from ``settings`` and closed).
        redis_client: default ``runjournal.core.redis_client.client(settings)``.
        timeout_s: longest wait for the tombstones' acknowledgements, seconds (default 30).
        progress: called with a sentence before each step (what it does now), for a long erase's progress.

    Returns:
        :class:`EraseReport`.

    Raises:
        InvalidIdError: ``run_id`` is not text (``runjournal.core.ids`` ``check_lookup``: a run started before the id
            rules with an id they refuse is still erased).
        RunStillLiveError: step 2 — an owner's live lease, or a ``continue_run`` of the run in flight (its claim;
            the erase marks first and then looks, the continuation claims first and then looks for the mark:
            decision 0057).
        EraseError: a tombstone was not acknowledged.
        TopicNotFoundError: the events topic does not exist.
        KafkaException / redis.RedisError: the broker or Redis is unreachable.
    """
    RUN_ID.check_lookup(run_id)
    say = progress or (lambda _text: None)
    client = redis_client if redis_client is not None else redis_clients.client(settings)
    partition = run_partition(settings, run_id)
    say(f"reading partition {partition} of {settings.events_topic} and {settings.checkpoints_topic} for the run's keys")
    rows = [r for r in read_run_events(settings, run_id) if parse_event_key(r["key"]).run_id == run_id]  # 1
    latest = {row["key"]: row["type"] for row in rows}
    keys = [k for k, kind in latest.items() if kind != "TOMBSTONE"]
    cp_seen, cp_keys = _checkpoint_keys(settings, partition, run_id, timeout_s)  # 1, framework records
    pl_seen, pl_keys = _payload_keys(settings, partition, run_id, timeout_s)  # 1, large results' records
    check_not_live(settings, client, partition, run_id, force)  # 2
    mark_erasing(settings, client, run_id)  # 2, before anything is removed: an archive in flight finds it (0057)
    if not force and claims.live_claim(client, settings.topic_prefix, claims.REOPENING, run_id):
        client.zrem(RedisKeys(settings.topic_prefix).archive_erased(), run_id)  # nothing erased: no mark either
        raise RunStillLiveError(f"run {run_id} is being continued (continue_run holds its claim): erasing it now "
                                "would leave a resumed run without its history — try again once it is done (or force)")
    say(f"writing {len(keys)} tombstone(s) to the events, {len(cp_keys)} to the framework records and "
        f"{len(pl_keys)} to the large results' records (waiting for the broker's acknowledgements)")
    tombstone(settings, settings.events_topic, partition, keys, timeout_s)  # 3
    tombstone(settings, settings.checkpoints_topic, partition, cp_keys, timeout_s)
    tombstone(settings, settings.payloads_topic, partition, pl_keys, timeout_s)
    say("deleting the run's Redis state, records and index entries")
    deleted, removed = delete_run_redis(settings, client, partition, run_id, cached_results(rows))  # 4
    if erase_memory:
        say("erasing the run's memory items (loads the embedder that names the collection)")
    points, note = _erase_memory(settings, run_id, embedder, memory_store) if erase_memory else (None, "skipped")  # 5
    return EraseReport(run_id=run_id, partition=partition, records_seen=len(rows), tombstones=len(keys),
                       redis_keys_deleted=deleted, redis_entries_removed=removed, memory_points_deleted=points,
                       memory_note=note, checkpoint_records_seen=cp_seen, checkpoint_tombstones=len(cp_keys),
                       payload_records_seen=pl_seen, payload_tombstones=len(pl_keys))


def _checkpoint_keys(settings: Settings, partition: int, run_id: str, timeout_s: float) -> tuple[int, list[str]]:
    """(records seen, keys whose latest record is not a tombstone) of ``run_id`` on its partition of
    ``{prefix}.checkpoints``; (0, []) when the topic does not exist (a deployment from before the adapters)."""
    return _run_keys(settings, settings.checkpoints_topic, partition, run_id, timeout_s, of_thread)


def _payload_keys(settings: Settings, partition: int, run_id: str, timeout_s: float) -> tuple[int, list[str]]:
    """The same for ``{prefix}.payloads`` (the run's large results, every chunk of every written result — those its
    events reference and orphans of a crash between their commit and the event's); (0, []) when the topic does
    not exist (a deployment from before it)."""
    return _run_keys(settings, settings.payloads_topic, partition, run_id, timeout_s, of_run)


def _run_keys(settings: Settings, topic: str, partition: int, run_id: str, timeout_s: float,
              mine: Callable[[bytes | None, str], bool]) -> tuple[int, list[str]]:
    seen, latest = run_records(settings, topic, partition, run_id, mine, timeout_s=timeout_s)
    return seen, [k.decode() for k, (_offset, value) in latest.items() if value is not None]


def run_records(settings: Settings, topic: str, partition: int, run_id: str,
                mine: Callable[[bytes | None, str], bool], *, timeout_s: float = 30.0,
                event_keys: bool = False) -> tuple[int, dict[bytes, tuple[int, bytes | None]]]:
    """The run's records on its partition of ``topic`` (``{prefix}.checkpoints`` with
    ``runjournal.core.checkpoint_records.of_thread``, ``{prefix}.payloads`` with
    ``runjournal.producers.results.of_run``):
    ``(records seen, {key: (offset, value) of its latest record})`` — value None for a tombstone; ``(0, {})`` when
    the topic does not exist (a deployment from before it). :func:`runs_records` of one run (``event_keys``: the
    events topic's keys).

    Raises:
        EraseError: the partition could not be read to its end within ``timeout_s`` seconds.
    """
    seen, latest = runs_records(settings, topic, partition, {run_id}, mine, timeout_s=timeout_s,
                                event_keys=event_keys)
    return seen.get(run_id, 0), latest.get(run_id, {})


def runs_records(settings: Settings, topic: str, partition: int, run_ids: set[str],
                 mine: Callable[[bytes | None, str], bool], *, timeout_s: float = 30.0,
                 event_keys: bool = False, consumer: Consumer | None = None,
                 partitions: set[int] | None = None, start: int | None = None,
                 read_to: dict[tuple[str, int], int] | None = None,
                 ) -> tuple[dict[str, int], dict[str, dict[bytes, tuple[int, bytes | None]]]]:
    """The records of every run of ``run_ids`` on one partition of ``topic``, in one read of it from its low to its
    high watermark (``read_committed``): ``({run: records seen}, {run: {key: (offset, value) of its latest
    record}})`` — value None for a tombstone; runs without records are absent; ``({}, {})`` when the topic does not
    exist (a deployment from before it). The archiver reads a sweep's due runs of a partition this way: one read
    whatever their number (decision 0056), through one ``consumer`` (``range_consumer``; unsubscribed, no group)
    for all its reads — default a new one, closed after — and ``partitions``, the topic's partitions it read from
    the metadata once (default: a metadata request here; none, or the partition not among them: ``({}, {})``).

    A key belongs to the run ``r`` of ``run_ids`` for which ``mine(key, r)`` holds, ``r`` being the key's text up to
    one of its separators (``\x1f``: the checkpoints' and payloads' keys start with ``<run_id><SEP>``), or, with
    ``event_keys``, the run id of an event key (``runjournal.schemas.keys``): a run whose id merely starts with
    another's plus a separator never takes that one's records.

    ``start`` reads from that offset instead of the low watermark (the archiver's look at what arrived after its
    read); ``read_to``, when given, gets ``{(topic, partition): the offset the read ended at}`` (the high watermark,
    or past the last record delivered): where a later read starts to see only what came after this one.
    ``consumer``: a ``runjournal.consumers.runtime.partitions.range_consumer`` of the caller's, kept open (default
    a new one, closed after the read).

    Raises:
        EraseError: the partition could not be read to its end within ``timeout_s`` seconds.
    """
    latest: dict[str, dict[bytes, tuple[int, bytes | None]]] = {}
    seen: dict[str, int] = {}
    wanted = {r.encode(): r for r in run_ids}
    sep = b"\x1f"
    last = -1

    def owner(key: bytes | None) -> str | None:
        if key is None:
            return None
        if event_keys:
            try:
                run = parse_event_key(key).run_id
            except KeyFormatError:
                return None
            return run if run in run_ids and mine(key, run) else None
        at = key.find(sep)
        while at >= 0:  # a few separators per key: the candidates are its prefixes ending before one
            candidate = wanted.get(key[:at])
            if candidate is not None and mine(key, candidate):
                return candidate
            at = key.find(sep, at + 1)
        return None

    def on_record(msg: Message) -> None:
        key = msg.key()
        nonlocal last
        last = max(last, int(msg.offset() or 0))
        run = owner(key)
        if run is not None and key is not None:
            seen[run] = seen.get(run, 0) + 1
            latest.setdefault(run, {})[key] = (int(msg.offset() or 0), msg.value())

    reader = consumer if consumer is not None else range_consumer(settings, "erase-records")
    try:
        if partitions is None:
            # one topic's metadata (a range consumer never auto-creates it): all topics' grows with the cluster
            meta = reader.list_topics(topic, timeout=10).topics.get(topic)
            partitions = set() if meta is None or meta.error is not None else set(meta.partitions)
        if partition not in partitions:
            return {}, {}
        low, high = reader.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)
        first = low if start is None else max(low, start)
        if read_ranges(reader, topic, {partition: (first, high)}, on_record, timeout_s=timeout_s):
            raise EraseError(f"could not read {topic}[{partition}] to offset {high} within {timeout_s} s "
                             "(an open transaction?); nothing was erased — run erase again")
        if read_to is not None:
            read_to[(topic, partition)] = max(high, last + 1)
        if consumer is not None and first < high:  # read_ranges paused it at its end: a next read of it resumes
            reader.resume([TopicPartition(topic, partition)])
    finally:
        if consumer is None:
            reader.close()
        else:
            reader.unassign()  # what it fetched past the range goes; the next read assigns its own partition
    return seen, latest


ERASE_MARK_MS = 7 * 24 * 3600 * 1000
"""How long an erase's mark stays in ``rj:{P:arc}:erased`` (ms, 7 days): longer than twice the longest archive of one
run may take before it gives up (``runjournal.consumers.archive.store`` aborts an archive older than half of it), so
an archive that read the run before the erase always finds the mark after its write (decision 0057)."""


def mark_erasing(settings: Settings, client: Any, run_id: str) -> int:
    """Step 2's end: note in ``rj:{P:arc}:erased`` that an erase of ``run_id`` began, scored by Redis's ``TIME``
    (ms), before any tombstone or deletion; returns that score.

    An archive of the run running at the same time writes its object and manifest, then reads this mark: either the
    archive's write came first, and this erase's last step (``delete_archived``) deletes the copy, or the mark came
    first, and the archive deletes its own copy (``RunErasedError``). No erased run keeps a copy in the archive
    (docs/design/decisions/0057-erase-while-archiving.md). Marks older than :data:`ERASE_MARK_MS` are trimmed by the
    archiver's sweep (a run id is used once: the mark never refuses another run).

    Raises:
        redis.RedisError: Redis is unreachable (nothing was erased yet).
    """
    keys = RedisKeys(settings.topic_prefix)
    seconds, micros = client.time()
    now = int(seconds) * 1000 + int(micros) // 1000
    client.zadd(keys.archive_erased(), {run_id: now})
    return now


def check_not_live(settings: Settings, client: Any, partition: int, run_id: str, force: bool) -> None:
    """Step 2 (and the archiver's guard).

    Raises:
        RunStillLiveError: the run is unfinished and its owner holds a live lease (and not ``force``).
    """
    state = ProjectionStore(client, settings.topic_prefix).get(partition, run_id)
    if force or state is None or state.terminal or not state.owner:
        return
    if Instances(client, settings.topic_prefix).view(state.owner).alive:
        raise RunStillLiveError(f"run {run_id} is {state.status} and its owner {state.owner} holds a live lease; "
                                "it would keep writing — stop it first (or force)")


def tombstone(settings: Settings, topic: str, partition: int, keys: list[str], timeout_s: float, *,
              producer: Producer | None = None) -> None:
    """Step 3: one acknowledged tombstone per key on ``topic[partition]``, through ``producer`` (a long-lived
    idempotent one: the archiver's, :func:`tombstone_producer`) or a new one.

    Raises:
        EraseError: the local queue stayed full, or a tombstone was not acknowledged within ``timeout_s``.
    """
    if not keys:
        return
    errors: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(err)

    producer = producer if producer is not None else tombstone_producer(settings)
    for key in keys:
        for _ in range(100):  # a full local queue: serve deliveries and retry, bounded
            try:
                producer.produce(topic, key=key.encode(), value=None, partition=partition,
                                 on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.1)
        else:
            raise EraseError(f"the local produce queue stayed full while tombstoning {key}")
        producer.poll(0)
    left = producer.flush(timeout_s)
    if left or errors:
        raise EraseError(f"{left} of {len(keys)} tombstones to {topic} unacknowledged, delivery errors: {errors[:3]}; "
                         "run erase again")


def tombstone_producer(settings: Settings) -> Producer:
    """The producer :func:`tombstone` writes through: idempotent, ``acks=all``, 5 ms linger, no topic auto-created.
    One may serve many calls (one at a time: each flushes and checks its own deliveries)."""
    return kafka.producer(settings, **{"acks": "all", "enable.idempotence": True, "linger.ms": 5,
                                       "allow.auto.create.topics": False})


def cached_results(rows: list[dict[str, Any]]) -> set[str]:
    """Digests of the run's results on ``{prefix}.payloads`` (``kafka:`` references): their Redis copies are a cache
    (``runjournal.producers.results``), deleted with the run — another run with the same text reads it again from
    its own records. Results stored by ``sha256:`` reference (before the payloads topic) live only in Redis and may
    be shared by content: those stay."""
    out = set()
    for row in rows:
        event = row.get("event")
        payload = getattr(event, "payload", None) or {}
        if str(payload.get("result_ref") or "").startswith("kafka:") and payload.get("result_digest"):
            out.add(str(payload["result_digest"]))
    return out


def delete_run_redis(settings: Settings, client: Any, partition: int, run_id: str,
                  cached: tuple[str, ...] | set[str] = ()) -> tuple[int, int]:
    """Step 4: delete the run's Redis keys and entries (memory is not touched); ``(keys deleted, entries removed)``."""
    keys = RedisKeys(settings.topic_prefix)
    inbox = ApprovalInbox(client, settings.topic_prefix)
    pipe = client.pipeline(transaction=False)  # single-key commands: a cluster pipeline routes each by its slot
    own = [keys.run(partition, run_id), keys.plan(run_id), keys.approvals(run_id), keys.signals(run_id),
           *(keys.checkpoint(run_id, kind) for kind in KINDS), *(keys.result(d) for d in sorted(cached))]
    for key in own:
        pipe.delete(key)
    pipe.srem(keys.checkpoint_threads(), run_id)
    pipe.srem(keys.runs(partition), run_id)
    pipe.srem(keys.parked(), run_id)
    pipe.hdel(keys.index(partition), run_id)  # the runs list's entry (projector/index.py)
    pipe.hdel(keys.live(partition), run_id)  # the live index's entry (a parked run has none; harmless)
    pipe.hdel(keys.control_requests(), run_id)  # an operator's request or its own wait (producers.control)
    pipe.zrem(keys.control_timers(), run_id)  # a held run's wake-up time
    for family, op in (("owned", "srem"), ("incoming", "srem"), ("assign", "lrem"), ("surrendered", "hdel")):
        for key in redis_clients.scan_keys(client, keys.instance_glob(family)):
            if op == "srem":
                pipe.srem(key, run_id)
            elif op == "hdel":
                pipe.hdel(key, run_id)
            else:
                pipe.lrem(key, 0, run_id)
    results = pipe.execute()
    deleted, entries = results[:len(own)], results[len(own):]
    pending_removed = inbox.forget(run_id)  # the inbox hash is gone: only its pending-set entries remain
    return sum(int(n) for n in deleted), sum(int(n) for n in entries) + pending_removed


def _erase_owner_memory(settings: Settings, tenant_id: str, subject: str | None, embedder: Embedder | None,
                        store: QdrantMemoryStore | None) -> tuple[int | None, str | None]:
    """Delete a subject's (tenant's) memory items for :func:`shred_keys`: ``(points deleted or None, note)``."""
    if store is not None:
        return store.delete_by_owner(tenant_id, subject), None
    if not settings.qdrant_url and not Path(settings.effective_qdrant_path).exists():
        return 0, None
    try:
        from runjournal.consumers.cognition import open_memory_reader
        from runjournal.consumers.vectors.errors import MemoryPlaneError
    except ImportError:  # memory not installed: nothing of it to delete here
        return 0, None
    # through the directory's owner (a running memory extractor), the directory itself, or the server
    reader = open_memory_reader(settings, embedder_factory=(lambda: embedder) if embedder is not None else None,
                                wait_s=10.0, keys=False)
    try:
        return reader.forget(tenant_id, subject), None
    except MemoryPlaneError as exc:
        return None, f"memory items not deleted ({type(exc).__name__}: {exc}); their sealed text is unreadable; " \
                     "run this erase again to delete the points"
    finally:
        reader.close()


def _erase_memory(settings: Settings, run_id: str, embedder: Embedder | None,
                  store: QdrantMemoryStore | None) -> tuple[int | None, str | None]:
    if store is not None:
        return store.delete_by_run(run_id), None
    if not settings.qdrant_url and not Path(settings.effective_qdrant_path).exists():
        return 0, f"no local memory store at {settings.effective_qdrant_path}"
    from runjournal.consumers.memory.store import QdrantMemoryStore
    from runjournal.consumers.vectors.embed import default_embedder
    from runjournal.consumers.vectors.errors import MemoryPlaneError, StoreLockedError

    later = "the memory extractor erases the run's items as it reads the tombstones"
    try:
        with QdrantMemoryStore.open(settings, embedder or default_embedder()) as opened:
            return opened.delete_by_run(run_id), None
    except StoreLockedError:
        return None, f"the local Qdrant directory {settings.effective_qdrant_path} is held by a running " \
                     f"memory extractor; {later}"
    except MemoryPlaneError as exc:
        return None, f"memory not erased now ({type(exc).__name__}: {exc}); {later}"

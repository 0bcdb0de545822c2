"""Archive one finished run to Parquet, verify it, then remove it from the hot stores; read it back (decision 0056).

:func:`archive_run`, in order (each step idempotent, so archiving again finishes an interrupted archive):

1. Read the run's records from its partition of the events topic, ``{prefix}.checkpoints`` and ``{prefix}.payloads``
   (``runjournal.consumers.ops.erase.run_records``; the latest record of each key, tombstones skipped). A run with
   no live event left but a manifest was archived already: go to step 6.
2. Fold the events (the reducer): a run that is not finished (SUCCEEDED, FAILED, CANCELLED) is refused
   (:class:`RunNotFinishedError`), and so is one whose owner holds a live lease (erase's check).
3. The finish time: the run's score in the due set ``rj:{P:arc}:due`` (Redis's clock when the archiver saw it
   finish), written now with Redis's ``TIME`` when absent (``ZADD NX``: a retry finds the same one). It names the
   object's date — one clock, Redis's, decides.
4. Write one Parquet file (pyarrow, through the fsspec filesystem of ``RUNJOURNAL_ARCHIVE_URL``) with a
   deterministic name: ``<root>/tenant=<tenant>/date=<yyyy-mm-dd>/p<partition>-<first offset>-<last offset>.parquet``
   (the tenant id percent-encoded, ``.`` too, so no id escapes the folder); a retried write replaces it.
   A run archived before (a manifest) keeps the rows of its previous object that are no longer live in the topics
   (keyed by source and key, a live row wins): a run continued from the archive was restored without its large
   results' chunks, which the previous object holds (decision 0058).
5. Read it back and compare the row count and the SHA-256 digest of the rows (:func:`rows_digest`); a mismatch
   raises :class:`ArchiveVerifyError` and nothing is removed. Then write the manifest
   ``<root>/runs/<sha256(run_id)>.json`` (object URL, rows, digest, tenant, agent, finish time); an older object of
   the run named in a previous manifest (more records came after the finish) is deleted after.
6. Remove the run from the hot stores — erase's steps 3 and 4 (tombstones in the three topics, the run's Redis state,
   records and index entries), never its memory items: they keep their own lifecycle, their provenance resolves to
   the archive. Last, the run leaves the due set.

Needs the ``archive`` extra (pyarrow, fsspec; s3fs for ``s3://``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from confluent_kafka import TopicPartition

from runjournal.consumers.ops.erase import (
    ERASE_MARK_MS,
    EraseError,
    cached_results,
    check_not_live,
    delete_run_redis,
    runs_records,
    tombstone,
    tombstone_producer,
)
from runjournal.consumers.ops.replay import ReplayedState, TimelineRow
from runjournal.consumers.runtime import archive_claims as claims
from runjournal.consumers.runtime.archive_claims import redis_now_ms
from runjournal.consumers.runtime.partitions import events_partition_count, range_consumer
from runjournal.core import failpoints
from runjournal.core import redis_client as redis_clients
from runjournal.core.checkpoint_records import of_thread
from runjournal.core.errors import RunjournalError
from runjournal.core.ids import RUN_ID
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.model.reducer import RunState, fold
from runjournal.producers.results import of_run
from runjournal.schemas import Event, EventType, codec_from_settings
from runjournal.schemas.keys import partition_for
from runjournal.stores.archive_objects import COLUMNS, manifest_path, rows_digest
from runjournal.stores.archive_objects import read_manifest as _read_manifest
from runjournal.stores.archive_objects import read_rows as _read_parquet
from runjournal.stores.errors import ObjectStoreUnavailableError
from runjournal.stores.object_store import filesystem, object_store_outage

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Producer
    from fsspec import AbstractFileSystem

__all__ = ["RUN_FAILURES", "ArchiveError", "ArchiveReport", "ArchiveVerifyError", "ArchivedRun", "RunErasedError",
           "RunIdReusedError", "RunNotFinishedError", "archive_run", "archive_runs", "delete_archived",
           "finish_time_ms", "manifest_path", "object_name", "read_archived", "redis_now_ms", "replay_archived",
           "rows_digest"]

T = TypeVar("T")

class ArchiveError(RunjournalError):
    """The run could not be archived (nothing was removed from the hot stores; archive again)."""


class RunNotFinishedError(ArchiveError):
    """The run is not finished (no terminal event, or resumed after one): it is never archived."""


class RunErasedError(ArchiveError):
    """The run was erased while it was archived (``rj:{P:arc}:erased`` holds it): the archive deleted its own copy
    (decision 0057); the run leaves the due set."""


class RunIdReusedError(ArchiveError):
    """The archive holds another run under this run id (its manifest names another RUN_STARTED event): the id was
    used again after the first run's claim expired (``RUNJOURNAL_RUN_ID_MEMORY_S``). Nothing is written or removed;
    the run leaves the due set and stays in the hot stores — erase one of the two, or keep run ids unique (decision
    0056)."""


class ArchiveVerifyError(ArchiveError):
    """The object read back differs from what was written (row count or digest): the run stays in the hot stores."""


@dataclass(frozen=True)
class ArchiveReport:
    """What :func:`archive_run` did."""

    run_id: str
    """The run."""
    object_url: str
    """Where the run lives now: ``file:///…/p3-10-42.parquet`` or ``s3://bucket/…``."""
    rows: int
    """Rows written (events + framework records + large results' chunks)."""
    digest: str
    """SHA-256 (hex) of the rows (:func:`rows_digest`), checked on the object read back."""
    tombstones: int
    """Tombstones written to the three topics."""
    redis_keys_deleted: int
    """Redis keys deleted (erase's step 4)."""
    already_archived: bool = False
    """The run had no live event left and a manifest: an earlier archive was finished here."""

    def as_dict(self) -> dict[str, Any]:
        """The report as a JSON-able dict."""
        return asdict(self)


@dataclass(frozen=True)
class ArchivedRun:
    """A run read back from the archive (:func:`read_archived`)."""

    manifest: dict[str, Any]
    """The run's manifest: ``run_id``, ``object_url``, ``rows``, ``digest``, ``tenant_id``, ``agent``,
    ``partition``, ``finished_ms`` (Redis's clock)."""
    rows: list[dict[str, Any]]
    """Every row, in (source, offset) order, with the columns of :data:`COLUMNS`."""

    def events(self, settings: Settings) -> list[tuple[Event, int, int]]:
        """The run's events decoded, as ``(event, partition, offset)`` in offset order (the reducer's input)."""
        codec = codec_from_settings(settings)
        return [(codec.decode(r["value"], topic=settings.events_topic, partition=r["partition"],
                              offset=r["offset"]), r["partition"], r["offset"])
                for r in self.rows if r["source"] == "events"]


def finish_time_ms(settings: Settings, client: Any, run_id: str) -> int:
    """The run's finish time in the due set (step 3), added now by Redis's clock when absent."""
    keys = RedisKeys(settings.topic_prefix)
    client.zadd(keys.archive_due(), {run_id: redis_now_ms(client)}, nx=True)
    return int(client.zscore(keys.archive_due(), run_id))


def object_name(root: str, tenant_id: str, finished_ms: int, partition: int, first: int, last: int) -> str:
    """``<root>/tenant=<tenant>/date=<yyyy-mm-dd>/p<partition>-<first>-<last>.parquet`` (step 4); the tenant id is
    percent-encoded (``/`` and ``.`` too): no id names a folder outside its own."""
    day = datetime.fromtimestamp(finished_ms / 1000, UTC).strftime("%Y-%m-%d")
    return f"{root}/tenant={_segment(tenant_id)}/date={day}/p{partition}-{first}-{last}.parquet"


def archive_run(settings: Settings, run_id: str, *, redis_client: Any = None, timeout_s: float = 30.0,
                progress: Callable[[str], None] | None = None,
                _write: Callable[..., None] | None = None) -> ArchiveReport:
    """Archive ``run_id`` (see the module docstring for the steps), then remove it from Kafka and Redis:
    :func:`archive_runs` of one run.

    Args:
        settings: the stack, prefix and ``archive_url`` (``RUNJOURNAL_ARCHIVE_URL``).
        run_id: the run.
        redis_client: default ``runjournal.core.redis_client.client(settings)``.
        timeout_s: longest read of a partition and wait for the tombstones' acknowledgements, seconds (30).
        progress: called with a sentence before each step.

    Returns:
        :class:`ArchiveReport`.

    Raises:
        InvalidIdError: ``run_id`` is not text.
        RunNotFinishedError: the run has no events, or is not finished.
        RunStillLiveError: its owner holds a live lease.
        RunReopeningError: a ``continue_run`` of the run is in flight (decision 0057).
        RunErasedError: the run was erased meanwhile; this archive's copy was deleted (decision 0057).
        ObjectStoreUnavailableError: the object store did not answer (the one failure policy waits it out).
        ArchiveVerifyError: the object read back differs (nothing removed).
        ObjectStoreError: the archive's backend is unknown or not installed.
        EraseError: a partition could not be read, or a tombstone was not acknowledged.
    """
    outcome = archive_runs(settings, [run_id], redis_client=redis_client, timeout_s=timeout_s, progress=progress,
                           _write=_write)[run_id]
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


RUN_FAILURES: tuple[type[Exception], ...] = (ArchiveError, EraseError, claims.RunReopeningError)
"""The failures of one run's archive (:func:`archive_runs` reports them per run; nothing of that run was removed
that is not archived): not finished or erased (it leaves the due set), a verify mismatch, a live owner, a tombstone
not acknowledged, a continuation in flight (it stays due). Any other error — the object store, Redis or Kafka not
answering — stops the whole call, for the one failure policy to wait out and call again."""


def archive_runs(settings: Settings, run_ids: Sequence[str], *, redis_client: Any = None, timeout_s: float = 30.0,
                 producer: Producer | None = None, progress: Callable[[str], None] | None = None,
                 on_result: Callable[[str, ArchiveReport | Exception], None] | None = None,
                 deadline: float | None = None,
                 _write: Callable[..., None] | None = None) -> dict[str, ArchiveReport | Exception]:
    """Archive each run of ``run_ids`` as :func:`archive_run` does, reading each partition of the three topics once
    for all of them (the archiver's sweep; decision 0056 § Cost).

    Order: every run is claimed (``archiving``) and checked for a continuation in flight *before* any read, as one
    run's archive is (decision 0057: a continuation either sees the claim or has committed its RUN_RESUMED before
    the read); then, per partition, one read of the events, checkpoints and payloads partitions from their low to
    their high watermark (``runjournal.consumers.ops.erase.runs_records``); then each run in turn: fold, write,
    verify, manifest, tombstones (through ``producer``, one flush per run), Redis removal. The claims are released
    at the end, whatever happened.

    Args:
        settings: the stack, prefix and ``archive_url``.
        run_ids: the runs, in the order they are archived.
        redis_client: default ``runjournal.core.redis_client.client(settings)``.
        timeout_s: longest read of a partition and wait for one run's tombstones' acknowledgements, seconds (30).
        producer: the tombstones' producer (``runjournal.consumers.ops.erase.tombstone_producer``; a long-lived
            archiver passes its own); default a new one for this call.
        progress: called with a sentence before each step.
        on_result: called with each run's outcome as soon as it is known (a caller that is interrupted by an error
            of the whole call keeps what was done).
        deadline: a ``time.monotonic()`` instant after which no further run is started (at least one is); the runs
            not started are absent from the result.

    Returns:
        ``{run_id: ArchiveReport, or the run's own failure (one of :data:`RUN_FAILURES`)}``.

    Raises:
        InvalidIdError: a run id is not text (before anything is claimed).
        ObjectStoreUnavailableError, ObjectStoreError, redis.RedisError, KafkaException: the whole call; runs
            reported to ``on_result`` before it are done.
    """
    for run_id in run_ids:
        RUN_ID.check_lookup(run_id)
    say = progress or (lambda _text: None)
    client = redis_client if redis_client is not None else redis_clients.client(settings)
    fs, root = filesystem(settings)
    results: dict[str, ArchiveReport | Exception] = {}

    def done(run_id: str, outcome: ArchiveReport | Exception) -> None:
        results[run_id] = outcome
        if on_result is not None:
            on_result(run_id, outcome)

    held: dict[str, tuple[str, int]] = {}
    reader: Consumer | None = None
    try:
        by_partition: dict[int, list[str]] = {}
        count = events_partition_count(settings)  # once: a metadata request per run cost ~60 ms of each
        for run_id in dict.fromkeys(run_ids):
            # before the read: an erase marked after it is found after the write, and a continuation either sees
            # this claim or has committed its RUN_RESUMED before the read (decision 0057)
            held[run_id] = claims.claim(client, settings.topic_prefix, claims.ARCHIVING, run_id)
            if claims.live_claim(client, settings.topic_prefix, claims.REOPENING, run_id):
                done(run_id, claims.RunReopeningError(f"run {run_id} is being continued (continue_run): not archived "
                                                      "now; it stays due"))
                continue
            by_partition.setdefault(partition_for(run_id, count), []).append(run_id)
        started = False
        # one consumer for every read, whose fetches at a range's end do not hold its next watermark request back
        reader = range_consumer(settings, "archive-records", **{"fetch.wait.max.ms": 10}) if by_partition else None
        topics = _partitions_of(reader, settings) if reader is not None else {}
        tombstones = producer if producer is not None or not by_partition else tombstone_producer(settings)
        for partition, runs in by_partition.items():
            if started and deadline is not None and time.monotonic() > deadline:
                break
            say(f"reading the records of {len(runs)} run(s) from partition {partition}")
            read_to: dict[tuple[str, int], int] = {}
            try:
                events, others = _partition_rows(settings, partition, set(runs), timeout_s, reader, topics,
                                                 read_to)  # 1
            except EraseError as exc:
                for run_id in runs:
                    done(run_id, exc)
                continue
            assert reader is not None  # there are runs to read
            arrived = _Arrivals(settings, partition, set(runs), read_to, timeout_s, reader, topics)
            assert tombstones is not None  # there are runs to remove
            for run_id in runs:
                if started and deadline is not None and time.monotonic() > deadline:
                    break
                started = True
                try:
                    report = _archive(settings, client, fs, root, partition, run_id, held[run_id][1], timeout_s, say,
                                      _write, events.get(run_id, []), others.get(run_id, []), tombstones,
                                      arrived)
                except RUN_FAILURES as exc:
                    done(run_id, exc)
                    continue
                done(run_id, report)
    finally:
        if reader is not None:
            reader.close()
        for run_id, (token, _started_ms) in held.items():
            claims.release(client, settings.topic_prefix, claims.ARCHIVING, run_id, token)
    return results


def _archive(settings: Settings, client: Any, fs: AbstractFileSystem, root: str, partition: int, run_id: str,
             started_ms: int, timeout_s: float, say: Callable[[str], None],
             _write: Callable[..., None] | None, events: list[dict[str, Any]], others: list[dict[str, Any]],
             producer: Producer, arrived: _Arrivals) -> ArchiveReport:
    manifest, archived = _object_store(lambda: _archived_rows(fs, root, run_id))
    if manifest is not None and _covers(archived, events):
        # archived before (a kill after the write, the manifest or some tombstones; a redelivered terminal event):
        # every live event is in the object, so only the removal is left — never a fold of a partly tombstoned run
        _check_not_erased(settings, client, fs, root, run_id, manifest, started_ms)
        _check_claim_held(client, run_id, started_ms)
        arrived.check(run_id)
        return _remove(settings, client, partition, run_id, _decoded(settings, archived), others, manifest,
                       timeout_s, producer, already=True)  # 6
    if not events:
        raise RunNotFinishedError(f"run {run_id} has no events in {settings.events_topic}[{partition}] and no "
                                  "archive: nothing to archive")
    started_event = next((r["event"].event_id for r in events if r["type"] == "RUN_STARTED"), None)
    if manifest is not None and None not in (manifest.get("started_event_id"), started_event) \
            and manifest["started_event_id"] != started_event:
        raise RunIdReusedError(f"run id {run_id} names another run in the archive ({manifest['object_url']}, "
                               f"RUN_STARTED {manifest['started_event_id']}; this one's is {started_event}): the id "
                               "was used again after its claim expired; nothing was archived or removed")
    state = _finished_state(settings, run_id, events)  # 2
    check_not_live(settings, client, partition, run_id, force=False)
    finished_ms = finish_time_ms(settings, client, run_id)  # 3
    # a restored run's payload rows, gone from the topic, stay (decision 0058)
    rows = _object_store(lambda: _with_archived_rows(fs, run_id, manifest, events + others))
    path = object_name(root, state.tenant_id or "", finished_ms, partition, events[0]["offset"],
                       events[-1]["offset"])
    say(f"writing {len(rows)} rows to {_url(fs, path)}")
    _object_store(lambda: (_write or _write_parquet)(fs, path, rows))  # 4
    digest = _object_store(lambda: _verify(fs, path, rows))  # 5
    failpoints.hit("archive.after_write")
    new = {"run_id": run_id, "object_url": _url(fs, path), "object_path": path, "rows": len(rows), "digest": digest,
           "tenant_id": state.tenant_id, "agent": state.agent, "status": str(state.status), "partition": partition,
           "first_offset": events[0]["offset"], "last_offset": events[-1]["offset"], "finished_ms": finished_ms,
           "archive_started_ms": started_ms,
           "started_event_id": started_event or (manifest or {}).get("started_event_id")}
    _object_store(lambda: _write_manifest(fs, root, run_id, new))
    failpoints.hit("archive.after_manifest")
    _check_not_erased(settings, client, fs, root, run_id, new, started_ms)
    if manifest is not None and manifest.get("object_path") not in (None, path):
        old = manifest["object_path"]  # an older archive of the run, made before records came after its finish
        _object_store(lambda: fs.rm(old) if fs.exists(old) else None)
    say("tombstoning the run's keys and deleting its Redis state, records and index entries (memory is kept)")
    _check_claim_held(client, run_id, started_ms)
    arrived.check(run_id)
    return _remove(settings, client, partition, run_id, events, others, new, timeout_s, producer,
                   already=False)  # 6


class _Arrivals:
    """The records of a partition's runs that arrived after the batch read it (step 1). A run is read with the
    others of its partition, before their archives: one that got a live record since (a late event, checkpoint or
    payload) would be removed with that record left live and missing from its object. Before a run's tombstones,
    :meth:`check` reads what the three topics' partitions got since the last look (three watermark requests through
    the batch's consumer; each record that came is read once for the whole batch, the batch's own tombstones
    included) and refuses a run that got a live one (it stays due: the next sweep archives it anew). What comes
    between this look and the tombstones is not seen (milliseconds, as in the archive of one run before the
    batch)."""

    def __init__(self, settings: Settings, partition: int, run_ids: set[str], read_to: dict[tuple[str, int], int],
                 timeout_s: float, reader: Consumer, topics: dict[str, set[int]]) -> None:
        self.settings, self.partition, self.run_ids = settings, partition, run_ids
        self.read_to, self.timeout_s, self.reader, self.topics = read_to, timeout_s, reader, topics
        self.late: dict[str, int] = {}

    def check(self, run_id: str) -> None:
        """Raises ``ArchiveError`` when a live record of ``run_id`` arrived after the read (nothing removed), and
        ``EraseError`` when a partition could not be read."""
        settings = self.settings

        def an_event(key: bytes | None, _rid: str) -> bool:
            return key is not None

        for topic, mine, event_keys in ((settings.events_topic, an_event, True),
                                        (settings.checkpoints_topic, of_thread, False),
                                        (settings.payloads_topic, of_run, False)):
            start = self.read_to.get((topic, self.partition))
            if start is None:
                continue  # the topic did not exist at the read
            _low, high = self.reader.get_watermark_offsets(TopicPartition(topic, self.partition), timeout=10,
                                                           cached=False)
            if high <= start:
                continue  # nothing came since
            _seen, latest = runs_records(settings, topic, self.partition, self.run_ids, mine, timeout_s=self.timeout_s,
                                         event_keys=event_keys, start=start, read_to=self.read_to,
                                         consumer=self.reader, partitions=self.topics.get(topic, set()))
            for run, records in latest.items():
                live = sum(1 for _offset, value in records.values() if value is not None)
                if live:
                    self.late[run] = self.late.get(run, 0) + live
        if self.late.get(run_id):
            raise ArchiveError(f"{self.late[run_id]} record(s) of run {run_id} arrived after it was read: nothing "
                               "removed; it stays due and is archived anew")


def _check_claim_held(client: Any, run_id: str, started_ms: int) -> None:
    """Before the tombstones: an archive that has run for half of ``CLAIM_MS`` (a pause) may have lost its claim to
    a continuation; it removes nothing and the run stays due (decision 0057)."""
    took = redis_now_ms(client) - started_ms
    if took >= claims.CLAIM_MS // 2:
        raise ArchiveError(f"archiving run {run_id} took {took / 1000:.0f} s, past half its claim "
                           f"({claims.CLAIM_MS // 2000} s): nothing removed; it stays due")


def _check_not_erased(settings: Settings, client: Any, fs: AbstractFileSystem, root: str, run_id: str,
                      manifest: dict[str, Any], started_ms: int) -> None:
    """After the write (step 5): an erase of the run marked in ``rj:{P:arc}:erased`` — or an archive that took so
    long that a mark may have been trimmed — deletes this archive's object and manifest and raises
    :class:`RunErasedError` (decision 0057: the erase deletes what was written before its mark, this what came
    after)."""
    keys = RedisKeys(settings.topic_prefix)
    erased = client.zscore(keys.archive_erased(), run_id)
    took = redis_now_ms(client) - int(manifest.get("archive_started_ms") or started_ms)
    if erased is None and took < ERASE_MARK_MS // 2:
        return
    _object_store(lambda: _delete_copy(fs, root, run_id, manifest))
    if erased is None:
        raise ArchiveError(f"archiving run {run_id} took {took / 1000:.0f} s, longer than half the erase marks' "
                           f"window ({ERASE_MARK_MS // 2000} s): its copy was deleted; archive again")
    raise RunErasedError(f"run {run_id} was erased while it was archived (erase began at {int(erased)} ms by "
                         "Redis's clock): the archive's copy was deleted, nothing of the run is kept")


def _delete_copy(fs: AbstractFileSystem, root: str, run_id: str, manifest: dict[str, Any]) -> None:
    path = manifest.get("object_path")
    if path and fs.exists(path):
        fs.rm(path)
    if fs.exists(manifest_path(root, run_id)):
        fs.rm(manifest_path(root, run_id))


def _archived_rows(fs: AbstractFileSystem, root: str,
                   run_id: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The run's manifest and its object's rows; ``(None, [])`` when there is none. A manifest whose object is gone
    (an erase or a deleted copy interrupted between the two deletions) is deleted too and counts as none."""
    manifest = _read_manifest(fs, root, run_id)
    if manifest is None:
        return None, []
    if not fs.exists(manifest["object_path"]):
        fs.rm(manifest_path(root, run_id))
        return None, []
    return manifest, _read_parquet(fs, manifest["object_path"])


def _covers(archived: list[dict[str, Any]], events: list[dict[str, Any]]) -> bool:
    """True when every live event row (key at its offset) is in the archived rows."""
    have = {(r["key"], r["offset"]) for r in archived if r["source"] == "events"}
    return all((r["key"], r["offset"]) in have for r in events)


def _decoded(settings: Settings, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Archived event rows with their decoded ``event`` (what :func:`cached_results` reads)."""
    codec = codec_from_settings(settings)
    return [{**r, "event": codec.decode(r["value"], topic=settings.events_topic, partition=r["partition"],
                                        offset=r["offset"])}
            for r in rows if r["source"] == "events"]


def _object_store(work: Callable[[], T]) -> T:
    """Run one object-store operation; a failure of the store's transport (refused, reset, timed out, a 5xx) is
    :class:`ObjectStoreUnavailableError` — the one failure policy waits it out and removes nothing meanwhile — and
    a refusal (no such bucket, access denied) stays what it is."""
    try:
        return work()
    except (ArchiveError, FileNotFoundError, PermissionError):
        raise
    except Exception as exc:
        if object_store_outage(exc):
            raise ObjectStoreUnavailableError(f"the archive's object store is unavailable: {exc!r}") from exc
        raise


def read_archived(settings: Settings, run_id: str) -> ArchivedRun | None:
    """The archived run (manifest and rows), or None when the archive has no manifest for ``run_id``.

    Raises:
        ArchiveVerifyError: the object's rows do not match the manifest's count and digest.
        ObjectStoreError: the archive's backend is unknown or not installed.
    """
    RUN_ID.check_lookup(run_id)
    fs, root = filesystem(settings)
    manifest = _read_manifest(fs, root, run_id)
    if manifest is None:
        return None
    rows = _read_parquet(fs, manifest["object_path"])
    if len(rows) != manifest["rows"] or rows_digest(rows) != manifest["digest"]:
        raise ArchiveVerifyError(f"archive of run {run_id} at {manifest['object_url']} does not match its manifest "
                                 f"({len(rows)} rows, manifest {manifest['rows']})")
    return ArchivedRun(manifest=manifest, rows=rows)


def replay_archived(settings: Settings, run_id: str, *,
                    until_seq: int | None = None) -> tuple[ReplayedState, str] | None:
    """The run's state, rebuilt from its archived events up to ``until_seq`` (``replay``, ``inspect`` of an archived
    run), and the object's URL; None when the archive does not hold the run.

    Raises:
        ArchiveVerifyError: the object does not match its manifest.
        ObjectStoreError: the archive's backend is unknown or not installed.
    """
    archived = read_archived(settings, run_id)
    if archived is None:
        return None
    events = archived.events(settings)
    state = fold(events, until_seq=until_seq, critical=settings.critical_types)
    shown = [(e, o) for e, _p, o in events if until_seq is None or e.seq <= until_seq]
    timeline = tuple(TimelineRow(offset=o, key=e.key, seq=e.seq, epoch=e.epoch, type=str(e.type),
                                 node_id=e.node_id) for e, o in shown)
    replayed = ReplayedState(run_id=run_id, partition=archived.manifest["partition"], until_seq=until_seq,
                             state=state, timeline=timeline, events=tuple(e for e, _o in shown))
    return replayed, archived.manifest["object_url"]


def delete_archived(settings: Settings, run_id: str) -> list[str]:
    """Delete the run's archive object and manifest (``erase`` of an archived run); the URLs deleted ([] none)."""
    RUN_ID.check_lookup(run_id)
    fs, root = filesystem(settings)
    manifest = _read_manifest(fs, root, run_id)
    if manifest is None:
        return []
    gone = []
    if fs.exists(manifest["object_path"]):
        fs.rm(manifest["object_path"])
        gone.append(manifest["object_url"])
    fs.rm(manifest_path(root, run_id))
    gone.append(_url(fs, manifest_path(root, run_id)))
    return gone


def _partitions_of(consumer: Consumer, settings: Settings) -> dict[str, set[int]]:
    """The partitions of the events, checkpoints and payloads topics, from one metadata request (a topic that does
    not exist — a deployment from before it — has none)."""
    meta = consumer.list_topics(timeout=10).topics  # all topics at once: one request, never an auto-creation
    return {t: set(meta[t].partitions) for t in (settings.events_topic, settings.checkpoints_topic,
                                                 settings.payloads_topic)
            if t in meta and meta[t].error is None}


def _partition_rows(settings: Settings, partition: int, run_ids: set[str], timeout_s: float, consumer: Consumer,
                    topics: dict[str, set[int]], read_to: dict[tuple[str, int], int] | None = None,
                    ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]]]:
    """Step 1 for the runs of one partition, one read of each topic's partition: ``({run: its live event rows, with
    the decoded ``event``}, {run: its live checkpoint and payload rows})``, each in offset order."""
    codec = codec_from_settings(settings)

    def an_event(key: bytes | None, _rid: str) -> bool:
        return key is not None

    _seen, latest = runs_records(settings, settings.events_topic, partition, run_ids, an_event, timeout_s=timeout_s,
                                 event_keys=True, consumer=consumer,
                                 partitions=topics.get(settings.events_topic, set()), read_to=read_to)
    events: dict[str, list[dict[str, Any]]] = {}
    for run_id, records in latest.items():
        rows = []
        for key, (offset, value) in records.items():
            if value is None:
                continue
            event = codec.decode(value, topic=settings.events_topic, partition=partition, offset=offset)
            rows.append({"source": "events", "partition": partition, "offset": offset, "key": key.decode(),
                         "type": str(event.type), "seq": event.seq, "epoch": event.epoch, "value": value,
                         "event": event})
        events[run_id] = sorted(rows, key=lambda r: r["offset"])
    others: dict[str, list[dict[str, Any]]] = {}
    for source, topic, mine in (("checkpoints", settings.checkpoints_topic, of_thread),
                                ("payloads", settings.payloads_topic, of_run)):
        _seen, latest = runs_records(settings, topic, partition, run_ids, mine, timeout_s=timeout_s,
                                     consumer=consumer, partitions=topics.get(topic, set()), read_to=read_to)
        for run_id, records in latest.items():
            others.setdefault(run_id, []).extend(
                sorted(({"source": source, "partition": partition, "offset": offset, "key": key.decode(),
                         "type": None, "seq": None, "epoch": None, "value": value}
                        for key, (offset, value) in records.items() if value is not None),
                       key=lambda r: r["offset"]))
    return events, others


def _finished_state(settings: Settings, run_id: str, events: list[dict[str, Any]]) -> RunState:
    state = fold(((r["event"], r["partition"], r["offset"]) for r in events), critical=settings.critical_types)
    if state is None or not state.terminal:
        status = "no state" if state is None else str(state.status)
        raise RunNotFinishedError(f"run {run_id} is {status}, not finished: only finished runs are archived")
    return state


_SOURCE_ORDER = {"events": 0, "checkpoints": 1, "payloads": 2}


def _with_archived_rows(fs: AbstractFileSystem, run_id: str, manifest: dict[str, Any] | None,
                        live: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``live`` plus the rows of the run's previous object (``manifest``'s) that are no longer live in the topics,
    keyed by (source, key), a live row winning; in (source, offset) order.

    A run continued from the archive was restored without its large results' records (re-publishing them would
    change the offsets their ``kafka:`` references name; decision 0058): the previous object is where they are, and
    archiving the run again must not drop them. With no previous object this is ``live`` as it was.

    Raises:
        ArchiveVerifyError: the previous object does not match its manifest (nothing is written or removed).
    """
    if manifest is None or not fs.exists(manifest["object_path"]):
        return live
    old = _read_parquet(fs, manifest["object_path"])
    if len(old) != manifest["rows"] or rows_digest(old) != manifest["digest"]:
        raise ArchiveVerifyError(f"the previous archive of run {run_id} at {manifest['object_url']} does not match "
                                 "its manifest: its rows are not carried over and nothing was removed")
    keys = {(r["source"], r["key"]) for r in live}
    carried = [r for r in old if (r["source"], r["key"]) not in keys]
    return sorted(live + carried, key=lambda r: (_SOURCE_ORDER[r["source"]], r["offset"]))


def _write_parquet(fs: AbstractFileSystem, path: str, rows: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("source", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                        ("key", pa.string()), ("type", pa.string()), ("seq", pa.int64()), ("epoch", pa.int64()),
                        ("value", pa.binary())])
    table = pa.Table.from_pylist([{c: r[c] for c in COLUMNS} for r in rows], schema=schema)
    with fs.open(path, "wb") as out:  # one object, replaced whole by a retry (same name)
        pq.write_table(table, out)


def _verify(fs: AbstractFileSystem, path: str, rows: list[dict[str, Any]]) -> str:
    digest = rows_digest(rows)
    back = _read_parquet(fs, path)
    if len(back) != len(rows) or rows_digest(back) != digest:
        raise ArchiveVerifyError(f"{path} read back holds {len(back)} rows (wrote {len(rows)}) or another digest; "
                                 "nothing was removed — archive again")
    return digest


def _write_manifest(fs: AbstractFileSystem, root: str, run_id: str, manifest: dict[str, Any]) -> None:
    with fs.open(manifest_path(root, run_id), "wb") as out:
        out.write(json.dumps(manifest, sort_keys=True).encode())


def _remove(settings: Settings, client: Any, partition: int, run_id: str, events: list[dict[str, Any]],
            others: list[dict[str, Any]], manifest: dict[str, Any], timeout_s: float, producer: Producer, *,
            already: bool) -> ArchiveReport:
    by_topic = {"events": settings.events_topic, "checkpoints": settings.checkpoints_topic,
                "payloads": settings.payloads_topic}
    rows = events + others
    for source, topic in by_topic.items():
        tombstone(settings, topic, partition, [r["key"] for r in rows if r["source"] == source], timeout_s,
                  producer=producer)
    failpoints.hit("archive.after_tombstones")
    cached = cached_results(events)
    deleted, _entries = delete_run_redis(settings, client, partition, run_id, cached)
    keys = RedisKeys(settings.topic_prefix)
    if settings.run_id_memory_s:  # the id stays claimed for a while, then Redis keeps nothing of the run
        client.pexpire(keys.claim(run_id), int(settings.run_id_memory_s * 1000))
    pipe = client.pipeline(transaction=True)  # the due set and its scope hash share the tag {P:arc}
    pipe.zrem(keys.archive_due(), run_id)
    pipe.hdel(keys.archive_runs(), run_id)
    pipe.execute()
    return ArchiveReport(run_id=run_id, object_url=manifest["object_url"], rows=manifest["rows"],
                         digest=manifest["digest"], tombstones=len(rows), redis_keys_deleted=deleted,
                         already_archived=already)


def _segment(text: str) -> str:
    return quote(text, safe="").replace(".", "%2E") or "%00"


def _url(fs: AbstractFileSystem, path: str) -> str:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return f"file://{path}" if protocol in ("file", "local") else f"{protocol}://{path}"


TERMINAL_TYPES = frozenset({EventType.RUN_SUCCEEDED, EventType.RUN_FAILED, EventType.RUN_CANCELLED})
"""The events that finish a run (the reducer's terminal statuses)."""

"""Restore an archived FAILED run to the journal, so that ``continue_run`` can continue it (decision 0058).

An archived run is gone from the topics (tombstoned) and from Redis; its events, framework records and large
results' chunks are rows of one Parquet object (decision 0056). :func:`restore_archived` puts the run back:

1. A transactional producer with the run's own ``transactional.id`` ``{prefix}.unarchive-<sha256(run_id)[:32]>``
   calls ``init_transactions``: an earlier restorer of the same run is fenced (its open transaction aborted, its
   next commit refused) or had committed — either way, what this restorer reads next is all there is.
2. Then it reads the manifest and the object (row count and digest checked). A run that did not end FAILED is
   reported and nothing is published (``continue_run`` refuses it as ``finished``).
3. Then it reads the run's partition of the events topic after the archived events' last offset (``read_committed``,
   to the high watermark): a key of the run whose latest record there is not a tombstone means the run was restored
   already (by another operator's ``continue_run``, or an interrupted one) — nothing is published again.
4. Else, in one transaction, the archived event rows to the events topic and the checkpoint rows to
   ``{prefix}.checkpoints``, with their original keys and value bytes, in their original order, to the run's own
   partition (the same partition: partitioning is by run id). The projector and the recovery job fold them as any
   records: the archive's tombstones before them erased the run, these start it again from seq 1.

Large results' chunks (``{prefix}.payloads`` rows) are *not* re-published: their ``kafka:`` references name
offsets, which a new write would change. ``ResultStore.get`` reads them from the archive when the topic no longer
holds them (``runjournal.producers.results``); archiving the run again carries them over
(``runjournal.consumers.archive.store``).

Of two restorers at once, step 1 orders them: the later one fences the earlier (whose commit then fails: it
reports ``superseded``) or finds its records in step 3. So a run is restored at most once per archive.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message

from runjournal.consumers.runtime.partitions import range_consumer, read_ranges, run_partition, watermarks
from runjournal.core import kafka
from runjournal.core.errors import RunjournalError
from runjournal.core.settings import Settings
from runjournal.model.reducer import RunStatus
from runjournal.producers.fencing import init_transactions
from runjournal.schemas.keys import run_id_of_key
from runjournal.stores.archive_objects import ArchivedObjectMismatchError, ArchivedRows, read_checked, read_manifest
from runjournal.stores.object_store import filesystem

__all__ = ["RestoreError", "Restored", "restore_archived", "unarchive_transactional_id"]


class RestoreError(RunjournalError):
    """An archived run could not be restored to the journal (nothing of it was committed; try again): the archive's
    object does not match its manifest, the run's partition cannot be read to its end, the manifest names another
    partition than the run's, or the transaction was not committed."""


@dataclass(frozen=True)
class Restored:
    """What :func:`restore_archived` found and did."""

    run_id: str
    status: str
    """The archived run's status (``FAILED``, ``SUCCEEDED``, ``CANCELLED``): only a FAILED run is restored."""
    object_url: str
    """The archived object."""
    events: int = 0
    """Event records published (0: none — not FAILED, restored already, or superseded)."""
    checkpoints: int = 0
    """Framework records published."""
    already: bool = False
    """The run's events were live in the topic already (restored by someone else, or earlier)."""
    superseded: bool = False
    """Another restorer of the same run fenced this one before its commit: it restores the run."""


def unarchive_transactional_id(settings: Settings, run_id: str) -> str:
    """``{prefix}.unarchive-<sha256(run_id) hex[:32]>``: one transactional id per run, so two restorers of one run
    fence each other and restorers of different runs never do (ACLs: the ``{prefix}.`` prefix of the agent and
    recovery roles)."""
    return f"{settings.topic_prefix}.unarchive-{hashlib.sha256(run_id.encode()).hexdigest()[:32]}"


def restore_archived(settings: Settings, run_id: str, *, timeout_s: float = 30.0) -> Restored | None:
    """Re-publish the archived run ``run_id`` to the journal when it ended FAILED (module docstring, steps 1-4).

    Args:
        settings: the stack, prefix and ``archive_url``.
        run_id: the run (its id already checked by the caller).
        timeout_s: longest ``init_transactions``, read of the partition and commit, seconds each.

    Returns:
        None when the archive holds no manifest for the run; else :class:`Restored` (``events`` > 0: published now).

    Raises:
        RestoreError: see the class; nothing of the run was committed by this call.
        ObjectStoreError: the archive's backend is unknown or not installed.
        KafkaException: the broker refused the transactional producer (e.g. the ACLs).
    """
    fs, root = filesystem(settings)
    first = read_manifest(fs, root, run_id)  # cheap: an unknown or finished run costs no producer
    if first is None:
        return None
    if str(first.get("status")) != RunStatus.FAILED.value:
        return Restored(run_id=run_id, status=str(first.get("status")), object_url=str(first["object_url"]))
    producer = kafka.producer(settings, **{"acks": "all", "enable.idempotence": True, "linger.ms": 5,
                                           "transactional.id": unarchive_transactional_id(settings, run_id)})
    try:
        init_transactions(producer, timeout_s)  # 1: fence an earlier restorer of this run, then read
        archived = _read(settings, run_id)  # 2 (again: the run may have been restored and archived since)
        if archived is None:
            return None
        manifest, rows = archived.manifest, archived.rows
        found = Restored(run_id=run_id, status=str(manifest.get("status")), object_url=str(manifest["object_url"]))
        if found.status != RunStatus.FAILED.value:
            return found
        partition = run_partition(settings, run_id)
        if int(manifest["partition"]) != partition:
            raise RestoreError(f"run {run_id} was archived from partition {manifest['partition']} of "
                               f"{settings.events_topic}, its partition is {partition} now: not restored")
        if _live(settings, partition, run_id, int(manifest["last_offset"]) + 1, timeout_s):  # 3
            return replace(found, already=True)
        events = sorted((r for r in rows if r["source"] == "events"), key=lambda r: r["offset"])
        checkpoints = sorted((r for r in rows if r["source"] == "checkpoints"), key=lambda r: r["offset"])
        try:  # 4
            producer.begin_transaction()
            for topic, batch in ((settings.events_topic, events), (settings.checkpoints_topic, checkpoints)):
                for row in batch:
                    producer.produce(topic, key=row["key"].encode(), value=row["value"], partition=partition)
                    producer.poll(0)
            producer.commit_transaction(timeout_s)
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,  # noqa: SLF001
                              KafkaError.INVALID_PRODUCER_EPOCH):
                return replace(found, superseded=True)
            _abort(producer, timeout_s)
            raise RestoreError(f"run {run_id}: the restore transaction was not committed ({err.str()}); nothing of "
                               "it is visible — continue it again") from exc
        return replace(found, events=len(events), checkpoints=len(checkpoints))
    finally:
        _close(producer)


def _read(settings: Settings, run_id: str) -> ArchivedRows | None:
    try:
        return read_checked(settings, run_id)
    except ArchivedObjectMismatchError as exc:
        raise RestoreError(f"run {run_id} cannot be restored: {exc}") from exc


def _live(settings: Settings, partition: int, run_id: str, start: int, timeout_s: float) -> bool:
    """True when a key of ``run_id`` has a non-tombstone latest record in ``[start, high watermark)``."""
    end = watermarks(settings, [partition], timeout_s=timeout_s)[partition][1]
    latest: dict[bytes, bool] = {}
    wanted = run_id.encode()

    def on_record(msg: Message) -> bool:
        if run_id_of_key(msg.key()) == wanted:
            latest[msg.key() or b""] = msg.value() is not None
        return True

    consumer = range_consumer(settings, "unarchive")
    try:
        unfinished = read_ranges(consumer, settings.events_topic, {partition: (start, end)}, on_record,
                                 timeout_s=timeout_s)
    finally:
        consumer.close()
    if unfinished:
        raise RestoreError(f"run {run_id}: {settings.events_topic}[{partition}] not read to offset {end} within "
                           f"{timeout_s:.0f} s (a transaction is still open): not restored — continue it again")
    return any(latest.values())


def _abort(producer: Any, timeout_s: float) -> None:
    try:
        producer.abort_transaction(timeout_s)
    except KafkaException:
        pass  # the next init_transactions of this id aborts it


def _close(producer: Any) -> None:
    """Let the producer go without raising: a fenced producer's ``flush`` raises its fatal error, which would escape
    the very branch that reports the fence (as ``ResumedPublisher.drop``)."""
    try:
        producer.purge()
        producer.flush(0)
    except (KafkaException, RuntimeError):
        pass  # nothing of it is left to send: committed, aborted, or fenced

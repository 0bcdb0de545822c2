"""The ``archiver`` fault's witnesses (decision 0056): the demo's archive read back independently of the archiver.

:func:`read_archive` reads every manifest of the demo's archive (``RUNJOURNAL_ARCHIVE_URL``, a folder in its
workdir), each object through ``read_archived`` (rows and digest checked against the manifest), and every Parquet
object in the folder; :func:`merge_events` puts an archived run's events back beside what the topic still holds, so
every check of ``runjournal.demo.verify`` (effects never twice, never dropped, outcomes, spend, acknowledgements) is
held against the archived events too; :func:`archive_checks` holds the archiver's own rules once it caught up:

* every finished run is hot (its state in Redis, its events live) or archived exactly once: one manifest whose
  object verifies, no other object in the folder holding the run's records, never lost (neither hot nor archived);
* no run is half-removed: archived with its Redis state, its due-set entry or a live event left, or with tombstoned
  events and no archive;
* no unfinished run is archived: the archived events fold to a terminal status, and the topic holds no live event of
  the run after the archived ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Message

from runjournal.consumers.archive.store import ArchiveError, read_archived
from runjournal.consumers.runtime.partitions import events_partition_count, range_consumer, read_ranges, watermarks
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.model.reducer import fold
from runjournal.schemas.keys import KeyFormatError, parse_event_key
from runjournal.stores.object_store import filesystem

__all__ = ["ArchiveView", "archive_checks", "merge_events", "read_archive"]


@dataclass
class ArchiveView:
    """What the demo's archive holds (:func:`read_archive`)."""

    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    """run id -> its manifest."""
    events: dict[str, list[tuple[Any, int, int]]] = field(default_factory=dict)
    """run id -> its archived events as ``(event, partition, offset)``, offset order."""
    objects: dict[str, set[str]] = field(default_factory=dict)
    """Every Parquet object path in the folder -> the run ids its event rows belong to."""
    unreadable: list[str] = field(default_factory=list)
    """Runs whose object does not verify against its manifest (rows, digest), or is missing: why, each."""


def read_archive(settings: Settings) -> ArchiveView:
    """Every manifest and object of ``settings``' archive.

    Raises:
        ObjectStoreError: the archive's backend is unknown or not installed.
    """
    import pyarrow.parquet as pq

    view = ArchiveView()
    fs, root = filesystem(settings)
    manifests = [p for p in fs.find(f"{root}/runs") if p.endswith(".json")] if fs.exists(f"{root}/runs") else []
    for path in manifests:
        with fs.open(path, "rb") as src:
            manifest = json.loads(src.read())
        run_id = manifest["run_id"]
        view.manifests[run_id] = manifest
        try:
            archived = read_archived(settings, run_id)
        except (ArchiveError, OSError) as exc:
            view.unreadable.append(f"{run_id}: {type(exc).__name__}: {exc}"[:300])
            continue
        if archived is not None:
            view.events[run_id] = archived.events(settings)
    for path in fs.find(root):
        if not path.endswith(".parquet"):
            continue
        with fs.open(path, "rb") as src:
            rows = pq.read_table(src, columns=["source", "key"]).to_pylist()
        view.objects[path] = {run for r in rows if r["source"] == "events" and (run := _run_of(r["key"])) is not None}
    return view


def _run_of(key: str | bytes | None) -> str | None:
    try:
        return None if key is None else parse_event_key(key.encode() if isinstance(key, str) else key).run_id
    except KeyFormatError:
        return None


def merge_events(by_run: dict[str, list[tuple[Any, int, int]]], view: ArchiveView) -> dict[str, list[tuple[Any, int,
                                                                                                             int]]]:
    """``by_run`` (the topic's events per run, tombstones left out) with each archived run's events added: one entry
    per (partition, offset), in offset order — the topic may still hold a tombstoned run's records until compaction
    drops them, or not."""
    merged = dict(by_run)
    for run_id, events in view.events.items():
        seen = {(p, o) for _e, p, o in merged.get(run_id, [])}
        merged[run_id] = sorted([*merged.get(run_id, []), *(x for x in events if (x[1], x[2]) not in seen)],
                                key=lambda x: (x[1], x[2]))
    return merged


def event_keys(settings: Settings, *, timeout_s: float = 120.0) -> dict[str, dict[str, int]]:
    """Per run, the keys of the events topic whose latest record is a value (``live``) or a tombstone
    (``tombstoned``), and the highest offset of a live one (``last_live``): a read of every partition to its end."""
    latest: dict[bytes, tuple[int, bool]] = {}

    def on_record(m: Message) -> None:
        if (key := m.key()) is not None:
            latest[key] = (int(m.offset() or 0), m.value() is not None)

    ranges = watermarks(settings, range(events_partition_count(settings)))
    consumer = range_consumer(settings, "archive-check")
    try:
        left = read_ranges(consumer, settings.events_topic, ranges, on_record, timeout_s=timeout_s)
    finally:
        consumer.close()
    if left:
        raise TimeoutError(f"could not read partitions {sorted(left)} of {settings.events_topic} to their ends")
    out: dict[str, dict[str, int]] = {}
    for key, (offset, live) in latest.items():
        run_id = _run_of(key)
        if run_id is None:
            continue
        counts = out.setdefault(run_id, {"live": 0, "tombstoned": 0, "last_live": -1})
        counts["live" if live else "tombstoned"] += 1
        if live:
            counts["last_live"] = max(counts["last_live"], offset)
    return out


def archive_checks(settings: Settings, client: Any, view: ArchiveView, run_ids: list[str],
                   hot: dict[str, Any], final: dict[str, Any] | None) -> dict[str, Any]:
    """The archiver's rules (module docstring) over ``run_ids`` (the input runs and forks), once the archiver caught up.

    Args:
        settings: the demo's settings.
        client: Redis.
        view: :func:`read_archive`.
        run_ids: every run the demo checks.
        hot: run id -> its state in the projection (None: not in Redis).
        final: the last ``runjournal archiver --until-caught-up --json`` pass (``rc``, ``stats``).

    Returns:
        ``{"runs_archived", "runs_hot", "archive_final_rc", "archived_twice", "archive_stray_objects",
        "runs_half_removed", "runs_archived_unfinished", "runs_lost", "archive_unreadable", "violations": [...],
        "ok"}``.
    """
    keys = event_keys(settings)
    due = {m.decode() if isinstance(m, bytes) else m
           for m in client.zrange(RedisKeys(settings.topic_prefix).archive_due(), 0, -1)}
    named = {m.get("object_path") for m in view.manifests.values()}
    violations: list[str] = [f"unreadable: {u}" for u in view.unreadable]
    twice, stray, half, unfinished, lost = [], [], [], [], []
    holders: dict[str, list[str]] = {}
    for path, runs in view.objects.items():
        for run_id in runs:
            holders.setdefault(run_id, []).append(path)
        if path not in named:
            stray.append(path)
        if len(runs) != 1:
            violations.append(f"object {path} holds the events of {len(runs)} runs: {sorted(runs)[:3]}")
    for run_id in run_ids:
        manifest = view.manifests.get(run_id)
        k = keys.get(run_id, {"live": 0, "tombstoned": 0, "last_live": -1})
        if manifest is None:
            if k["tombstoned"]:
                half.append(run_id)
                violations.append(f"{run_id}: {k['tombstoned']} event key(s) tombstoned and no archive")
            elif hot.get(run_id) is None:
                lost.append(run_id)
                violations.append(f"{run_id}: neither in Redis nor in the archive")
            continue
        if len(holders.get(run_id, [])) != 1 or holders[run_id][0] != manifest.get("object_path"):
            twice.append(run_id)
            violations.append(f"{run_id}: objects holding it {holders.get(run_id, [])}, its manifest names "
                              f"{manifest.get('object_path')}")
        events = view.events.get(run_id)
        state = fold(events, critical=settings.critical_types) if events else None
        if state is None or not state.terminal or manifest.get("status") not in ("SUCCEEDED", "FAILED", "CANCELLED",
                                                                                 "RunStatus.SUCCEEDED",
                                                                                 "RunStatus.FAILED",
                                                                                 "RunStatus.CANCELLED"):
            unfinished.append(run_id)
            violations.append(f"{run_id}: archived {manifest.get('status')}, its events fold to "
                              f"{None if state is None else state.status.value}")
        if k["last_live"] > int(manifest.get("last_offset", -1)):
            unfinished.append(run_id)
            violations.append(f"{run_id}: a live event at offset {k['last_live']} after its archived last "
                              f"{manifest.get('last_offset')}")
        left = [what for what, bad in (("its Redis state", hot.get(run_id) is not None),
                                       ("its due-set entry", run_id in due),
                                       (f"{k['live']} live event key(s)", k["live"] > 0)) if bad]
        if left:
            half.append(run_id)
            violations.append(f"{run_id}: archived, still holds {', '.join(left)}")
    archived = sorted(set(run_ids) & set(view.manifests))
    return {"runs_archived": len(archived), "runs_hot": sum(1 for r in run_ids if hot.get(r) is not None),
            "archive_final_rc": None if final is None else final.get("rc"),
            "archived_twice": len(twice), "archive_stray_objects": len(stray),
            "runs_half_removed": len(set(half)), "runs_archived_unfinished": len(set(unfinished)),
            "runs_lost": len(lost), "archive_unreadable": len(view.unreadable),
            "violations": violations[:20], "stray_objects": stray[:5],
            "ok": not violations and not stray and (final is None or final.get("rc") == 0)}

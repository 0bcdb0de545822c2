"""The archiver's cost per run (issue 30, decision 0056 § Cost), on the real broker and Redis and a local folder:

* a sweep's due runs are archived with one read of each partition of the three topics, whatever their number
  (before: three reads of the whole partition per run, so archiving N runs read the live partitions 3·N times);
* two archivers of one group at once split the due runs by the partitions they are assigned: every run is archived
  by exactly one of them (before: each swept the whole due set, and a run archived by one was reported archived
  again by the other, with a second pass of reads and tombstones);
* an archived run's id stays claimed for ``RUNJOURNAL_RUN_ID_MEMORY_S`` only (before: for ever, a key per run), and
  an id used again after that is refused by the archive, never merged into the first run's object.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from runjournal.consumers.archive import Archiver, read_archived
from runjournal.consumers.archive import store as archive_store
from runjournal.consumers.archive.store import ArchiveReport, RunIdReusedError, archive_runs
from runjournal.consumers.runtime.partitions import run_partition
from runjournal.core import redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from tests.consumers.archive.test_archive import archive_settings, latest_by_key, parquet_files
from tests.support.provider import project
from tests.support.workload import publish, run_events

pytestmark = [pytest.mark.integration]


def _runs(settings: Settings, prefix: str, n: int) -> dict[str, list[Any]]:
    runs = {f"{prefix}-{i}": run_events(f"{prefix}-{i}", calls=1) for i in range(n)}
    publish(settings, [e for events in runs.values() for e in events])
    project(settings)
    return runs


def test_a_batch_of_runs_reads_each_partition_once_and_archives_each_run_whole(
        topics: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = archive_settings(topics, tmp_path / "archive", retention_s=0.05)
    runs = _runs(settings, "batch", 12)
    partitions = {run_partition(settings, r) for r in runs}
    assert len(partitions) > 1, "the runs cover several partitions"
    reads: Counter[tuple[str, int]] = Counter()
    real = archive_store.runs_records

    def counted(settings: Settings, topic: str, partition: int, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("start") is None:  # a whole partition (not the look at what came after it, before tombstones)
            reads[(topic, partition)] += 1
        return real(settings, topic, partition, *args, **kwargs)

    monkeypatch.setattr(archive_store, "runs_records", counted)
    done: list[str] = []
    outcomes = archive_runs(settings, list(runs), on_result=lambda run_id, _o: done.append(run_id))

    assert sorted(done) == sorted(runs)
    assert all(isinstance(o, ArchiveReport) and not o.already_archived for o in outcomes.values()), outcomes
    assert set(reads.values()) == {1}, reads
    assert set(reads) == {(t, p) for p in partitions
                          for t in (settings.events_topic, settings.checkpoints_topic, settings.payloads_topic)}
    latest = latest_by_key(settings)
    for run_id, events in runs.items():
        assert all(latest[e.key] is None for e in events), f"{run_id}: every event key tombstoned"
        archived = read_archived(settings, run_id)
        assert archived is not None and archived.manifest["rows"] == len(events)
    assert len(parquet_files(tmp_path / "archive")) == len(runs)


def test_a_deadline_stops_a_batch_between_runs_and_releases_every_claim(topics: Settings, tmp_path: Path) -> None:
    settings = archive_settings(topics, tmp_path / "archive", retention_s=0.05)
    runs = _runs(settings, "late", 4)
    first = archive_runs(settings, list(runs), deadline=0.0)  # past: one run at least, then no other is started
    assert len(first) == 1 and all(isinstance(o, ArchiveReport) for o in first.values()), first
    rest = archive_runs(settings, list(runs))  # the claims were released: nothing is refused as held
    assert all(isinstance(o, ArchiveReport) for o in rest.values()), rest
    assert [r for r, o in rest.items() if isinstance(o, ArchiveReport) and o.already_archived] == list(first)
    assert len(parquet_files(tmp_path / "archive")) == len(runs)


def test_two_archivers_of_one_group_split_the_due_runs_and_archive_each_once(topics: Settings,
                                                                              tmp_path: Path) -> None:
    settings = archive_settings(topics, tmp_path / "archive", retention_s=0.05)
    runs = _runs(settings, "split", 16)
    barrier = threading.Barrier(2)
    stats: dict[int, Any] = {}

    def member(i: int) -> None:
        service = Archiver(settings, sweep_interval_s=0.2)
        barrier.wait()
        stats[i] = service.run(until_caught_up=True, idle_timeout_s=120)

    threads = [threading.Thread(target=member, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert set(stats) == {0, 1}, "both members finished"
    both = stats[0].archived + stats[1].archived
    assert sorted(both) == sorted(runs), (stats[0].archived, stats[1].archived)  # each run by exactly one member
    for i in (0, 1):  # a member archives only runs of partitions it was assigned: never one of each in a partition
        mine = {run_partition(settings, r) for r in stats[i].archived}
        theirs = {run_partition(settings, r) for r in stats[1 - i].archived}
        assert not mine & theirs, (mine, theirs)
    assert len(parquet_files(tmp_path / "archive")) == len(runs)


def test_an_archived_runs_id_stays_claimed_for_the_memory_window_only(topics: Settings, tmp_path: Path) -> None:
    """Before: the run-id claim stayed for ever, the one key per archived run left in Redis (grows with history)."""
    settings = archive_settings(topics, tmp_path / "archive", retention_s=0.05, run_id_memory_s=60.0)
    runs = _runs(settings, "memo", 2)
    r, keys = redis_client.client(settings), RedisKeys(settings.topic_prefix)
    for run_id in runs:
        r.set(keys.claim(run_id), "agent-1")  # what start_run's SET NX left
    forever = settings.model_copy(update={"run_id_memory_s": 0})
    outcomes = {**archive_runs(settings, ["memo-0"]), **archive_runs(forever, ["memo-1"])}
    assert all(isinstance(o, ArchiveReport) for o in outcomes.values()), outcomes
    assert 0 < r.pttl(keys.claim("memo-0")) <= 60_000, "claimed for the window, then gone"
    assert r.pttl(keys.claim("memo-1")) == -1, "0: kept for ever"


def test_a_run_id_used_again_after_its_claim_expired_is_refused_not_merged(topics: Settings,
                                                                            tmp_path: Path) -> None:
    settings = archive_settings(topics, tmp_path / "archive", retention_s=0.05)
    first = _runs(settings, "again", 1)["again-0"]
    assert isinstance(archive_runs(settings, ["again-0"])["again-0"], ArchiveReport)
    before = read_archived(settings, "again-0")
    assert before is not None and before.manifest["started_event_id"] == first[0].event_id

    second = run_events("again-0", calls=2, rng=random.Random("another run"))  # same id, other events
    assert second[0].event_id != first[0].event_id
    publish(settings, second)
    project(settings)
    outcome = archive_runs(settings, ["again-0"])["again-0"]
    assert isinstance(outcome, RunIdReusedError), outcome
    after = read_archived(settings, "again-0")
    assert after is not None and after.manifest == before.manifest, "the first run's archive is untouched"
    latest = latest_by_key(settings)
    assert all(latest[e.key] is not None for e in second if e.key not in {x.key for x in first}), \
        "the second run stays in the hot stores"

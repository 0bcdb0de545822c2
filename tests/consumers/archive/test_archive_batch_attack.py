"""Attacks on the archiver's batch (issue 30, decision 0056 § Cost, 0057), on the real broker, Redis and a local folder.

``archive_runs`` claims every run, then reads each partition once, then archives the runs one after another: a run
that is not first in its batch is read long before its turn. These tests act on such a run *during* an earlier
run's archive (from the ``progress`` callback, so the interleaving is exact, not timed):

* ``continue_run`` of it is refused (its claim was taken before any read) and ``erase`` of it leaves no copy;
* an object-store outage in the middle of the batch: the runs done stay done, every claim is released, nothing of
  the others is removed, and a second call archives exactly the rest;
* a record of it appended after the batch's read and before its turn: it must not be removed with a live event
  its object does not hold.
"""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import pytest

from runjournal.consumers.archive import read_archived
from runjournal.consumers.archive.store import ArchiveReport, RunErasedError, archive_runs
from runjournal.consumers.runtime.partitions import run_partition
from runjournal.core import redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.producers import Journal
from runjournal.schemas import EventType
from runjournal.stores.errors import ObjectStoreUnavailableError
from tests.consumers.archive.test_archive import archive_settings, latest_by_key, parquet_files
from tests.consumers.archive.test_archive_faults import _failed_run, _resumed, ledger  # noqa: F401 - fixture
from tests.support.ledger import Ledger
from tests.support.provider import project
from tests.support.workload import publish, run_events

pytestmark = [pytest.mark.integration]


def _claims_held(settings: Settings, run_ids: list[str]) -> dict[str, int]:
    r, keys = redis_client.client(settings), RedisKeys(settings.topic_prefix)
    return {run_id: int(r.zcard(keys.archive_claim("archiving", run_id))) for run_id in run_ids}


def _same_partition(settings: Settings, prefix: str, n: int) -> list[str]:
    """``n`` run ids on one partition (so the later ones are read with the first, before their turn)."""
    first = f"{prefix}-{uuid.uuid4().hex[:6]}"
    ids = [first]
    i = 0
    while len(ids) < n:
        i += 1
        candidate = f"{first}-{i}"
        if run_partition(settings, candidate) == run_partition(settings, first):
            ids.append(candidate)
    return ids


def test_continue_and_erase_of_a_run_later_in_the_batch_meet_its_claim_and_its_mark(
        topics: Settings, tmp_path: Path, ledger: Ledger) -> None:  # noqa: F811 - the fixture
    from runjournal.consumers.ops.erase import erase_run
    from runjournal.consumers.recovery import RunNotContinuableError, continue_run

    folder = tmp_path / "archive"
    settings = archive_settings(topics, folder, retention_s=0.05)
    first, continued = _failed_run(settings, ledger), _failed_run(settings, ledger)
    erased = _failed_run(settings, ledger)
    for _ in range(12):  # on the first run's partition: read with it, before the erase (the race this is about)
        if run_partition(settings, erased) == run_partition(settings, first):
            break
        erased = _failed_run(settings, ledger)
    assert run_partition(settings, erased) == run_partition(settings, first)
    acted: dict[str, Any] = {}

    def during_first(text: str) -> None:
        if not text.startswith("writing") or acted:
            return
        acted["first_writing"] = True
        with Journal(settings, producer_id="op-batch") as journal:
            try:
                continue_run(journal, continued)
                acted["continue"] = "went through"
            except RunNotContinuableError as exc:
                acted["continue"] = exc.action
        acted["erase"] = erase_run(settings, erased, erase_memory=False)

    outcomes = archive_runs(settings, [first, continued, erased], progress=during_first)
    assert acted["continue"] == "being_archived", acted
    assert _resumed(settings, continued) == []
    assert isinstance(outcomes[first], ArchiveReport), outcomes
    assert isinstance(outcomes[continued], ArchiveReport), outcomes
    assert isinstance(outcomes[erased], RunErasedError), outcomes
    assert read_archived(settings, erased) is None, "no copy of the erased run"
    assert len(parquet_files(folder)) == 2
    assert _claims_held(settings, [first, continued, erased]) == {first: 0, continued: 0, erased: 0}


def test_an_outage_in_the_middle_of_a_batch_keeps_what_was_done_releases_every_claim_and_removes_nothing_else(
        topics: Settings, tmp_path: Path) -> None:
    from runjournal.consumers.archive.store import _write_parquet

    folder = tmp_path / "archive"
    settings = archive_settings(topics, folder, retention_s=0.05)
    runs = {r: run_events(r, calls=1) for r in (f"outage-{i}-{uuid.uuid4().hex[:4]}" for i in range(4))}
    publish(settings, [e for events in runs.values() for e in events])
    project(settings)
    writes: list[str] = []

    def flaky(fs: Any, path: str, rows: list[dict[str, Any]]) -> None:
        writes.append(path)
        if len(writes) == 2:
            raise ConnectionRefusedError("object store down")
        _write_parquet(fs, path, rows)

    done: dict[str, Any] = {}
    with pytest.raises(ObjectStoreUnavailableError):
        archive_runs(settings, list(runs), _write=flaky, on_result=done.__setitem__)
    assert len(done) == 1 and all(isinstance(o, ArchiveReport) for o in done.values()), done
    assert _claims_held(settings, list(runs)) == dict.fromkeys(runs, 0), "every claim released"
    latest = latest_by_key(settings)
    for run_id, events in runs.items():
        if run_id in done:
            assert all(latest[e.key] is None for e in events)
        else:
            assert all(latest[e.key] is not None for e in events), f"{run_id}: nothing removed"
            assert read_archived(settings, run_id) is None
    left = [r for r in runs if r not in done]
    rest = archive_runs(settings, left)
    assert sorted(rest) == sorted(left) and all(isinstance(o, ArchiveReport) for o in rest.values()), rest
    assert len(parquet_files(folder)) == len(runs)


def test_a_record_appended_to_a_later_run_after_the_batch_read_is_never_left_live_outside_its_object(
        topics: Settings, tmp_path: Path) -> None:
    folder = tmp_path / "archive"
    settings = archive_settings(topics, folder, retention_s=0.05)
    first, later = _same_partition(settings, "late", 2)
    runs = {first: run_events(first, calls=1), later: run_events(later, calls=1)}
    publish(settings, [e for events in runs.values() for e in events])
    project(settings)
    last = runs[later][-1]
    late = dataclasses.replace(last, event_id=str(uuid.uuid4()), seq=last.seq + 1, type=EventType.MESSAGE,
                               payload={"role": "assistant", "content": "late"})

    def during_first(text: str) -> None:
        if text.startswith("writing") and not during_first.__dict__.get("done"):
            during_first.__dict__["done"] = True
            publish(settings, [late])  # the first run is being written: the later one was read already

    outcomes = archive_runs(settings, [first, later], progress=during_first)
    assert isinstance(outcomes[first], ArchiveReport), outcomes
    live = latest_by_key(settings).get(late.key)
    archived = read_archived(settings, later)
    in_object = archived is not None and any(r["key"] == late.key for r in archived.rows)
    # either the later run stays (nothing removed: it is tried again) or its late event is archived and tombstoned
    assert live is None or not isinstance(outcomes[later], ArchiveReport), (outcomes[later], in_object)
    assert live is not None or in_object, "the late event was tombstoned without being archived"
    if not isinstance(outcomes[later], ArchiveReport):  # it stayed due: the next sweep archives it with the late event
        again = archive_runs(settings, [later])[later]
        assert isinstance(again, ArchiveReport) and not again.already_archived, again
        archived = read_archived(settings, later)
        assert archived is not None and any(r["key"] == late.key for r in archived.rows)
        assert latest_by_key(settings).get(late.key) is None, "tombstoned once archived"
        assert len(parquet_files(folder)) == 2, "the first object of the later run was replaced"


def test_run_ids_that_prefix_each_other_in_one_batch_each_get_exactly_their_own_records(
        topics: Settings, tmp_path: Path) -> None:
    """``r``, ``r:1``, ``r:1:1`` and ``r 1`` on one partition, in one batch: event keys ``{run}:{epoch}:{seq}``
    parse from the right, so ``r``'s event ``r:1:1`` is never ``r:1``'s, nor ``r:1:1``'s events ``r``'s."""
    folder = tmp_path / "archive"
    settings = archive_settings(topics, folder, retention_s=0.05)
    base = f"pre-{uuid.uuid4().hex[:4]}"
    wanted = [base, f"{base}:1", f"{base}:1:1", f"{base} 1", f"{base}:1:1:1"]
    runs = {r: run_events(r, calls=1 + i) for i, r in enumerate(wanted)}
    publish(settings, [e for events in runs.values() for e in events])
    project(settings)
    by_partition: dict[int, list[str]] = {}
    for r in runs:
        by_partition.setdefault(run_partition(settings, r), []).append(r)
    outcomes = archive_runs(settings, list(runs))
    assert all(isinstance(o, ArchiveReport) for o in outcomes.values()), outcomes
    for run_id, events in runs.items():
        archived = read_archived(settings, run_id)
        assert archived is not None
        assert [e.event_id for e, _p, _o in archived.events(settings)] == [e.event_id for e in events], run_id
    assert any(len(v) > 1 for v in by_partition.values()), f"some share a partition: {by_partition}"

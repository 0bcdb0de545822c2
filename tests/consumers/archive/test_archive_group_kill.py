"""Two archivers of one group, one SIGKILLed in the middle of its sweep's batch (after a run's tombstones, before
its Redis removal), the other going on (issue 30, decisions 0056 § Cost and 0057): once a third member has swept
what was left, every run is archived exactly once (one object each) and removed whole — no run half-removed, no
event left live, no Redis state, nothing left due."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from runjournal.consumers.archive import read_archived
from runjournal.consumers.runtime.partitions import run_partition
from runjournal.core import redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from tests.consumers.archive.test_archive import archive_settings, latest_by_key, parquet_files
from tests.consumers.archive.test_archive_faults import archiver, finished
from tests.support.provider import project
from tests.support.workload import publish, run_events

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_member_killed_mid_batch_leaves_no_run_half_removed_and_each_archived_once(
        topics: Settings, tmp_path: Path, service_env: dict[str, str]) -> None:
    folder = tmp_path / "archive"
    settings = archive_settings(topics, folder, retention_s=0.05)
    env = {**service_env, "RUNJOURNAL_ARCHIVE_URL": folder.as_uri(), "RUNJOURNAL_RETENTION_S": "0.05"}
    runs = {f"grp-{i}": run_events(f"grp-{i}", calls=1) for i in range(16)}
    publish(settings, [e for events in runs.values() for e in events])
    project(settings)

    dead = archiver(env, failpoint="archive.after_tombstones=1")  # killed in its batch, at the first run it removes
    time.sleep(2)  # it joins the group first: it holds partitions (and runs) when the other joins
    alive = archiver(env)
    reports: dict[str, dict] = {}
    survivor = threading.Thread(target=lambda: reports.setdefault("alive", finished(alive, timeout_s=300)))
    survivor.start()
    dead.communicate(timeout=300)
    assert dead.returncode == -signal.SIGKILL, dead.returncode
    survivor.join(310)
    assert "alive" in reports, "the other member finished"
    rest = finished(archiver(env), timeout_s=300)  # what the dead member's partitions still held

    twice = set(reports["alive"]["archived"]) & set(rest["archived"])
    assert not twice, f"reported archived by two members: {twice}"
    assert len(parquet_files(folder)) == len(runs), "one object per run"
    r, keys = redis_client.client(settings), RedisKeys(settings.topic_prefix)
    latest = latest_by_key(settings)
    for run_id, events in runs.items():
        archived = read_archived(settings, run_id)
        assert archived is not None and archived.manifest["rows"] == len(events), run_id
        assert all(latest[e.key] is None for e in events), f"{run_id}: an event left live"
        assert r.exists(keys.run(run_partition(settings, run_id), run_id)) == 0, f"{run_id}: Redis state left"
    assert r.zcard(keys.archive_due()) == 0, r.zrange(keys.archive_due(), 0, -1)

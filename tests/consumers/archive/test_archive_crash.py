"""The archiver SIGKILLed at each step of archiving a run (``archive.after_write``, ``after_manifest``,
``after_tombstones``: the failpoints the campaign's ``archiver`` fault arms), then run again: the next pass finishes
the archive — one object, one manifest that verifies, every key tombstoned, the Redis state and due-set entry gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from runjournal.consumers.archive import read_archived
from runjournal.consumers.projector.store import ProjectionStore
from runjournal.consumers.runtime.partitions import run_partition
from runjournal.core import redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from tests.consumers.archive.test_archive import latest_by_key, parquet_files
from tests.support.provider import project
from tests.support.workload import publish, run_events

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.slow]


@pytest.mark.parametrize("failpoint", ["archive.after_write", "archive.after_manifest", "archive.after_tombstones"])
def test_an_archiver_killed_at_a_step_is_finished_by_the_next_pass(topics: Settings, service_env: dict[str, str],
                                                                   tmp_path: Path, failpoint: str) -> None:
    folder = tmp_path / "archive"
    settings = topics.model_copy(update={"archive_url": folder.as_uri(), "retention_s": 0.001})
    env = {**service_env, "RUNJOURNAL_ARCHIVE_URL": folder.as_uri(), "RUNJOURNAL_RETENTION_S": "0.001"}
    run_id = f"crash-{failpoint.rsplit('.', 1)[1]}"
    events = run_events(run_id, calls=2)
    publish(settings, events)
    project(settings)
    r, keys = redis_client.client(settings), RedisKeys(settings.topic_prefix)
    partition = run_partition(settings, run_id)

    def archiver(**more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "runjournal", "archiver", "--until-caught-up", "--sweep-interval",
                               "0.2", "--json"], env={**env, **more}, capture_output=True, text=True, timeout=180,
                              check=False, cwd=os.getcwd())

    died = archiver(RJ_FAILPOINTS=f"{failpoint}=1")
    assert died.returncode == -signal.SIGKILL, (died.returncode, died.stderr[-2000:])
    assert len(parquet_files(folder)) == 1  # the object is written and verified at each step
    removed = failpoint == "archive.after_tombstones"
    live = [k for k, v in latest_by_key(settings).items() if v is not None and run_id in k]
    assert bool(live) is not removed  # tombstones only at the last step
    assert (read_archived(settings, run_id) is None) is (failpoint == "archive.after_write")  # no manifest yet
    assert r.zscore(keys.archive_due(), run_id) is not None  # still due: the next pass finishes it
    assert ProjectionStore(r, settings.topic_prefix).get(partition, run_id) is not None  # Redis removal is last

    again = archiver()
    assert again.returncode == 0, again.stderr[-2000:]
    archived = read_archived(settings, run_id)  # rows and digest checked against the manifest
    assert archived is not None and len([x for x in archived.rows if x["source"] == "events"]) == len(events)
    assert [str(p) for p in parquet_files(folder)] == [archived.manifest["object_path"]]  # one object, never two
    assert all(v is None for k, v in latest_by_key(settings).items() if run_id in k)
    assert ProjectionStore(r, settings.topic_prefix).get(partition, run_id) is None
    assert r.zscore(keys.archive_due(), run_id) is None

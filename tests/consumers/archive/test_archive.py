"""Retention and the archive (issue 30, decision 0056), on the real broker and Redis and a local folder (and, slow, a
real S3Proxy): finished runs past their retention are written to Parquet, verified, then tombstoned and removed from
Redis; an unfinished run is left alone; a retried archive leaves one object; archived runs are read back
(``inspect`` / ``replay`` name the object)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runjournal.consumers.archive import Archiver, archive_run, read_archived, replay_archived
from runjournal.consumers.archive.store import ArchiveError, RunNotFinishedError, manifest_path
from runjournal.consumers.runtime.partitions import run_partition
from runjournal.core import redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.stores.object_store import filesystem
from tests.consumers.ops.test_erase import topic_records
from tests.support.provider import project
from tests.support.workload import publish, run_events

pytestmark = [pytest.mark.integration]


def archive_settings(topics: Settings, folder: Path, **more: object) -> Settings:
    return topics.model_copy(update={"archive_url": folder.as_uri(), "retention_s": 1.0, **more})


def latest_by_key(settings: Settings) -> dict[str, bytes | None]:
    return dict(topic_records(settings))


def parquet_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.parquet"))


def test_the_archiver_archives_finished_runs_past_retention_and_leaves_the_rest(topics: Settings,
                                                                               tmp_path: Path) -> None:
    settings = archive_settings(topics, tmp_path / "archive",
                                retention_overrides={"tenant:slow": 3600.0})
    done = {"arc-1": run_events("arc-1", calls=2), "arc-2": run_events("arc-2", calls=1, tenant="a/../b")}
    unfinished = run_events("arc-open", finish=False)
    kept = run_events("arc-kept", tenant="slow")
    publish(settings, [e for events in done.values() for e in events] + unfinished + kept)
    store = project(settings)
    first = Archiver(settings, sweep_interval_s=0.2).run(until_caught_up=True)
    assert first.finished_noted == 3  # joining the group may take longer than the 1 s retention: due already
    time.sleep(1.2)
    second = Archiver(settings, sweep_interval_s=0.2).run(until_caught_up=True)
    assert second.finished_noted == 0  # the group's committed offsets: nothing read twice
    assert sorted(first.archived + second.archived) == ["arc-1", "arc-2"]

    r, keys = redis_client.client(settings), RedisKeys(settings.topic_prefix)
    latest = latest_by_key(settings)
    for run_id, events in done.items():
        assert store.get(run_partition(settings, run_id), run_id) is None  # Redis state gone
        assert all(latest[e.key] is None for e in events), "every event key's latest record is a tombstone"
        archived = read_archived(settings, run_id)
        assert archived is not None and archived.manifest["rows"] == len(events)
        assert [e.event_id for e, _p, _o in archived.events(settings)] == [e.event_id for e in events]
        found = replay_archived(settings, run_id)
        assert found is not None and str(found[0].state.status) == "SUCCEEDED"
        assert found[1].startswith("file://") and found[1].endswith(".parquet")
    assert r.zscore(keys.archive_due(), "arc-1") is None
    for run_id in ("arc-open", "arc-kept"):  # unfinished; retention of its tenant not passed
        assert store.get(run_partition(settings, run_id), run_id) is not None
        assert read_archived(settings, run_id) is None
    assert all(latest[e.key] is not None for e in unfinished + kept)
    files = parquet_files(tmp_path / "archive")
    assert len(files) == 2
    tenants = {f.parent.parent.name for f in files}
    assert tenants == {"tenant=acme", "tenant=a%2F%2E%2E%2Fb"}, "no tenant id escapes its folder"
    assert all(f.parent.name.startswith("date=") and f.name.startswith("p") for f in files)


def test_an_unfinished_run_is_never_archived(topics: Settings, tmp_path: Path) -> None:
    settings = archive_settings(topics, tmp_path / "archive")
    publish(settings, run_events("open-1", finish=False))
    with pytest.raises(RunNotFinishedError):
        archive_run(settings, "open-1")
    assert parquet_files(tmp_path / "archive") == []
    assert all(v is not None for v in latest_by_key(settings).values())


def test_a_retried_archive_replaces_its_object_and_never_duplicates(topics: Settings, tmp_path: Path) -> None:
    settings = archive_settings(topics, tmp_path / "archive")
    events = run_events("retry-1", calls=3)
    publish(settings, events)
    calls = []

    def crash_after_write(fs, path, rows):  # the object is written, then the process dies before removal
        from runjournal.consumers.archive.store import _write_parquet

        _write_parquet(fs, path, rows)
        calls.append(path)
        raise ArchiveError("simulated crash after the write")

    with pytest.raises(ArchiveError, match="simulated"):
        archive_run(settings, "retry-1", _write=crash_after_write)
    assert len(parquet_files(tmp_path / "archive")) == 1
    assert all(v is not None for v in latest_by_key(settings).values()), "nothing removed before verification"
    report = archive_run(settings, "retry-1")
    assert report.rows == len(events) and report.tombstones == len(events) and not report.already_archived
    files = parquet_files(tmp_path / "archive")
    assert [str(f) for f in files] == calls, "the retry wrote the same object name"
    again = archive_run(settings, "retry-1")  # a redelivered terminal event: the run is archived already
    assert again.already_archived and again.object_url == report.object_url
    assert parquet_files(tmp_path / "archive") == files
    fs, root = filesystem(settings)
    assert fs.exists(manifest_path(root, "retry-1"))


@pytest.mark.slow
def test_the_cli_archiver_then_inspect_and_replay_read_the_archive(topics: Settings, tmp_path: Path,
                                                                  service_env: dict[str, str]) -> None:
    folder = tmp_path / "archive"
    env = {**service_env, "RUNJOURNAL_ARCHIVE_URL": folder.as_uri(), "RUNJOURNAL_RETENTION_S": "1"}
    publish(topics, run_events("cli-arc"))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "runjournal", *args], env=env, capture_output=True, text=True,
                              timeout=180, check=False, cwd=os.getcwd())

    out = cli("archiver", "--until-caught-up", "--sweep-interval", "0.2", "--json")
    assert out.returncode == 0, out.stderr
    first = json.loads(out.stdout)
    assert first["finished_noted"] == 1
    time.sleep(1.2)
    out = cli("archiver", "--until-caught-up", "--json")
    assert out.returncode == 0, out.stderr
    assert first["archived"] + json.loads(out.stdout)["archived"] == ["cli-arc"]
    shown = cli("inspect", "cli-arc", "--json")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["archived"].startswith(folder.as_uri()) and report["state"]["status"] == "SUCCEEDED"
    assert len(report["timeline"]) == len(run_events("cli-arc"))
    replayed = cli("replay", "cli-arc", "--until-seq", "2", "--json")
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["archived"] == report["archived"]
    assert json.loads(replayed.stdout)["state"]["last_seq"] == 2
    erased = cli("erase", "cli-arc", "--yes", "--json")
    assert erased.returncode == 0, erased.stderr
    assert report["archived"] in json.loads(erased.stdout)["archive_objects_deleted"]
    assert parquet_files(folder) == []
    assert cli("inspect", "cli-arc", "--json").returncode == 1  # gone from the archive too


@pytest.mark.slow
def test_archive_to_s3_through_a_real_s3proxy(topics: Settings, tmp_path: Path) -> None:
    """The same archive on ``s3://`` against a real S3Proxy (its objects are files under its data folder)."""
    from pydantic import SecretStr

    from runjournal.core.settings import default_cache_dir
    from runjournal.deploy.object_store import ARCHIVE_BUCKET, up_object_store
    from runjournal.deploy.procs import Proc, free_port

    state: dict = {}
    up_object_store(state, tmp_path / "stack", default_cache_dir(), free_port(), timeout_s=120)
    entry = state["object_store"]
    try:
        settings = topics.model_copy(update={
            "archive_url": f"s3://{ARCHIVE_BUCKET}/{topics.topic_prefix}", "retention_s": 1.0,
            "object_store_endpoint": entry["url"], "object_store_key": entry["identity"],
            "object_store_secret": SecretStr(entry["credential"])})
        events = run_events("s3-arc", calls=2)
        publish(settings, events)
        project(settings)
        report = archive_run(settings, "s3-arc")
        assert report.object_url.startswith(f"s3://{ARCHIVE_BUCKET}/{topics.topic_prefix}/tenant=acme/date=")
        again = archive_run(settings, "s3-arc")
        assert again.already_archived
        found = replay_archived(settings, "s3-arc")
        assert found is not None and str(found[0].state.status) == "SUCCEEDED"
        on_disk = sorted((Path(entry["data"]) / ARCHIVE_BUCKET).rglob("*.parquet"))
        assert len(on_disk) == 1, on_disk
        assert all(v is None for k, v in latest_by_key(settings).items() if k.startswith("s3-arc:"))
    finally:
        proc = Proc.from_json(entry["process"])
        if proc is not None:
            proc.stop(grace_s=10)


def test_a_failed_run_continued_by_a_resume_leaves_the_due_set(topics: Settings, tmp_path: Path) -> None:
    """Reducer rule 8: a RUN_RESUMED raising the epoch of a FAILED run reopens it — the archiver takes it out of the
    due set, and archiving it by hand is refused."""
    import uuid
    from datetime import timedelta

    from runjournal.schemas import Event, EventType

    settings = archive_settings(topics, tmp_path / "archive", retention_s=3600.0)
    events = run_events("reopen-1", finish=False)
    last = events[-1]

    def ev(seq: int, epoch: int, kind: EventType, payload: dict) -> Event:
        return Event(event_id=str(uuid.uuid4()), run_id="reopen-1", tenant_id="acme", seq=seq, epoch=epoch,
                     producer_id="agent-1", type=kind, occurred_at=last.occurred_at + timedelta(seconds=seq),
                     payload=payload)

    failed = ev(last.seq + 1, 1, EventType.RUN_FAILED, {"error": "bad"})
    publish(settings, [*events, failed])
    Archiver(settings).run(until_caught_up=True)
    r, keys = redis_client.client(settings), RedisKeys(settings.topic_prefix)
    assert r.zscore(keys.archive_due(), "reopen-1") is not None  # finished: noted by Redis's clock
    assert json.loads(r.hget(keys.archive_runs(), "reopen-1")) == {"tenant_id": "acme", "agent": "airline"}
    publish(settings, [ev(last.seq + 2, 2, EventType.RUN_RESUMED, {"previous_epoch": 1, "recovered_by": "rec",
                                                                   "plan_json": "{}", "assigned_to": "agent-2"})])
    Archiver(settings).run(until_caught_up=True)
    assert r.zscore(keys.archive_due(), "reopen-1") is None
    with pytest.raises(RunNotFinishedError):
        archive_run(settings, "reopen-1")


def test_retention_scopes_most_specific_wins_and_bad_ones_are_named() -> None:
    from runjournal.core.errors import ConfigError

    s = Settings.load(retention_s=60, retention_overrides={"tenant:a": 10, "agent:x": 0, "tenant:a/agent:y": 5})
    assert s.retention_for("a", "y") == 5 and s.retention_for("a", "x") is None  # agent:x = forever
    assert s.retention_for("a", "z") == 10 and s.retention_for("b", "z") == 60
    assert Settings.load().retention_for("a", "y") is None  # the default: forever
    with pytest.raises(ConfigError, match="RETENTION_OVERRIDES.*unknown scope"):
        Settings.load(retention_overrides={"team:a": 1})
    with pytest.raises(ConfigError, match="RETENTION_OVERRIDES"):
        Settings.load(retention_overrides={"tenant:a": -1})


@pytest.mark.parametrize("url", ["ftp://somewhere/archive", "s3://"])
@pytest.mark.parametrize("command", [["inspect", "no-such-run"], ["replay", "no-such-run"],
                                     ["erase", "no-such-run", "--yes"]], ids=lambda c: c[0])
def test_a_misconfigured_archive_is_named_not_taken_for_an_empty_one(topics: Settings, service_env: dict[str, str],
                                                                     command: list[str], url: str) -> None:
    """inspect, replay and erase ask the archive for a run not in the hot stores: an archive URL they cannot use is
    an ``ObjectStoreError`` naming RUNJOURNAL_ARCHIVE_URL (exit 1) — never "not found" (for erase: an archived copy
    left behind while the erase reports success)."""
    env = {**service_env, "RUNJOURNAL_ARCHIVE_URL": url}
    out = subprocess.run([sys.executable, "-m", "runjournal", *command, "--json"], env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 1 and out.stdout.strip() == "", (out.returncode, out.stdout, out.stderr[-1500:])
    doc = json.loads(out.stderr.strip().splitlines()[-1])
    assert doc["error"] == "ObjectStoreError" and "RUNJOURNAL_ARCHIVE_URL" in doc["message"], doc


def test_a_sweep_has_a_time_budget_and_until_caught_up_sweeps_every_due_run(topics: Settings, tmp_path: Path) -> None:
    """With a budget of 0 s each sweep archives one run, then the consumer is polled again; ``until_caught_up`` still
    archives every due run (before: one sweep ran the whole backlog inside the poll loop, past the idle timeout and
    the consumer's ``max.poll.interval.ms``)."""
    settings = archive_settings(topics, tmp_path / "archive", retention_s=0.05)
    publish(settings, [e for i in range(3) for e in run_events(f"budget-{i}")])
    project(settings)
    service = Archiver(settings, sweep_interval_s=0.2, sweep_budget_s=0.0)
    first = service.run(until_caught_up=True)
    time.sleep(0.1)
    second = Archiver(settings, sweep_interval_s=0.2, sweep_budget_s=0.0).run(until_caught_up=True)
    assert sorted(first.archived + second.archived) == ["budget-0", "budget-1", "budget-2"]
    assert len(parquet_files(tmp_path / "archive")) == 3
    if first.archived:  # one run per sweep: as many sweeps at least as runs archived
        sweeps = service.metrics.registry.get_sample_value("runjournal_archive_sweep_seconds_count")
        assert sweeps is not None and sweeps >= len(first.archived)

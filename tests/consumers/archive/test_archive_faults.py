"""The archiver's faults (issue 30; decisions 0056 and 0057), on the real broker, Redis and (outage) S3Proxy:

* the archiver SIGKILLed at each step (object written; manifest written; tombstones written, Redis not yet
  removed) and started again: the run is archived once (one object), and removed whole (no event left live, no
  Redis state, no cached result) — never half-removed, never refused as "not finished";
* a run whose tombstones were only partly written when the archiver died: the restart finishes the removal from the
  archive it wrote (before: it folded the partly tombstoned run, refused it and left it half-removed forever);
* a run erased while it is archived (the archiver SIGSTOPped after its write, before and after its manifest): no
  copy of the erased run is left in the archive (before: the archive kept a copy while erase reported success);
* the object store unavailable for a while: the archiver waits, removes nothing, and archives once it is back.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis

from runjournal.consumers.archive import Archiver, read_archived
from runjournal.consumers.archive.store import manifest_path
from runjournal.consumers.ops.erase import tombstone
from runjournal.consumers.runtime.partitions import run_partition
from runjournal.core import redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.producers import Journal
from runjournal.schemas import Event, EventType
from runjournal.stores.object_store import filesystem
from tests.consumers.archive.test_archive import archive_settings, latest_by_key, parquet_files
from tests.support.ledger import Ledger, LedgerTool
from tests.support.provider import project
from tests.support.readback import events_of, read_committed
from tests.support.workload import publish, run_events

pytestmark = [pytest.mark.integration, pytest.mark.slow]

POINTS = ("archive.after_write", "archive.after_manifest", "archive.after_tombstones")


def with_cached_result(events: list[Event]) -> tuple[list[Event], str]:
    """The run's first commit made to name a large result on the payloads topic (``kafka:`` reference): its Redis
    copy is a cache the archive's removal deletes."""
    digest = "ab" * 32
    out = []
    for e in events:
        if e.type is EventType.TOOL_CALL_COMMITTED and not any(o.payload.get("result_ref") for o in out):
            e = dataclasses.replace(e, payload={**e.payload, "result_json": None,
                                                "result_ref": f"kafka:0:0:0:1:p1:{digest}", "result_digest": digest})
        out.append(e)
    return out, digest


def archiver(env: dict[str, str], *, failpoint: str | None = None) -> subprocess.Popen[str]:
    env = {**env, "RJ_FAILPOINTS": failpoint} if failpoint else env
    return subprocess.Popen([sys.executable, "-m", "runjournal", "archiver", "--until-caught-up",
                             "--sweep-interval", "0.2", "--json"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=os.getcwd())


def finished(proc: subprocess.Popen[str], timeout_s: float = 180) -> dict:
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out)


def stopped(proc: subprocess.Popen[str], timeout_s: float = 120) -> None:
    """Wait until ``proc`` has SIGSTOPped itself at its failpoint (state ``T`` in /proc)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        if Path(f"/proc/{proc.pid}/stat").read_text().split(") ")[1].startswith("T"):
            return
        time.sleep(0.1)
    raise AssertionError("the archiver never reached its failpoint")


def assert_archived_once_and_removed(settings: Settings, run_id: str, events: list[Event], folder: Path) -> None:
    r, keys = redis_client.client(settings), RedisKeys(settings.topic_prefix)
    files = parquet_files(folder)
    assert len(files) == 1, files
    archived = read_archived(settings, run_id)
    assert archived is not None and archived.manifest["rows"] == len(events)
    assert [e.event_id for e, _p, _o in archived.events(settings)] == [e.event_id for e in events]
    latest = latest_by_key(settings)
    assert all(latest[e.key] is None for e in events), "every event key's latest record is a tombstone"
    assert r.exists(keys.run(run_partition(settings, run_id), run_id)) == 0, "the projected state is gone"
    assert r.zscore(keys.archive_due(), run_id) is None and r.hget(keys.archive_runs(), run_id) is None


@pytest.mark.parametrize("point", POINTS)
def test_the_archiver_killed_at_each_step_archives_once_and_removes_the_run_whole(
        topics: Settings, tmp_path: Path, service_env: dict[str, str], point: str) -> None:
    folder = tmp_path / "archive"
    settings = archive_settings(topics, folder, retention_s=0.05)
    env = {**service_env, "RUNJOURNAL_ARCHIVE_URL": folder.as_uri(), "RUNJOURNAL_RETENTION_S": "0.05"}
    events, digest = with_cached_result(run_events("kill-1", calls=2))
    publish(settings, events)
    project(settings)
    r, keys = redis_client.client(settings), RedisKeys(settings.topic_prefix)
    r.set(keys.result(digest), b"a cached large result")

    dead = archiver(env, failpoint=f"{point}=1")
    dead.communicate(timeout=180)
    assert dead.returncode == -signal.SIGKILL, dead.returncode
    fs, root = filesystem(settings)
    assert len(parquet_files(folder)) == 1
    assert fs.exists(manifest_path(root, "kill-1")) == (point != "archive.after_write")
    tombstoned = point == "archive.after_tombstones"
    assert all((v is None) == tombstoned for k, v in latest_by_key(settings).items()), "nothing removed before"
    assert r.exists(keys.run(run_partition(settings, "kill-1"), "kill-1")) == 1, "Redis not removed yet"

    report = finished(archiver(env))
    assert report["archived"] == ["kill-1"] and report["refused"] == []
    assert_archived_once_and_removed(settings, "kill-1", events, folder)
    assert r.exists(keys.result(digest)) == 0, "the run's cached result went with it"


def test_a_run_partly_tombstoned_when_the_archiver_died_is_removed_from_its_archive(
        topics: Settings, tmp_path: Path, service_env: dict[str, str]) -> None:
    """A SIGKILL inside the tombstones' flush leaves some of the run's events tombstoned: the restart must see that
    the live events are all in the object it wrote and finish the removal — folding what is left (no RUN_STARTED)
    would refuse the run as unfinished and leave it half-removed."""
    folder = tmp_path / "archive"
    settings = archive_settings(topics, folder, retention_s=0.05)
    env = {**service_env, "RUNJOURNAL_ARCHIVE_URL": folder.as_uri(), "RUNJOURNAL_RETENTION_S": "0.05"}
    events = run_events("half-1", calls=3)
    publish(settings, events)
    project(settings)
    dead = archiver(env, failpoint="archive.after_manifest=1")
    dead.communicate(timeout=180)
    assert dead.returncode == -signal.SIGKILL
    half = [e.key for e in events[: len(events) // 2]]  # RUN_STARTED among them
    tombstone(settings, settings.events_topic, run_partition(settings, "half-1"), half, 30)

    report = finished(archiver(env))
    assert report["archived"] == ["half-1"] and report["refused"] == []
    assert_archived_once_and_removed(settings, "half-1", events, folder)


@pytest.mark.parametrize("point", ["archive.after_write", "archive.after_manifest"])
def test_a_run_erased_while_it_is_archived_leaves_no_copy_in_the_archive(
        topics: Settings, tmp_path: Path, service_env: dict[str, str], point: str) -> None:
    """The archiver is SIGSTOPped after its write (before or after its manifest) while ``runjournal erase`` runs to
    its end; SIGCONT: whichever wrote last, no object or manifest of the erased run is left (decision 0057), and the
    run leaves the due set."""
    folder = tmp_path / "archive"
    settings = archive_settings(topics, folder, retention_s=0.05)
    env = {**service_env, "RUNJOURNAL_ARCHIVE_URL": folder.as_uri(), "RUNJOURNAL_RETENTION_S": "0.05"}
    events = run_events("erase-1", calls=2)
    publish(settings, events)
    project(settings)
    paused = archiver(env, failpoint=f"{point}=1:stop")
    try:
        stopped(paused)
        assert len(parquet_files(folder)) == 1
        erased = subprocess.run([sys.executable, "-m", "runjournal", "erase", "erase-1", "--yes", "--json"], env=env,
                                capture_output=True, text=True, timeout=180, check=False)
        assert erased.returncode == 0, erased.stderr[-3000:]
    finally:
        paused.send_signal(signal.SIGCONT)
    report = finished(paused)
    assert report["archived"] == [] and report["refused"] == ["erase-1"], report
    fs, root = filesystem(settings)
    assert parquet_files(folder) == [] and not fs.exists(manifest_path(root, "erase-1"))
    assert read_archived(settings, "erase-1") is None
    assert all(v is None for v in latest_by_key(settings).values())
    r, keys = redis_client.client(settings), RedisKeys(settings.topic_prefix)
    assert r.zscore(keys.archive_due(), "erase-1") is None
    shown = subprocess.run([sys.executable, "-m", "runjournal", "inspect", "erase-1", "--json"], env=env,
                           capture_output=True, text=True, timeout=120, check=False)
    assert shown.returncode == 1, shown.stdout


def test_the_object_store_unavailable_the_archiver_waits_and_removes_nothing(topics: Settings,
                                                                             tmp_path: Path) -> None:
    """S3Proxy stopped: the archiver's sweep meets ``ObjectStoreUnavailableError``, which the one failure policy
    waits out (the service does not stop, nothing leaves Kafka or Redis); S3Proxy back on the same port: the run is
    archived there."""
    from pydantic import SecretStr

    from runjournal.core.settings import default_cache_dir
    from runjournal.deploy.object_store import ARCHIVE_BUCKET, up_object_store
    from runjournal.deploy.procs import Proc, free_port

    state: dict = {}
    up_object_store(state, tmp_path / "stack", default_cache_dir(), free_port(), timeout_s=120)
    entry = state["object_store"]
    try:
        settings = topics.model_copy(update={
            "archive_url": f"s3://{ARCHIVE_BUCKET}/{topics.topic_prefix}", "retention_s": 0.05,
            "object_store_endpoint": entry["url"], "object_store_key": entry["identity"],
            "object_store_secret": SecretStr(entry["credential"])})
        events = run_events("outage-1", calls=2)
        publish(settings, events)
        project(settings)
        proc = Proc.from_json(entry["process"])
        assert proc is not None
        proc.stop(grace_s=10)

        service = Archiver(settings, sweep_interval_s=0.2, max_outage_s=300)
        result: dict = {}

        def run() -> None:
            try:
                result["stats"] = service.run(until_caught_up=True)
            except Exception as exc:  # noqa: BLE001 - reported by the assertions
                result["error"] = exc

        worker = threading.Thread(target=run)
        worker.start()
        deadline = time.monotonic() + 150
        while service.policy.retries < 2:  # s3fs tries for ~10 s itself before each failure reaches the policy
            assert worker.is_alive(), f"the archiver stopped instead of waiting: {result}"
            assert time.monotonic() < deadline, "the archiver never waited on the object store"
            time.sleep(0.5)
        assert worker.is_alive(), f"the archiver stopped instead of waiting: {result}"
        r, keys = redis_client.client(settings), RedisKeys(settings.topic_prefix)
        assert r.exists(keys.run(run_partition(settings, "outage-1"), "outage-1")) == 1
        assert all(v is not None for v in latest_by_key(settings).values()), "nothing removed during the outage"
        assert r.zscore(keys.archive_due(), "outage-1") is not None

        up_object_store(state, tmp_path / "stack", default_cache_dir(), free_port(), timeout_s=120)
        worker.join(240)
        assert not worker.is_alive()
        assert result["stats"].archived == ["outage-1"]
        on_disk = sorted((Path(entry["data"]) / ARCHIVE_BUCKET).rglob("*.parquet"))
        assert len(on_disk) == 1, on_disk
        assert all(v is None for v in latest_by_key(settings).values())
    finally:
        proc = Proc.from_json(state["object_store"]["process"])
        if proc is not None:
            proc.stop(grace_s=10)


# -- an archive and a continuation of one run (decision 0057: claims on {P:arc}) ---------------------------------
@pytest.fixture
def ledger(topics: Settings) -> Ledger:
    return Ledger(redis.Redis.from_url(topics.redis_url), topics.topic_prefix)


def _failed_run(settings: Settings, ledger: Ledger) -> str:
    """A real run that booked once, then failed: finished, so archivable, and continuable."""
    book = LedgerTool(ledger, name="book", result={"booking": "B1"})
    with Journal(settings, producer_id=f"first-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("t", "travel", {}, run_id=f"r-{uuid.uuid4().hex[:8]}")
        with run.node("book"):
            run.call(book, {"logical": "book"})
        run.fail("payment provider down")
    project(settings)
    return run.run_id


def _resumed(settings: Settings, run_id: str) -> list[Event]:
    return [e for e in events_of(read_committed(settings), run_id) if e.type is EventType.RUN_RESUMED]


def test_continue_run_steps_back_from_an_archive_in_flight(topics: Settings, tmp_path: Path,
                                                            service_env: dict[str, str], ledger: Ledger) -> None:
    """The archiver SIGSTOPped after its write holds its claim: ``continue_run`` is refused (``being_archived``)
    before it fences or publishes anything; SIGCONT: the run is archived whole."""
    from runjournal.consumers.recovery import RunNotContinuableError, continue_run

    folder = tmp_path / "archive"
    settings = archive_settings(topics, folder, retention_s=0.05)
    env = {**service_env, "RUNJOURNAL_ARCHIVE_URL": folder.as_uri(), "RUNJOURNAL_RETENTION_S": "0.05"}
    run_id = _failed_run(settings, ledger)
    paused = archiver(env, failpoint="archive.after_write=1:stop")
    try:
        stopped(paused)
        with Journal(settings, producer_id="operator-1") as journal, \
                pytest.raises(RunNotContinuableError) as refused:
            continue_run(journal, run_id)
        assert refused.value.action == "being_archived"
        assert _resumed(settings, run_id) == []
    finally:
        paused.send_signal(signal.SIGCONT)
    report = finished(paused)
    assert report["archived"] == [run_id]
    assert read_archived(settings, run_id) is not None


def test_the_archiver_steps_back_from_a_continuation_in_flight(topics: Settings, tmp_path: Path,
                                                                ledger: Ledger) -> None:
    """A continuation's claim held: ``archive_run`` writes nothing and removes nothing (``RunReopeningError``); the
    archiver leaves the run due and tries it at the next sweep."""
    from runjournal.consumers.archive import archive_run
    from runjournal.consumers.runtime import archive_claims as claims

    folder = tmp_path / "archive"
    settings = archive_settings(topics, folder, retention_s=0.05)
    run_id = _failed_run(settings, ledger)
    r = redis_client.client(settings)
    token, _now = claims.claim(r, settings.topic_prefix, claims.REOPENING, run_id)
    with pytest.raises(claims.RunReopeningError):
        archive_run(settings, run_id)
    assert parquet_files(folder) == [] and all(v is not None for v in latest_by_key(settings).values())
    stats = Archiver(settings, sweep_interval_s=0.2).run(until_caught_up=True)
    assert stats.retried == [run_id] and stats.archived == []
    assert r.zscore(RedisKeys(settings.topic_prefix).archive_due(), run_id) is not None, "it stays due"
    claims.release(r, settings.topic_prefix, claims.REOPENING, run_id, token)
    assert archive_run(settings, run_id).rows > 0


def test_an_archive_and_a_continuation_of_one_run_at_once_never_both_go_through(topics: Settings, tmp_path: Path,
                                                                                ledger: Ledger) -> None:
    """Both actors at once, from a barrier, five times: either the run is archived and nobody continued it (no
    RUN_RESUMED), or it was continued and nothing of it was archived or tombstoned — never a continued run whose
    history is tombstoned under it."""
    from runjournal.consumers.archive import archive_run
    from runjournal.consumers.recovery import continue_run

    settings = archive_settings(topics, tmp_path / "archive", retention_s=0.05)
    for i in range(5):
        run_id = _failed_run(settings, ledger)
        barrier = threading.Barrier(2)
        outcome: dict[str, object] = {}

        def archive(run_id: str = run_id, barrier: threading.Barrier = barrier,
                    outcome: dict[str, object] = outcome) -> None:
            barrier.wait()
            try:
                outcome["archive"] = archive_run(settings, run_id)
            except Exception as exc:  # noqa: BLE001 - judged below
                outcome["archive"] = exc

        def resume(run_id: str = run_id, barrier: threading.Barrier = barrier,
                   outcome: dict[str, object] = outcome, i: int = i) -> None:
            with Journal(settings, producer_id=f"op-{i}") as journal:
                barrier.wait()
                try:
                    handle = continue_run(journal, run_id)
                    outcome["continue"] = handle.epoch
                except Exception as exc:  # noqa: BLE001 - judged below
                    outcome["continue"] = exc

        threads = [threading.Thread(target=archive), threading.Thread(target=resume)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        archived = not isinstance(outcome["archive"], Exception)
        continued = not isinstance(outcome["continue"], Exception)
        assert not (archived and continued), outcome
        if continued:
            mine = {k: v for k, v in latest_by_key(settings).items() if k.startswith(f"{run_id}:")}
            assert mine and all(v is not None for v in mine.values()), "the continued run's history is live"
            assert read_archived(settings, run_id) is None
        else:
            assert _resumed(settings, run_id) == []


def test_an_erase_and_a_continuation_of_one_run_step_back_from_each_other(topics: Settings, tmp_path: Path,
                                                                          ledger: Ledger) -> None:
    """Decision 0057: a continuation's claim held, ``erase`` is refused before it removes anything (and leaves no
    mark); an erase begun (its mark), ``continue_run`` is refused (``erased``) before it fences or publishes."""
    from runjournal.consumers.ops.erase import RunStillLiveError, erase_run, mark_erasing
    from runjournal.consumers.recovery import RunNotContinuableError, continue_run
    from runjournal.consumers.runtime import archive_claims as claims

    settings = archive_settings(topics, tmp_path / "archive")
    r, keys = redis_client.client(settings), RedisKeys(settings.topic_prefix)
    run_id = _failed_run(settings, ledger)
    token, _now = claims.claim(r, settings.topic_prefix, claims.REOPENING, run_id)
    with pytest.raises(RunStillLiveError, match="being continued"):
        erase_run(settings, run_id, erase_memory=False)
    assert all(v is not None for v in latest_by_key(settings).values()), "nothing erased"
    assert r.zscore(keys.archive_erased(), run_id) is None
    claims.release(r, settings.topic_prefix, claims.REOPENING, run_id, token)

    mark_erasing(settings, r, run_id)
    with Journal(settings, producer_id="operator-2") as journal, pytest.raises(RunNotContinuableError) as refused:
        continue_run(journal, run_id)
    assert refused.value.action == "erased" and _resumed(settings, run_id) == []


def test_the_archiver_serves_its_metrics_and_stops_on_sigterm(topics: Settings, tmp_path: Path,
                                                              service_env: dict[str, str]) -> None:
    """``runjournal archiver --metrics-port P --metrics-addr 127.0.0.1``: /metrics has the archiver's families
    (a run archived, the due set) and the failure policy's; SIGTERM stops it with exit 0."""
    import urllib.request

    from runjournal.deploy.procs import free_port

    folder = tmp_path / "archive"
    env = {**service_env, "RUNJOURNAL_ARCHIVE_URL": folder.as_uri(), "RUNJOURNAL_RETENTION_S": "0.05"}
    publish(topics, run_events("metrics-1"))
    port = free_port()
    served = subprocess.Popen([sys.executable, "-m", "runjournal", "archiver", "--sweep-interval", "0.2",
                               "--metrics-port", str(port), "--metrics-addr", "127.0.0.1"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, body = time.monotonic() + 120, ""
        while "runjournal_archive_runs_archived_total 1.0" not in body:
            assert time.monotonic() < deadline, body[-3000:]
            assert served.poll() is None, served.communicate()[1][-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:  # noqa: S310
                    body = resp.read().decode()
            except OSError:
                pass
            time.sleep(0.3)
        assert "runjournal_archive_due_runs 0.0" in body and "runjournal_dependency_retries" in body
        assert "runjournal_archive_rows_written_total" in body
    finally:
        served.send_signal(signal.SIGTERM)
        assert served.wait(60) == 0, served.communicate()[1][-2000:]
    assert len(parquet_files(folder)) == 1

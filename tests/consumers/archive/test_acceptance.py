"""Issue 30's acceptance test: "A test journals runs, lets them age past a short retention, and shows them gone from
Redis and the topic (after compaction) and present in the archive on S3Proxy, with inspect, replay, query and erase
working on them."

Real broker and Redis, a real S3Proxy (``runjournal.deploy.object_store``, as ``stack up --object-store`` starts it),
runs written by a real ``Journal`` (two with a result over ``inline_result_bytes``: records in ``{prefix}.payloads``),
``runjournal archiver`` and the read commands as subprocesses. The events topic is made to compact within seconds
(segment.ms, min.cleanable.dirty.ratio, min.compaction.lag.ms, delete.retention.ms altered for this prefix's topic
only) and read back raw, record by record.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
from pydantic import SecretStr

from runjournal import Journal
from runjournal.consumers.runtime.partitions import run_partition
from runjournal.core import kafka, redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings, default_cache_dir
from runjournal.deploy.object_store import ARCHIVE_BUCKET, up_object_store
from runjournal.deploy.procs import Proc, free_port
from tests.support.provider import project

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BIG = 20_000
"""Characters of a large result: over the Journal's 8 KiB ``inline_result_bytes``."""


class Fetch:
    """A read-only tool: ``{"text": <size chars>}``."""

    name = "fetch"
    side_effect = False
    timeout_ms = 1000

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        return {"text": ("abcdefghij" * (args["size"] // 10 + 1))[:args["size"]]}


def journal_runs(settings: Settings, tag: str) -> dict[str, int]:
    """Three finished runs (two with a large result) and one left unfinished; run id → result size."""
    sizes = {f"acc-{tag}-big-1": BIG, f"acc-{tag}-big-2": BIG + 5, f"acc-{tag}-small": 40, f"acc-{tag}-open": 40}
    with Journal(settings, producer_id=f"acc-{tag}") as journal:
        for run_id, size in sizes.items():
            run = journal.start_run("acme", "reader", {"q": run_id}, run_id=run_id)
            with run.node("fetch"):
                run.call(Fetch(), {"size": size})
            if not run_id.endswith("-open"):
                run.succeed({"size": size})
    return sizes


def compact_quickly(settings: Settings) -> None:
    """The events topic compacts (and drops tombstones) within seconds of a segment rolling — this prefix's topic
    only: the production defaults keep a day's segment and an hour's compaction lag (``runjournal.deploy.topics``)."""
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
               for k, v in {"segment.ms": "200", "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "0",
                            "delete.retention.ms": "100"}.items()]
    admin = kafka.admin_client(settings)
    res = ConfigResource(ConfigResource.Type.TOPIC, settings.events_topic, incremental_configs=entries)
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(30)


def valued_records(settings: Settings, run_ids: set[str]) -> list[tuple[int, int, str]]:
    """``(partition, offset, key)`` of every record of the events topic, read raw (read_uncommitted, from each
    partition's log start to its end), whose key is one of ``run_ids``' and whose value is not a tombstone."""
    topic = settings.events_topic
    consumer = kafka.consumer(settings, **{"group.id": f"raw-{uuid.uuid4()}", "enable.auto.commit": False,
                                           "isolation.level": "read_uncommitted", "enable.partition.eof": True})
    found: list[tuple[int, int, str]] = []
    try:
        parts = range(settings.partitions)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                for p in parts}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts if ends[p] > 0])
        pending = {p for p in parts if ends[p] > 0}
        deadline = time.monotonic() + 60
        while pending:
            assert time.monotonic() < deadline, f"partitions {pending} not read to their end"
            for msg in consumer.consume(500, timeout=0.5):
                if msg.error() is not None:
                    if msg.error().code() == -191:  # _PARTITION_EOF
                        pending.discard(msg.partition())
                    continue
                key = (msg.key() or b"").decode()
                if msg.offset() + 1 >= ends[msg.partition()]:
                    pending.discard(msg.partition())
                if key.rsplit(":", 2)[0] in run_ids and msg.value() is not None:
                    found.append((msg.partition(), msg.offset(), key))
    finally:
        consumer.close()
    return found


def roll_segments(settings: Settings, n: int) -> None:
    """One record on every partition (a tombstone of a key no run has): the active segment, older than segment.ms,
    rolls — the cleaner never cleans the active segment."""
    producer = kafka.producer(settings)
    for p in range(settings.partitions):
        producer.produce(settings.events_topic, key=f"acc-filler-{n}:1:1".encode(), value=None, partition=p)
    assert producer.flush(30) == 0


def redis_traces(settings: Settings, run_ids: set[str]) -> list[str]:
    """Every key of the prefix naming one of ``run_ids``, and every entry of one in the runs index, run sets and
    the archive unit."""
    r, keys = redis_client.client(settings), RedisKeys(settings.topic_prefix)
    out = [k.decode() if isinstance(k, bytes) else k for pattern in keys.patterns()
           for k in redis_client.scan_keys(r, pattern)]
    traces = [k for k in out if any(run_id in k for run_id in run_ids)]
    for run_id in run_ids:
        p = run_partition(settings, run_id)
        for name, present in (("index", r.hexists(keys.index(p), run_id)), ("runs", r.sismember(keys.runs(p), run_id)),
                              ("due", r.zscore(keys.archive_due(), run_id) is not None),
                              ("scope", r.hexists(keys.archive_runs(), run_id))):
            if present:
                traces.append(f"{name}:{run_id}")
    return traces


def test_runs_past_retention_leave_redis_and_the_topic_and_stay_first_class_in_the_s3_archive(
        topics: Settings, service_env: dict[str, str], tmp_path: Path) -> None:
    state: dict[str, Any] = {}
    up_object_store(state, tmp_path / "stack", default_cache_dir(), free_port(), timeout_s=120)
    entry = state["object_store"]
    try:
        settings = topics.model_copy(update={
            "archive_url": f"s3://{ARCHIVE_BUCKET}/{topics.topic_prefix}", "object_store_endpoint": entry["url"],
            "object_store_key": entry["identity"], "object_store_secret": SecretStr(entry["credential"])})
        env = {**service_env, **settings.as_env(), "RUNJOURNAL_RETENTION_S": "1"}

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "runjournal", *args], env=env, capture_output=True,
                                  text=True, timeout=240, check=False, stdin=subprocess.DEVNULL)

        def ok(*args: str) -> Any:
            out = cli(*args)
            assert out.returncode == 0, (args, out.stdout[-2000:], out.stderr[-3000:])
            return json.loads(out.stdout)

        compact_quickly(settings)
        sizes = journal_runs(settings, uuid.uuid4().hex[:6])
        finished = {r for r in sizes if not r.endswith("-open")}
        (still_open,) = set(sizes) - finished
        project(settings)
        assert len(redis_traces(settings, finished)) >= 2 * len(finished)  # state and index entry of each
        assert {k.rsplit(":", 2)[0] for _p, _o, k in valued_records(settings, set(sizes))} == set(sizes)

        # the retention: the first pass notes the finishes by Redis's clock, the second (past 1 s) archives them
        first = ok("archiver", "--until-caught-up", "--sweep-interval", "0.2", "--json")
        assert first["finished_noted"] == len(finished), first
        time.sleep(1.2)
        second = ok("archiver", "--until-caught-up", "--json")
        assert sorted(first["archived"] + second["archived"]) == sorted(finished), (first, second)

        # gone from Redis: no state, record, index or run-set entry, no due entry — only each run id's claim stays (a
        # run id is used once: erase's rule too, so a new run can never take an archived run's id and manifest); the
        # unfinished run is untouched
        keys = RedisKeys(settings.topic_prefix)
        assert sorted(redis_traces(settings, finished)) == sorted(keys.claim(r) for r in finished)
        assert redis_traces(settings, {still_open})

        # present in the archive on S3Proxy: one Parquet object and one manifest per run (files in its data folder)
        bucket = Path(entry["data"]) / ARCHIVE_BUCKET
        objects = sorted(bucket.rglob("*.parquet"))
        manifests = sorted(bucket.rglob("runs/*.json"))
        assert len(objects) == len(manifests) == len(finished), (objects, manifests)
        assert all("tenant=acme" in str(o) for o in objects)

        # gone from the topic after compaction: no record with a value for their keys, read raw
        deadline, n = time.monotonic() + 150, 0
        while (left := valued_records(settings, finished)) and time.monotonic() < deadline:
            n += 1
            roll_segments(settings, n)
            time.sleep(3)
        assert left == [], f"{len(left)} records with a value still in {settings.events_topic}: {left[:5]}"
        assert {k.rsplit(":", 2)[0] for _p, _o, k in valued_records(settings, {still_open})} == {still_open}

        # first-class: inspect, replay and query read the archive; erase removes the object and manifest
        for run_id in sorted(finished):
            shown = ok("inspect", run_id, "--json")
            assert shown["archived"].startswith(f"s3://{ARCHIVE_BUCKET}/{topics.topic_prefix}/tenant=acme/date=")
            assert shown["state"]["status"] == "SUCCEEDED"
            assert json.loads(shown["state"]["output_json"]) == {"size": sizes[run_id]}
            (record,) = shown["state"]["records"].values()
            assert record["status"] == "COMMITTED" and record["tool"] == "fetch"
            replayed = ok("replay", run_id, "--until-seq", "2", "--json")
            assert replayed["archived"] == shown["archived"] and replayed["state"]["last_seq"] == 2
        names = ", ".join(f"'{r}'" for r in sorted(finished))
        rows = ok("query", f"SELECT run_id, status, location, archived_url FROM runs WHERE run_id IN ({names}) "
                           "ORDER BY run_id", "--json")
        assert [(r["run_id"], r["status"], r["location"]) for r in rows] == [(r, "SUCCEEDED", "archive")
                                                                           for r in sorted(finished)]
        counted = ok("query", f"SELECT run_id, count(*) AS n FROM events WHERE run_id IN ({names}) GROUP BY run_id "
                              "ORDER BY run_id", "--json")
        assert [c["n"] for c in counted] == [shown_events(ok, r) for r in sorted(finished)]
        big = sorted(r for r in finished if sizes[r] > 8192)[0]
        erased = ok("erase", big, "--yes", "--json")
        url = next(r["archived_url"] for r in rows if r["run_id"] == big)
        assert url in erased["archive_objects_deleted"]
        assert any(u.endswith(".json") for u in erased["archive_objects_deleted"]), erased
        assert len(sorted(bucket.rglob("*.parquet"))) == len(sorted(bucket.rglob("runs/*.json"))) == len(finished) - 1
        gone = cli("inspect", big, "--json")
        assert gone.returncode == 1, gone.stdout[-1000:]
        assert ok("query", f"SELECT count(*) AS n FROM runs WHERE run_id = '{big}'", "--json") == [{"n": 0}]
    finally:
        proc = Proc.from_json(entry["process"])
        if proc is not None:
            proc.stop(grace_s=10)


def shown_events(ok: Any, run_id: str) -> int:
    """The number of events ``runjournal inspect`` shows for an archived run (its timeline)."""
    return len(ok("inspect", run_id, "--json")["timeline"])

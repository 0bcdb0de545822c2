"""Pair 15 — retention and the archive (issue 30, decision 0056): the hot stores hold the window, not the history.

Two prefixes on the same broker and Redis, the same ``runs`` complete runs of ``events_per_run`` events
(``bench._events.run_events``, interleaved as concurrent agents write them):

* **window** (ours): ``RUNJOURNAL_RETENTION_S`` = ``retention_s`` (short) and an archive folder in the bench's
  scratch directory. The old runs (all but ``window`` of them, a fraction 1 − f) are published and projected; the
  real :class:`~runjournal.consumers.archive.Archiver` reads them to its end (notes their finish by Redis's clock);
  once ``retention_s`` has passed it runs to caught up again and archives every one of them (``archive_run``: Parquet
  object, read back and verified, manifest, tombstones in the topics, Redis state removed). Then the recent runs
  (the window, a fraction f) are published and projected, and the archiver reads them to its end (their finish is
  noted; they stay: the due set must hold exactly them at the end). The projector reads the tombstones too (as it
  would live). The two passes that only read run with no retention (the same code; a sweep finds nothing due): on a
  loaded 2-core host one pass took longer than 15 s and archived what it had just noted, a timing accident rather than
  the window; the pass that archives runs with ``retention_s``.
* **full history** (anchor): the same runs, in the same order, published and projected; no retention, no archiver
  (a deployment without retention runs none).

Both events topics get ``segment.ms=1000``, ``min.cleanable.dirty.ratio=0.01``, ``delete.retention.ms=0`` and
``min.compaction.lag.ms=0`` so that the broker's log cleaner compacts within the bench what it would compact after
days with the defaults (7-day segments, 24 h tombstone retention); one more tombstone per partition of the window
topic (of a key of an already archived run: harmless) rolls the active segment once everything is written, and the
bench waits until the partitions' sizes stop changing (the cleaner looks every 15 s), twice: the first cleaning drops
the archived runs' records and stamps their tombstones, the second (after one more roll) drops the tombstones. Rows:

* **Redis bytes**: ``MEMORY USAGE key SAMPLES 0`` summed over every key of the prefix (``RedisKeys.patterns()``: run
  states, records, indexes, the archiver's due set and scope hash). Not ``INFO memory used_memory``: the Redis is
  shared (other pairs' leftovers, other users), and its allocator's delta is not the prefix's. Goal ≤ f + 0.05.
* **Topic bytes**: the events topic's partitions' ``*.log`` segment sizes in the broker's log dir after compaction
  (what ``DescribeLogDirs`` reports; confluent-kafka 2.16's admin client has no ``describe_log_dirs``, so the files
  are read from the stack's directory). Goal ≤ f + 0.05.
* **Projector rebuild**: the prefix's projection keys wiped, a fresh group, ``Projector.run(until_caught_up=True)``
  (pair 3's :class:`~bench.projection.TimedProjector`: seconds from the first batch handled to the last write's
  end), rounds interleaved, window topic vs full-history topic. Goal ≤ 1.5 f: the rebuild follows the window.
* **Archive throughput**: on a third prefix, ``archive_rounds`` × ``archive_runs`` complete, projected runs; per
  round ``archive_runs`` of ``archive_runs`` of them, a sweep's batch (rows/s: rows archived / wall time); anchor, same
  round: the same rows (read back from those objects, untimed) written per run with ``pa.Table.from_pylist`` +
  ``pq.write_table`` to the same filesystem (the archive's fsspec filesystem, another folder). No goal: the ratio is
  what reading, verifying and removing cost beside the write.
"""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._env import BenchEnv
from bench._events import interleave, publish_raw, run_events
from bench._model import Row, goal_met, paired_ratios, summarise
from bench._rounds import Side, progress
from bench._rounds import interleave as rounds_of
from bench.projection import TimedProjector
from runjournal.consumers.projector import Projector
from runjournal.consumers.projector.store import ProjectionStore
from runjournal.core import kafka, redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.producers import partition_for
from runjournal.schemas import Event, codec_from_settings

__all__ = ["RetentionConfig", "run_retention"]

PAIR = "15 retention"
COMPACT_FAST = {"segment.ms": "1000", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "0",
                "min.compaction.lag.ms": "0"}
"""Topic configs that let the log cleaner do within the bench what it does after days with the defaults."""


@dataclass(frozen=True)
class RetentionConfig:
    """Sizes of pair 15."""

    runs: int
    """Runs on each of the two hot topics."""
    window: int
    """Of those, the runs inside the retention window (published last, kept)."""
    archive_runs: int
    """Runs archived per round of the throughput row."""
    rounds: int
    """Measured rounds of the rebuild and throughput rows (after one warm-up)."""
    events_per_run: int = 50
    retention_s: float = 5.0
    """The window side's ``RUNJOURNAL_RETENTION_S`` for the pass that archives."""
    settle_s: float = 120.0
    """Longest wait for the log cleaner to finish, seconds."""


def _ids(rng: random.Random, n: int) -> list[str]:
    return [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(n)]


def _publish(settings: Settings, runs: list[list[Event]], seed: int) -> int:
    if not runs:
        return 0
    codec = codec_from_settings(settings)
    parts = {r[0].run_id: partition_for(r[0].run_id, settings.partitions) for r in runs}
    n, secs = publish_raw(settings.bootstrap, settings.events_topic,
                          ((e.key.encode(), codec.encode(e), parts[e.run_id])
                           for e in interleave(runs, random.Random(seed))))
    progress(f"{PAIR}: published {n:,} events of {len(runs)} runs to {settings.events_topic} in {secs:.1f} s")
    return n


def _compact_fast(settings: Settings) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in COMPACT_FAST.items()]
    admin = kafka.admin_client(settings)
    for fut in admin.incremental_alter_configs([ConfigResource(ConfigResource.Type.TOPIC, settings.events_topic,
                                                               incremental_configs=entries)]).values():
        fut.result(30)


def _project(settings: Settings) -> int:
    """The prefix's projector (its own group: it goes on from where it stopped) until caught up; records read."""
    proj = Projector(settings)
    return proj.run(until_caught_up=True).events


def _archiver(settings: Settings) -> Any:
    """The real archiver until caught up (one sweep at its start and one at its end)."""
    from runjournal.consumers.archive import Archiver

    # idle_timeout_s: the run's default (60 s) counts a sweep longer than that, with no new records, as "not caught
    # up" and raises TimeoutError — the pass that archived 160 runs at ~0.7 s each did, before a sweep read each
    # partition once for its batch (bench/README.md § Other findings; now ~30 ms a run)
    return Archiver(settings, sweep_interval_s=3600).run(until_caught_up=True, idle_timeout_s=1800)


def redis_bytes(settings: Settings) -> tuple[int, int]:
    """``(bytes, keys)``: ``MEMORY USAGE key SAMPLES 0`` summed over every key of the prefix."""
    client = redis_client.client(settings)
    keys: set[bytes] = set()
    for pattern in RedisKeys(settings.topic_prefix).patterns():
        keys.update(client.scan_iter(match=pattern, count=1000))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.memory_usage(key, samples=0)
    return sum(int(b or 0) for b in pipe.execute()), len(keys)


def _partition_dirs(env: BenchEnv, topic: str) -> list[Path]:
    roots = [env.base.stack_dir / "kafka"]
    return sorted(d for root in roots if root.is_dir() for d in root.rglob(f"{topic}-*")
                  if d.is_dir() and d.name.rsplit("-", 1)[-1].isdigit() and d.name.rsplit("-", 1)[0] == topic)


def topic_bytes(env: BenchEnv, topic: str) -> int | None:
    """Sum of the ``*.log`` segment sizes of ``topic``'s partitions in the broker's log dir; None when the log dir
    is not on this machine (a running stack started elsewhere)."""
    dirs = _partition_dirs(env, topic)
    if not dirs:
        return None
    total = 0
    for d in dirs:
        for f in d.glob("*.log"):
            try:
                total += f.stat().st_size
            except FileNotFoundError:  # the cleaner swapped a segment under us
                continue
    return total


def _settle(env: BenchEnv, topic: str, limit_s: float) -> tuple[int | None, float]:
    """Wait until ``topic``'s size has not changed for 16 s (longer than the cleaner's 15 s backoff) or ``limit_s``
    passed; ``(bytes, seconds waited)``."""
    started = time.monotonic()
    last, since = topic_bytes(env, topic), time.monotonic()
    if last is None:
        return None, 0.0
    while time.monotonic() - started < limit_s:
        time.sleep(2)
        now = topic_bytes(env, topic)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 16:
            break
    return last, time.monotonic() - started


def _roll(settings: Settings, keys_by_partition: dict[int, bytes]) -> None:
    """One more tombstone per partition (of an archived run's key: it erases nothing more) so that the active segment
    rolls (``segment.ms`` passed) and everything before it can be cleaned."""
    time.sleep(1.5)
    producer = kafka.producer(settings, **{"acks": "all", "enable.idempotence": True})
    for part, key in keys_by_partition.items():
        producer.produce(settings.events_topic, None, key, partition=part)
    if producer.flush(30):
        raise RuntimeError(f"{PAIR}: roll tombstones not acknowledged")


def rebuild_seconds(settings: Settings) -> tuple[float, int]:
    """Wipe the prefix's projection, rebuild it from the topic with a fresh group until caught up:
    ``(seconds from the first batch handled to the last write's end, records read)``."""
    ProjectionStore(redis_client.client(settings), settings.topic_prefix).wipe()
    proj = TimedProjector(settings, group_id=f"{settings.topic_prefix}.projector-{uuid.uuid4().hex[:6]}")
    stats = proj.run(until_caught_up=True)
    if proj.first is None or proj.last is None:
        raise RuntimeError(f"{PAIR}: the rebuild of {settings.events_topic} handled no record")
    return proj.last - proj.first, stats.events


def _hot_rows(env: BenchEnv, cfg: RetentionConfig) -> list[Row]:
    rng = random.Random(15)
    old_ids, recent_ids = _ids(rng, cfg.runs - cfg.window), _ids(rng, cfg.window)
    frac = cfg.window / cfg.runs
    full = env.pair_settings("ret-full")
    base = env.pair_settings("ret-window")
    kept = base.model_copy(update={"retention_s": cfg.retention_s,
                                   "archive_url": f"file://{env.work_dir / ('archive-' + base.topic_prefix)}"})
    # The passes that only read (note finish times by Redis's clock) run with no retention: on a loaded host a pass
    # can take longer than a short retention, and would archive what it has just read. The pass that archives runs
    # with the window's retention, once it has passed since the notes.
    reading = kept.model_copy(update={"retention_s": None})
    for s in (full, kept):
        _compact_fast(s)

    # full history: every run, same order
    _publish(full, [run_events(r, cfg.events_per_run) for r in old_ids], 1)
    _publish(full, [run_events(r, cfg.events_per_run) for r in recent_ids], 2)
    _project(full)

    # window: old runs, noted, past their retention, archived; then the recent runs, noted, kept
    _publish(kept, [run_events(r, cfg.events_per_run) for r in old_ids], 1)
    _project(kept)
    started = time.perf_counter()
    noted = _archiver(reading)
    progress(f"{PAIR}: the archiver noted {noted.finished_noted} finished runs in "
             f"{time.perf_counter() - started:.1f} s")
    time.sleep(cfg.retention_s + 0.5)
    started = time.perf_counter()
    swept = _archiver(kept)
    archive_s = time.perf_counter() - started
    if len(swept.archived) != len(old_ids):
        raise RuntimeError(f"{PAIR}: the archiver archived {len(swept.archived)} of {len(old_ids)} old runs")
    progress(f"{PAIR}: the archiver archived {len(old_ids)} runs in {archive_s:.1f} s "
             f"({len(old_ids) / archive_s:.1f} runs/s, consume and caught-up checks included)")
    _publish(kept, [run_events(r, cfg.events_per_run) for r in recent_ids], 2)
    _project(kept)
    started = time.perf_counter()
    recent = _archiver(reading)
    progress(f"{PAIR}: the archiver noted {recent.finished_noted} finished runs of the window in "
             f"{time.perf_counter() - started:.1f} s")
    _project(kept)  # nothing new: the tombstones were read above
    client = redis_client.client(kept)
    due = int(client.zcard(RedisKeys(kept.topic_prefix).archive_due()))
    if due != len(recent_ids):
        raise RuntimeError(f"{PAIR}: the due set holds {due} runs, expected the window's {len(recent_ids)}")

    roll_keys: dict[int, bytes] = {}
    for rid in old_ids:
        roll_keys.setdefault(partition_for(rid, kept.partitions), run_events(rid, 1)[0].key.encode())
    waited = 0.0
    for _pass in range(2):  # the first cleaning drops the archived runs' records and marks their tombstones; a
        _roll(kept, roll_keys)  # second one (new dirty bytes: this roll) drops the tombstones past delete.retention.ms
        kept_topic, secs = _settle(env, kept.events_topic, cfg.settle_s / 2)
        waited += secs
    full_topic = topic_bytes(env, full.events_topic)
    progress(f"{PAIR}: topic bytes window {kept_topic} (settled after {waited:.0f} s), full {full_topic}")
    kept_redis, kept_keys = redis_bytes(kept)
    full_redis, full_keys = redis_bytes(full)

    label_kept = f"retention {cfg.retention_s:.0f} s: {cfg.runs} runs, {cfg.window} in the window"
    label_full = f"no retention: {cfg.runs} runs"
    goal_bytes = f"≤ {frac + 0.05:.2f}×"
    rows = [Row(PAIR, "Redis bytes (MEMORY USAGE, prefix)", f"{label_kept} ({kept_keys} keys)",
                summarise([kept_redis]), f"{label_full} ({full_keys} keys)", summarise([full_redis]),
                goal=goal_bytes, met=goal_met(kept_redis / full_redis, goal_bytes),
                note=f"MEMORY USAGE SAMPLES 0 summed over the prefix's keys (states, records, indexes, the "
                     f"archiver's due set and scope hash) after the archiver archived {len(old_ids)} runs past "
                     f"their retention and kept the {cfg.window} in it; {cfg.events_per_run} events a run")]
    if kept_topic is not None and full_topic:
        rows.append(Row(PAIR, "events topic bytes after compaction", label_kept, summarise([kept_topic]),
                        label_full, summarise([full_topic]), goal=goal_bytes,
                        met=goal_met(kept_topic / full_topic, goal_bytes),
                        note=f"*.log segment sizes in the broker's log dir; topics with {COMPACT_FAST}; the window "
                             f"topic's cleaner settled after {waited:.0f} s (two rolls, each followed by sizes "
                             "unchanged for 16 s)"))
    else:
        progress(f"{PAIR}: the broker's log dir is not under {env.base.stack_dir}: no topic bytes row")

    sizes: dict[str, list[int]] = {"window": [], "full": []}

    def side(settings: Settings, label: str) -> Any:
        def once() -> float:
            secs, events = rebuild_seconds(settings)
            sizes[label].append(events)
            return secs
        return once

    res = rounds_of(PAIR, [Side("window", side(kept, "window")), Side("full", side(full, "full"))],
                    rounds=cfg.rounds)
    store = ProjectionStore(client, kept.topic_prefix)
    back = [r for r in old_ids[:50] if store.get(partition_for(r, kept.partitions), r) is not None]
    if back:
        raise RuntimeError(f"{PAIR}: the rebuild brought {len(back)} archived runs back into Redis")
    goal_rebuild = f"≤ {1.5 * frac:.2f}×"
    a, b = summarise(res["window"]), summarise(res["full"])
    rows.append(Row(PAIR, "projector rebuild, s", f"{label_kept} ({sizes['window'][-1]:,} records left)", a,
                    f"{label_full} ({sizes['full'][-1]:,} records)", b, goal=goal_rebuild,
                    met=goal_met(a.value / b.value, goal_rebuild),
                    ratio_rounds=paired_ratios(res["window"], res["full"]),
                    note="projection keys wiped, fresh group, Projector.run(until_caught_up=True): first batch "
                         "handled to the last write's end (pair 3's window); no archived run came back"))
    return rows


class _ArchiveSides:
    """Per round: ``archive_runs`` of the next batch of runs (ours: the archiver's sweep), then a raw pyarrow write of
    the same rows."""

    def __init__(self, settings: Settings, run_ids: list[str], per_round: int) -> None:
        from runjournal.consumers.ops.erase import tombstone_producer
        from runjournal.stores.object_store import filesystem

        self.settings = settings
        self.pending = list(run_ids)
        self.per_round = per_round
        self.client = redis_client.client(settings)
        self.fs, self.root = filesystem(settings)
        self.producer = tombstone_producer(settings)  # the archiver's one long-lived producer
        self.last: list[str] = []
        self.mb: dict[str, list[float]] = {"ours": [], "anchor": []}

    def ours(self) -> float:
        from runjournal.consumers.archive.store import ArchiveReport, archive_runs

        batch, self.pending = self.pending[:self.per_round], self.pending[self.per_round:]
        started = time.perf_counter()
        done = archive_runs(self.settings, batch, redis_client=self.client, producer=self.producer)
        elapsed = time.perf_counter() - started
        if not all(isinstance(o, ArchiveReport) for o in done.values()) or len(done) != len(batch):
            raise RuntimeError(f"{PAIR}: archive_runs archived {len(done)} of {len(batch)}: {done}")
        rows = sum(o.rows for o in done.values() if isinstance(o, ArchiveReport))
        self.last = batch
        self.mb["ours"].append(self._bytes([self._manifest(r)["object_path"] for r in batch]) / elapsed / 1e6)
        return rows / elapsed

    def anchor(self) -> float:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from runjournal.consumers.archive import read_archived
        from runjournal.consumers.archive.store import COLUMNS

        schema = pa.schema([("source", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                            ("key", pa.string()), ("type", pa.string()), ("seq", pa.int64()), ("epoch", pa.int64()),
                            ("value", pa.binary())])
        per_run = []
        for r in self.last:
            archived = read_archived(self.settings, r)
            assert archived is not None
            per_run.append([{c: row[c] for c in COLUMNS} for row in archived.rows])
        self.fs.makedirs(f"{self.root}/anchor", exist_ok=True)
        paths = [f"{self.root}/anchor/{uuid.uuid4().hex}.parquet" for _ in per_run]
        started = time.perf_counter()
        for rows, path in zip(per_run, paths, strict=True):
            table = pa.Table.from_pylist(rows, schema=schema)
            with self.fs.open(path, "wb") as out:
                pq.write_table(table, out)
        elapsed = time.perf_counter() - started
        self.mb["anchor"].append(self._bytes(paths) / elapsed / 1e6)
        return sum(len(rows) for rows in per_run) / elapsed

    def _manifest(self, run_id: str) -> dict[str, Any]:
        from runjournal.consumers.archive import read_archived

        archived = read_archived(self.settings, run_id)
        assert archived is not None
        return archived.manifest

    def _bytes(self, paths: list[str]) -> int:
        return sum(int(self.fs.size(p)) for p in paths)


def _throughput_rows(env: BenchEnv, cfg: RetentionConfig) -> list[Row]:
    rng = random.Random(16)
    base = env.pair_settings("ret-archive")
    settings = base.model_copy(update={"archive_url": f"file://{env.work_dir / ('archive-' + base.topic_prefix)}"})
    ids = _ids(rng, (cfg.rounds + 1) * cfg.archive_runs)
    n = _publish(settings, [run_events(r, cfg.events_per_run) for r in ids], 3)
    _project(settings)
    sides = _ArchiveSides(settings, ids, cfg.archive_runs)
    res = rounds_of(PAIR, [Side("archive_runs", sides.ours), Side("pyarrow write", sides.anchor)], rounds=cfg.rounds)
    a, b = summarise(res["archive_runs"]), summarise(res["pyarrow write"])
    mb_o, mb_a = summarise(sides.mb["ours"][1:]), summarise(sides.mb["anchor"][1:])
    return [Row(PAIR, "archive rows/s", f"archive_runs of {cfg.archive_runs} runs a round, a sweep's batch "
                f"({n:,} events on the topic)",
                a, "pyarrow from_pylist + write_table of the same rows, one file a run, same filesystem", b,
                ratio_rounds=paired_ratios(res["archive_runs"], res["pyarrow write"]),
                note=f"object MB/s: archive_runs {mb_o.value:.2f} ({mb_o.low:.2f}–{mb_o.high:.2f}), pyarrow "
                     f"{mb_a.value:.2f} ({mb_a.low:.2f}–{mb_a.high:.2f}); archive_runs claims the runs, reads each "
                     "partition of the events, checkpoints and payloads topics once, then per run folds, writes, "
                     "reads back and verifies, writes the manifest, tombstones (one producer, a flush a run) and "
                     "deletes the Redis state")]


def run_retention(env: BenchEnv, cfg: RetentionConfig) -> list[Row]:
    """Run pair 15; returns its rows (see the module docstring)."""
    return _hot_rows(env, cfg) + _throughput_rows(env, cfg)

"""Pair 3 — projection throughput: the projector folding a topic into Redis, until caught up.

Input: ``runs`` complete runs of ``events_per_run`` events (``bench._events.run_events``),
interleaved as 500 concurrent agents would write them, published once with the real codec
(Avro single-object) to the pair's events topic, and once as JSON keyed by run_id (same
partitions) for the Quix anchor. Sides, each from an empty state every round:

* ours: :class:`runjournal.consumers.projector.Projector` (fresh group, Redis prefix wiped) —
  ``run(until_caught_up=True)``: decode, fold with the reducer, one atomic Redis script per
  partition batch, group commit;
* Quix Streams 3.28 (``bench/_quix_app.py``, its own venv): the same reducer per run in RocksDB
  state, changelog on, at-least-once, over the JSON copy;
* ceiling: a raw ``Consumer`` assigned to every partition, ``consume(2000)`` + ``codec.decode`` of
  every record, no writes;
* the projector with write-behind off (``write_behind=False``: each batch's Redis write waited for before the next
  batch is folded): the write-behind optimisation's before/after, same topic, same rounds;
* and, on a smaller topic of its own, the projector with 20-record batches (``batch_size=20``, the
  size of a poll when it follows live agents instead of rebuilding) with its state cache on and off
  (``state_cache_runs=0``): the optimisation's before/after. In a rebuild each batch holds ~1,750
  records of one partition, so a run's state is loaded about 3 times in its life and the cache saves
  little; following live traffic it is loaded once per event without the cache.

Figure: records per second from the first record handled to the last (for the projector: to the end of its last
Redis write, which write-behind finishes after its last batch was handled; group join, process start and the final
caught-up check are outside the window, for all sides alike).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from bench._env import BenchEnv
from bench._events import interleave, json_value, publish_raw, run_events
from bench._model import Row, goal_met, paired_ratios, summarise
from bench._rounds import Side, progress
from bench._rounds import interleave as rounds_of
from runjournal.consumers.projector import Projector
from runjournal.consumers.projector.store import ProjectionStore
from runjournal.core import kafka, redis_client
from runjournal.core.settings import Settings
from runjournal.producers import partition_for
from runjournal.schemas import Event, codec_from_settings

__all__ = ["ProjectionConfig", "TimedProjector", "ceiling_rate", "publish_workload", "quix_python", "run_projection"]

PAIR = "3 projection"
REPO = Path(__file__).resolve().parent.parent


def quix_python() -> Path:
    """The Quix venv's interpreter (``RJ_BENCH_QUIX_PYTHON`` or ``bench/out/quix-venv/bin/python``)."""
    return Path(os.environ.get("RJ_BENCH_QUIX_PYTHON") or REPO / "bench" / "out" / "quix-venv" / "bin" / "python")


@dataclass(frozen=True)
class ProjectionConfig:
    """Sizes of pair 3."""

    runs: int
    """Runs in the topic."""
    events_per_run: int
    """Events per run (all runs complete)."""
    rounds: int
    """Measured rounds (after one warm-up)."""


class TimedProjector(Projector):
    """The projector, unchanged, with the time of its first handled batch and of its last write's end recorded
    (with write-behind the last batch's write ends after its ``_handle`` returns: the window runs until it has)."""

    first: float | None = None
    last: float | None = None

    def _handle(self, msgs: list[Any]) -> None:
        if self.first is None:
            self.first = time.perf_counter()
        super()._handle(msgs)
        self.last = max(self.last or 0.0, time.perf_counter())

    def _take(self, outcome: Any, leaving: set[int]) -> None:
        self.last = max(self.last or 0.0, outcome.done_at)
        super()._take(outcome, leaving)


def publish_workload(settings: Settings, runs: int, events_per_run: int, *, json_topic: str | None = None,
                     seed: int = 7, seal: Callable[[Event], Event] | None = None) -> int:
    """Publish ``runs`` complete runs (Avro to the events topic; JSON keyed by run_id to ``json_topic``).

    ``seal``: applied to every event before it is encoded (pair 16: a journal's encryption of the content fields).
    """
    rng = random.Random(seed)
    all_runs = [run_events(str(uuid.UUID(int=rng.getrandbits(128))), events_per_run) for _ in range(runs)]
    if seal is not None:
        all_runs = [[seal(e) for e in run] for run in all_runs]
    stream = list(interleave(all_runs, rng))
    codec = codec_from_settings(settings)
    parts = {r[0].run_id: partition_for(r[0].run_id, settings.partitions) for r in all_runs}
    n, secs = publish_raw(settings.bootstrap, settings.events_topic,
                          ((e.key.encode(), codec.encode(e), parts[e.run_id]) for e in stream))
    progress(f"published {n} events of {runs} runs to {settings.events_topic} in {secs:.1f} s")
    if json_topic:
        publish_raw(settings.bootstrap, json_topic, ((e.run_id.encode(), json_value(e), parts[e.run_id])
                                                     for e in stream))
    return n


def projector_rate(settings: Settings, expected: int, *, state_cache_runs: int = 10_000,
                   batch_size: int = 2000, write_behind: bool = True) -> float:
    """Rebuild the projection from nothing (Redis wiped, fresh group); records/s from the first batch handled to
    the last write's end."""
    ProjectionStore(redis_client.client(settings), settings.topic_prefix).wipe()
    proj = TimedProjector(settings, group_id=f"{settings.topic_prefix}.projector-{uuid.uuid4().hex[:6]}",
                          state_cache_runs=state_cache_runs, batch_size=batch_size, write_behind=write_behind)
    stats = proj.run(until_caught_up=True)
    if stats.events != expected or proj.first is None or proj.last is None:
        raise RuntimeError(f"projector handled {stats.events} of {expected} records")
    return stats.events / (proj.last - proj.first)


def ceiling_rate(settings: Settings, expected: int, *, deadline_s: float = 300.0) -> float:
    """Raw consume + decode of every record (no writes); records/s from the first batch to the last."""
    codec = codec_from_settings(settings)
    consumer = kafka.consumer(settings, **{"group.id": f"bench-ceiling-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "fetch.min.bytes": 1, "queued.max.messages.kbytes": 65536})
    consumer.assign([TopicPartition(settings.events_topic, p, OFFSET_BEGINNING) for p in range(settings.partitions)])
    n, first, stop_at = 0, None, time.monotonic() + deadline_s
    try:
        while n < expected and time.monotonic() < stop_at:
            msgs = consumer.consume(2000, timeout=0.5)
            if msgs and first is None:
                first = time.perf_counter()
            for m in msgs:
                if m.error() is None:
                    codec.decode(m.value(), topic=m.topic(), partition=m.partition(), offset=m.offset())
                    n += 1
        last = time.perf_counter()
    finally:
        consumer.close()
    if n != expected or first is None:
        raise RuntimeError(f"ceiling read {n} of {expected} records")
    return n / (last - first)


def quix_rate(settings: Settings, json_topic: str, expected: int, state_root: Path) -> float:
    """One Quix Streams run from nothing (fresh group, fresh state dir); records/s first to last."""
    group = f"{settings.topic_prefix}-quix-{uuid.uuid4().hex[:6]}"
    cmd = [str(quix_python()), str(REPO / "bench" / "_quix_app.py"), "--repo", str(REPO),
           "--bootstrap", settings.bootstrap, "--topic", json_topic, "--group", group,
           "--state-dir", str(state_root / group), "--count", str(expected)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)  # noqa: S603
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"quix app failed (rc={proc.returncode}): {proc.stderr[-2000:]}")
    out = json.loads(lines[-1])
    if out["events"] != expected:
        raise RuntimeError(f"quix app handled {out['events']} of {expected} records")
    return float(out["events_per_s"])


def run_projection(env: BenchEnv, cfg: ProjectionConfig, shared: dict[str, Any]) -> list[Row]:
    """Run pair 3; returns its rows. Leaves the topic and the last projection for pair 6 (``shared``)."""
    settings = env.pair_settings("projection")
    json_topic = env.topic("projection-json", partitions=settings.partitions)
    n = publish_workload(settings, cfg.runs, cfg.events_per_run, json_topic=json_topic)
    sides = [Side("projector", lambda: projector_rate(settings, n)),
             Side("ceiling", lambda: ceiling_rate(settings, n)),
             Side("write-behind off", lambda: projector_rate(settings, n, write_behind=False))]
    have_quix = quix_python().exists()
    if have_quix:
        sides.insert(1, Side("quix", lambda: quix_rate(settings, json_topic, n, env.work_dir / "quix"), warmup=False))
    res = rounds_of(PAIR, sides, rounds=cfg.rounds)
    shared["projection"] = {"settings": settings, "events": n, "runs": cfg.runs}
    ours = summarise(res["projector"])
    note = f"{n} events over {cfg.runs} runs, {settings.partitions} partitions, rebuilt from nothing each round"
    rows = []
    if have_quix:
        q = summarise(res["quix"])
        rows.append(Row(PAIR, "events/s", "projector → Redis", ours,
                        "Quix Streams 3.28, same reducer, RocksDB state, at-least-once", q, goal="≥ 3",
                        met=goal_met(ours.value / q.value, "≥ 3"), note=note,
                        ratio_rounds=paired_ratios(res["projector"], res["quix"])))
    else:
        note += "; Quix anchor skipped: no bench/out/quix-venv (make bench installs it)"
    c = summarise(res["ceiling"])
    rows.append(Row(PAIR, "events/s", "projector → Redis", ours, "ceiling: raw consume + decode, no writes", c,
                    goal="≥ 0.5", met=goal_met(ours.value / c.value, "≥ 0.5"), note="" if have_quix else note,
                    ratio_rounds=paired_ratios(res["projector"], res["ceiling"])))
    rows.append(Row(PAIR, "events/s", "projector, write-behind on (after)", ours,
                    "projector, write-behind off (before)", summarise(res["write-behind off"]),
                    note="write-behind off: each batch's Redis write is waited for before the next batch is folded",
                    ratio_rounds=paired_ratios(res["projector"], res["write-behind off"])))
    return rows + _cache_rows(env, max(100, cfg.runs // 5), cfg.rounds)


def _cache_rows(env: BenchEnv, runs: int, rounds: int) -> list[Row]:
    """The state cache's before/after with live-tail-sized batches (see the module docstring)."""
    settings = env.pair_settings("projection-live")
    n = publish_workload(settings, runs, 50, seed=11)
    res = rounds_of(f"{PAIR} (20-record batches)", [
        Side("cache on", lambda: projector_rate(settings, n, batch_size=20)),
        Side("cache off", lambda: projector_rate(settings, n, batch_size=20, state_cache_runs=0))], rounds=rounds)
    return [Row(PAIR, "events/s, 20-record batches", "projector, state cache on (after)", summarise(res["cache on"]),
                "projector, state cache off (before)", summarise(res["cache off"]),
                note=f"{n} events over {runs} runs; batch_size=20 as when following live agents",
                ratio_rounds=paired_ratios(res["cache on"], res["cache off"]))]

"""Pair 10 — long runs (issue 29): no ceiling, a run of any length costs the same per event.

Two figures, each beside its anchor in the same run:

* **Projector throughput with 1 % of runs long.** Topic A: ``runs`` complete runs of 50 events. Topic B: the same
  number of runs, 1 % of them ``long_events`` events long (≥ 5,000), the rest of 50; the long runs are first in
  the interleaving, so their events spread over the whole topic (every batch touches them, as live long runs do).
  ``Projector.run(until_caught_up=True)`` from nothing over each in batches of 100 records, as when following
  live agents (pair 3's ``projector_rate``: Redis prefix wiped, fresh group), rounds interleaved; figure =
  records/s, goal B / A ≥ 0.9.
* **Recovery and resume of a 50,000-event run.** One in-flight run of ``recover_events`` events (ends on a
  TOOL_CALL_INTENDED without outcome, as after a crash), projected by the real projector; then per round a full
  ``RecoveryJob.recover(runs=[run], assign_to=<a live Journal>)`` (fence, snapshot, tail, classify, plan,
  RUN_RESUMED, hand-over) and that Journal's ``resume(run)`` (reads the plan, builds the handle). The next round's
  Journal is another instance: the previous one is closed (its lease released), so the run is orphaned again.
  Anchor: the same on a 100-event run. Goal (absolute) ≤ 1 s each on the long run.
"""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass

from bench._env import BenchEnv
from bench._events import interleave, publish_raw, run_events
from bench._model import Row, goal_met, paired_ratios, summarise
from bench._rounds import Side, progress
from bench._rounds import interleave as rounds_of
from bench.projection import projector_rate
from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core.settings import Settings
from runjournal.producers import Journal, partition_for
from runjournal.schemas import Event, codec_from_settings

__all__ = ["LongRunsConfig", "run_long_runs"]

PAIR = "10 long runs"
MIXED_GOAL = "≥ 0.9"
RESUME_GOAL = "≤ 1 s"
BATCH = 100
"""Records per projector batch on both topics: a live projector's polls are small (pair 3 (c) uses 20)."""


@dataclass(frozen=True)
class LongRunsConfig:
    """Sizes of pair 10."""

    runs: int
    """Runs per projector topic (1 % of them long on topic B)."""
    long_events: int
    """Events of each long run on topic B (≥ 5,000 per the issue)."""
    recover_events: int
    """Events of the run recovered and resumed (50,000 per the issue)."""
    rounds: int
    """Measured rounds (after one warm-up)."""


def _publish(settings: Settings, runs: list[list[Event]], rng: random.Random) -> int:
    codec = codec_from_settings(settings)
    parts = {r[0].run_id: partition_for(r[0].run_id, settings.partitions) for r in runs}
    n, secs = publish_raw(settings.bootstrap, settings.events_topic,
                          ((e.key.encode(), codec.encode(e), parts[e.run_id]) for e in interleave(runs, rng)))
    progress(f"{PAIR}: published {n:,} events of {len(runs)} runs to {settings.events_topic} in {secs:.1f} s")
    return n


def _ids(rng: random.Random, n: int) -> list[str]:
    return [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(n)]


def _mixed_rows(env: BenchEnv, cfg: LongRunsConfig) -> list[Row]:
    rng = random.Random(10)
    n_long = max(1, cfg.runs // 100)
    short = env.pair_settings("long-short")
    n_short = _publish(short, [run_events(r, 50) for r in _ids(rng, cfg.runs)], rng)
    mixed = env.pair_settings("long-mixed")
    runs = [run_events(r, cfg.long_events) for r in _ids(rng, n_long)]
    runs += [run_events(r, 50) for r in _ids(rng, cfg.runs - n_long)]
    n_mixed = _publish(mixed, runs, rng)
    del runs
    res = rounds_of(PAIR, [Side("short", lambda: projector_rate(short, n_short, batch_size=BATCH)),
                           Side("1% long", lambda: projector_rate(mixed, n_mixed, batch_size=BATCH))],
                    rounds=cfg.rounds)
    a, b = summarise(res["short"]), summarise(res["1% long"])
    return [Row(PAIR, "records/s, projector from nothing", f"{n_long} of {cfg.runs} runs of {cfg.long_events:,} "
                f"events ({n_mixed:,} events)", b, f"all {cfg.runs} runs of 50 events ({n_short:,} events)", a,
                goal=MIXED_GOAL, met=goal_met(b.value / a.value, MIXED_GOAL),
                ratio_rounds=paired_ratios(res["1% long"], res["short"]),
                note=f"batches of {BATCH} records (polls following live agents): the long runs' events spread over "
                     "the whole topic, so nearly every batch touches one")]


class _Resumer:
    """One orphaned run, recovered and resumed once per round by a fresh live instance."""

    def __init__(self, settings: Settings, run_id: str) -> None:
        self.settings = settings
        self.run_id = run_id
        self.round = 0
        self.recover_s: list[float] = []
        self.resume_s: list[float] = []

    def __call__(self) -> float:
        self.round += 1
        with Journal(self.settings, producer_id=f"bench-live-{self.round}") as live:
            job = RecoveryJob(self.settings, max_wait_s=0)
            try:
                started = time.perf_counter()
                report = job.recover(runs=[self.run_id], assign_to=live.producer_id)
                recovered = time.perf_counter() - started
            finally:
                job.close()
            actions = [r.action for r in report.runs]
            if actions != ["resumed"]:
                raise RuntimeError(f"recover() of {self.run_id}: {actions}")
            started = time.perf_counter()
            handle = live.resume(self.run_id)
            resumed = time.perf_counter() - started
            if handle.plan is None or not handle.plan.calls:
                raise RuntimeError(f"resume of {self.run_id} has no plan")
        self.recover_s.append(recovered)
        self.resume_s.append(resumed)
        return recovered + resumed


def _resume_rows(env: BenchEnv, cfg: LongRunsConfig) -> list[Row]:
    rng = random.Random(11)
    sides: dict[str, _Resumer] = {}
    for label, n in (("long", cfg.recover_events), ("short", 100)):
        settings = env.pair_settings(f"long-resume-{label}")
        run_id = _ids(rng, 1)[0]
        events = _publish(settings, [run_events(run_id, n, finish=False)], rng)
        projector_rate(settings, events)  # the projection a recovery reads its snapshot from
        sides[label] = _Resumer(settings, run_id)
    rounds_of(PAIR, [Side(label, r) for label, r in sides.items()], rounds=cfg.rounds)
    rows: list[Row] = []
    long, short = sides["long"], sides["short"]
    warm = 1  # the warm-up round of each side is in its lists first
    for what, ours, anchor in (("full recover(), s", long.recover_s[warm:], short.recover_s[warm:]),
                               ("Journal.resume(), s", long.resume_s[warm:], short.resume_s[warm:])):
        a, b = summarise(ours), summarise(anchor)
        rows.append(Row(PAIR, what, f"a run of {cfg.recover_events:,} events", a, "a run of 100 events", b,
                        goal=RESUME_GOAL, met=goal_met(a.value, RESUME_GOAL),
                        ratio_rounds=paired_ratios(ours, anchor),
                        note="recover(runs=[run], assign_to=live): fence, snapshot, tail, classify, plan, "
                             "RUN_RESUMED, hand-over; then the live instance's resume(run) (plan read, handle built)"))
    return rows


def run_long_runs(env: BenchEnv, cfg: LongRunsConfig) -> list[Row]:
    """Run pair 10; returns its rows (see the module docstring)."""
    return _mixed_rows(env, cfg) + _resume_rows(env, cfg)

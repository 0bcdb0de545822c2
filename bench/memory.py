"""Pair 5 — memory off the critical path: projector throughput beside the memory extractor.

One topic of complete runs (``bench.projection.publish_workload``). Each round rebuilds the
projection from nothing (as pair 3's projector side) in three conditions, interleaved:

* extractor stopped — the anchor;
* extractor running — ``runjournal memory-extractor`` (its own process and consumer group, MiniLM
  embeddings, embedded Qdrant) as deployed by default: niceness 19 (``RUNJOURNAL_MEMORY_NICE``), one
  onnxruntime thread, the tokenizer's thread pool off; started before the round and busy during all
  of it (the topic holds far more records than it reads in a round); it is given time to load its
  model and commit a first batch before the projector starts;
* Qdrant unreachable — the same extractor with ``RUNJOURNAL_QDRANT_URL`` pointing at a closed port
  on 127.0.0.1: it consumes, fails to write, backs off and retries;
* extractor running unbounded — ``RUNJOURNAL_MEMORY_NICE=0`` and ``TOKENIZERS_PARALLELISM=true``: how it
  ran before issue 20 (the before of the optimisation, informational);
* the extractor alone, bounded and unbounded — no projector: its own throughput (records/s from its
  committed offsets over a 10 s window after its first commit), i.e. what the bounds cost it when it has
  the machine to itself. Beside the projector, its records/s during the projector's window are reported too.

Sides rotate (stopped, running, down; running, down, stopped; …): each condition's round follows
a different one, so a position effect (the previous side's extractor exiting, Redis rewriting its
AOF) does not land on one side. The extractor's group is deleted before each start, so it works
from the topic's start every round (its writes are idempotent by point id). Alongside throughput,
the projector's own CPU time per 1,000 events (``getrusage`` of the bench process, which runs only
the projector then) separates "the projector does more work / waits on memory" from "it gets less CPU".

On this 2-core machine the running extractor competes with the projector (and the broker) for CPU:
that is the cost being measured, not a coupling (the projector never waits on memory).
"""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import time
from typing import Any

from confluent_kafka import TopicPartition

from bench._env import BenchEnv, child_env
from bench._model import Row, goal_met, paired_ratios, summarise
from bench._rounds import Side, interleave, progress
from bench.projection import projector_rate, publish_workload
from runjournal.consumers.memory.service import memory_group
from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.deploy.procs import free_port

__all__ = ["run_memory"]

PAIR = "5 memory off path"


def _reset_group(settings: Settings) -> None:

    admin = kafka.admin_client(settings)
    for fut in admin.delete_consumer_groups([memory_group(settings)], request_timeout=15).values():
        try:
            fut.result(20)
        except Exception:  # noqa: BLE001 - the group does not exist yet
            pass


def _committed(settings: Settings) -> int:
    c = kafka.consumer(settings, **{"group.id": memory_group(settings)})
    try:
        tps = c.committed([TopicPartition(settings.events_topic, p) for p in range(settings.partitions)], timeout=10)
        return sum(max(0, tp.offset) for tp in tps)
    finally:
        c.close()


class _Extractor:
    """``runjournal memory-extractor`` as a child process, started and stopped around a round."""

    def __init__(self, settings: Settings, *, qdrant_url: str | None, unbounded: bool = False,
                 sched: str | None = None) -> None:
        self.settings = settings
        extra = {"RUNJOURNAL_QDRANT_URL": qdrant_url} if qdrant_url else {}
        if sched is not None:
            extra["RUNJOURNAL_MEMORY_SCHED"] = sched
        if unbounded:
            extra["RUNJOURNAL_MEMORY_NICE"] = "0"
            extra["RUNJOURNAL_MEMORY_SCHED"] = "other"
        self.env = child_env(settings, **extra)
        if unbounded:
            self.env["TOKENIZERS_PARALLELISM"] = "true"
        else:
            self.env.pop("TOKENIZERS_PARALLELISM", None)
        self.reachable = qdrant_url is None
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready_timeout_s: float = 30.0) -> None:
        _reset_group(self.settings)
        before = _committed(self.settings)
        self.proc = subprocess.Popen([sys.executable, "-m", "runjournal", "memory-extractor"],  # noqa: S603
                                     env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + (ready_timeout_s if self.reachable else 3.0)
        while time.monotonic() < deadline:  # running: until it committed a batch; unreachable: 3 s
            time.sleep(0.5)
            if self.proc.poll() is not None:
                raise RuntimeError(f"memory extractor exited with {self.proc.returncode}")
            if self.reachable and _committed(self.settings) > before:
                return

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _with(extractor: _Extractor | None, settings: Settings, n: int, cpu: list[float],
          own: list[float] | None = None) -> float:
    """One projector rebuild with ``extractor`` running (or not); appends its CPU ms per 1k events to ``cpu`` and
    the extractor's records/s over the same window to ``own``."""
    if extractor is not None:
        extractor.start()
    try:
        before, started, read = _cpu_s(), time.monotonic(), _committed(settings) if own is not None else 0
        rate = projector_rate(settings, n)
        cpu.append((_cpu_s() - before) * 1000 / (n / 1000))
        if own is not None:
            own.append((_committed(settings) - read) / (time.monotonic() - started))
        return rate
    finally:
        if extractor is not None:
            extractor.stop()


def _alone(extractor: _Extractor, settings: Settings, window_s: float = 10.0) -> float:
    """The extractor by itself: records/s it commits over ``window_s`` after its first commit."""
    extractor.start()
    try:
        read, started = _committed(settings), time.monotonic()
        time.sleep(window_s)
        return (_committed(settings) - read) / (time.monotonic() - started)
    finally:
        extractor.stop()


def run_memory(env: BenchEnv, events: int, rounds: int, *, nice: bool = True) -> list[Row]:
    """Run pair 5; returns its rows (see the module docstring). ``nice``: also the unbounded (before) and alone
    sides (full runs)."""
    settings = env.pair_settings("memory")
    n = publish_workload(settings, events // 50, 50, seed=5)
    running = _Extractor(settings, qdrant_url=None)
    other = "other" if settings.memory_sched == "idle" else "idle"  # the policy the default does not use
    alternative = _Extractor(settings, qdrant_url=None, sched=other)
    down = _Extractor(settings, qdrant_url=f"http://127.0.0.1:{free_port()}")
    unbounded = _Extractor(settings, qdrant_url=None, unbounded=True)
    alt = f"running, sched {other}"
    cpu: dict[str, list[float]] = {k: [] for k in ("stopped", "running", "qdrant down", "running unbounded", alt)}
    own: dict[str, list[float]] = {"running": [], "running unbounded": [], alt: []}
    sides = [Side("stopped", lambda: _with(None, settings, n, cpu["stopped"])),
             Side("running", lambda: _with(running, settings, n, cpu["running"], own["running"])),
             Side("qdrant down", lambda: _with(down, settings, n, cpu["qdrant down"])),
             Side(alt, lambda: _with(alternative, settings, n, cpu[alt], own[alt]))]
    if nice:
        sides += [Side("running unbounded", lambda: _with(unbounded, settings, n, cpu["running unbounded"],
                                                          own["running unbounded"])),
                  Side("alone", lambda: _alone(running, settings)),
                  Side("alone unbounded", lambda: _alone(unbounded, settings))]
    res: dict[str, Any] = interleave(PAIR, sides, rounds=rounds, warmup=0, rotate=True)
    progress(f"{PAIR}: extractor committed {_committed(settings)} of {n} records over all rounds")
    anchor = summarise(res["stopped"])
    note = (f"{n} events; projector rebuilt from nothing per round; extractor = `runjournal memory-extractor` "
            "(MiniLM int8, embedded Qdrant) in its own process on the same 2 cores, bounded by default "
            f"(nice {settings.memory_nice}, sched {settings.memory_sched}, 1 onnxruntime thread, no tokenizer pool)")
    rows = []
    for label, side, goal in (("running", "projector, extractor running", "≥ 0.95"),
                              ("qdrant down", "projector, extractor with Qdrant unreachable", "≥ 0.95"),
                              (alt, f"projector, extractor running with sched {other}", None),
                              ("running unbounded", "projector, extractor unbounded (nice 0, tokenizer pool; "
                                                    "before)", None)):
        if label not in res:
            continue
        ours = summarise(res[label])
        rows.append(Row(PAIR, "events/s", side, ours, "projector, extractor stopped", anchor,
                        goal=goal, met=goal_met(ours.value / anchor.value, goal) if goal else None,
                        note=note if label == "running" else "",
                        ratio_rounds=paired_ratios(res[label], res["stopped"])))
    for label in ("running", "qdrant down"):
        rows.append(Row(PAIR, "projector CPU ms / 1k events", f"extractor {label}", summarise(cpu[label]),
                        "extractor stopped", summarise(cpu["stopped"]),
                        note="same work per event ⇒ a slowdown above is CPU contention, not coupling"
                        if label == "running" else "", ratio_rounds=paired_ratios(cpu[label], cpu["stopped"])))
    if nice:
        rows.append(Row(PAIR, "extractor records/s, alone", "bounded (default)", summarise(res["alone"]),
                        "unbounded (before)", summarise(res["alone unbounded"]),
                        note="what the bounds cost the extractor with the machine to itself",
                        ratio_rounds=paired_ratios(res["alone"], res["alone unbounded"])))
        rows.append(Row(PAIR, "extractor records/s, beside projector", "bounded (default)",
                        summarise(own["running"]), "unbounded (before)", summarise(own["running unbounded"]),
                        note="during the projector's rebuild: the lag memory takes so that the projector does not",
                        ratio_rounds=paired_ratios(own["running"], own["running unbounded"])))
    rows.append(Row(PAIR, "extractor records/s, beside projector", "bounded (default)", summarise(own["running"]),
                    f"sched {other}", summarise(own[alt]),
                    ratio_rounds=paired_ratios(own["running"], own[alt])))
    return rows

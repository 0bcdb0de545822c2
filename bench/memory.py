"""Pair 5 — memory off the critical path: projector throughput beside the memory extractor.

One topic of complete runs (``bench.projection.publish_workload``). The figure is a projector rebuild from
nothing (as pair 3's projector side) with the extractor running, against the same rebuild with that same
extractor process paused — measured back to back, so the anchor is seconds away from its side, not minutes.

Conditions, each one ``runjournal memory-extractor`` process (its own consumer group, reset before it starts, so
it works from the topic's start and is busy throughout; MiniLM embeddings, embedded Qdrant), started once and
given time to load its model and commit a first batch:

* running — as deployed by default (``RUNJOURNAL_MEMORY_NICE`` 19, ``RUNJOURNAL_MEMORY_SCHED``, the CPU headroom
  gate ``RUNJOURNAL_MEMORY_HEADROOM_CORES``, one onnxruntime thread, the tokenizer's thread pool off);
* running without the headroom gate (``RUNJOURNAL_MEMORY_HEADROOM_CORES=0``: priority alone, the gate's before);
* Qdrant unreachable — ``RUNJOURNAL_QDRANT_URL`` on a closed port: it consumes, fails to write, backs off, retries;
* running unbounded (full runs) — ``RUNJOURNAL_MEMORY_NICE=0``, ``RUNJOURNAL_MEMORY_SCHED=other``, no gate,
  ``TOKENIZERS_PARALLELISM=true``: how it ran before
  issue 20 (the before of the optimisation, informational).

Per condition, one warm-up round (discarded: the extractor process's first minute — its prefetch filling, the
collection's first upserts; without it the first condition of two runs read 0.12-0.17 below the second, with it
0.05 above), then ``rounds`` rounds of two rebuilds: extractor paused (SIGSTOP: no CPU, no fetches — the anchor)
and extractor running (SIGCONT), in alternating order (paused first on even rounds). The headline ratio is the
median of the per-round paired ratios (running ÷ paused, same round), so machine-wide load that changes
between rounds cancels; the range is their min–max. The extractor alone, bounded and unbounded (full runs), is
measured by its committed offsets over a 10 s window with no projector: what the bounds cost it when it has
the machine to itself. Alongside throughput, the projector's own CPU time per 1,000 events (``getrusage`` of
the bench process, which runs only the projector then) separates "the projector does more work / waits on
memory" from "it gets less CPU".

On this 2-core machine the running extractor competes with the projector (and the broker) for CPU:
that is the cost being measured, not a coupling (the projector never waits on memory).
"""

from __future__ import annotations

import resource
import signal
import statistics
import subprocess
import sys
import time

from confluent_kafka import TopicPartition

from bench._env import BenchEnv, child_env
from bench._model import Row, goal_met, paired_ratios, summarise
from bench._rounds import progress
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
                 gate: bool = True, label: str = "") -> None:
        self.settings, self.label = settings, label
        extra = {"RUNJOURNAL_QDRANT_URL": qdrant_url} if qdrant_url else {}
        if not gate or unbounded:
            extra["RUNJOURNAL_MEMORY_HEADROOM_CORES"] = "0"
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

    def pause(self, paused: bool) -> None:
        """SIGSTOP (no CPU, no fetches: the anchor) or SIGCONT the running extractor."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP if paused else signal.SIGCONT)

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


def _rebuild(settings: Settings, n: int, cpu: list[float]) -> float:
    """One projector rebuild; appends its CPU ms per 1k events to ``cpu``; returns events/s."""
    before = _cpu_s()
    rate = projector_rate(settings, n)
    cpu.append((_cpu_s() - before) * 1000 / (n / 1000))
    return rate


def _paired(extractor: _Extractor, settings: Settings, n: int, rounds: int) -> dict[str, list[float]]:
    """``rounds`` × (rebuild with ``extractor`` paused, rebuild with it running), alternating which comes first.

    Returns per-round lists: ``paused`` / ``running`` events/s, their CPU ms per 1k events, and the extractor's
    committed records/s during the running rebuilds (``own``).
    """
    out: dict[str, list[float]] = {k: [] for k in ("paused", "running", "cpu_paused", "cpu_running", "own")}
    extractor.start()
    try:
        for side in ("running", "paused"):  # warm-up, discarded: the new process's first fetches and upserts
            extractor.pause(side == "paused")
            _rebuild(settings, n, [])
        for r in range(rounds):
            for side in (("paused", "running") if r % 2 == 0 else ("running", "paused")):
                extractor.pause(side == "paused")
                read, started = _committed(settings), time.monotonic()
                out[side].append(_rebuild(settings, n, out[f"cpu_{side}"]))
                if side == "running":
                    out["own"].append((_committed(settings) - read) / (time.monotonic() - started))
            progress(f"{PAIR} {extractor.label} round {r + 1}/{rounds}: paused={out['paused'][-1]:,.0f}, "
                     f"running={out['running'][-1]:,.0f} events/s")
    finally:
        extractor.pause(False)
        extractor.stop()
    return out


def _alone(extractor: _Extractor, settings: Settings, window_s: float = 10.0) -> float:
    """The extractor by itself: records/s it commits over ``window_s`` after its first commit."""
    extractor.start()
    try:
        read, started = _committed(settings), time.monotonic()
        time.sleep(window_s)
        return (_committed(settings) - read) / (time.monotonic() - started)
    finally:
        extractor.stop()


def _ratio_row(label: str, got: dict[str, list[float]], goal: str | None, note: str = "") -> Row:
    ratios = paired_ratios(got["running"], got["paused"])
    ours, anchor = summarise(got["running"]), summarise(got["paused"])
    value = statistics.median(ratios)
    return Row(PAIR, "events/s", label, ours, "projector, the same extractor paused (SIGSTOP), same round", anchor,
               goal=goal, met=goal_met(value, goal) if goal else None, note=note, ratio_rounds=ratios,
               paired_headline=value)


def run_memory(env: BenchEnv, events: int, rounds: int, *, nice: bool = True) -> list[Row]:
    """Run pair 5; returns its rows (see the module docstring). ``nice``: also the unbounded (before) and alone
    sides (full runs)."""
    settings = env.pair_settings("memory")
    n = publish_workload(settings, events // 50, 50, seed=5)
    conditions = {"running": _Extractor(settings, qdrant_url=None, label="default"),
                  "no gate": _Extractor(settings, qdrant_url=None, gate=False, label="no headroom gate"),
                  "qdrant down": _Extractor(settings, qdrant_url=f"http://127.0.0.1:{free_port()}",
                                            label="qdrant down")}
    if nice:
        conditions["unbounded"] = _Extractor(settings, qdrant_url=None, unbounded=True, label="unbounded")
    got = {name: _paired(ext, settings, n, rounds) for name, ext in conditions.items()}
    alone = {}
    if nice:
        alone = {"bounded": [_alone(conditions["running"], settings) for _ in range(2)],
                 "unbounded": [_alone(conditions["unbounded"], settings) for _ in range(2)]}
    progress(f"{PAIR}: extractor committed {_committed(settings)} of {n} records over all rounds")
    note = (f"{n} events; projector rebuilt from nothing per side; extractor = `runjournal memory-extractor` "
            "(MiniLM int8, embedded Qdrant) in its own process on the same 2 cores, bounded by default "
            f"(nice {settings.memory_nice}, sched {settings.memory_sched}, headroom {settings.memory_headroom_cores} "
            f"cores / {settings.memory_headroom_wait_ms} ms, 1 onnxruntime thread, no tokenizer pool); ratio = median "
            "of the rounds' running/paused ratios")
    rows = [_ratio_row("projector, extractor running", got["running"], "≥ 0.95", note),
            _ratio_row("projector, extractor running without the headroom gate (priority alone; before)",
                       got["no gate"], None),
            _ratio_row("projector, extractor with Qdrant unreachable", got["qdrant down"], "≥ 0.95")]
    if nice:
        rows.append(_ratio_row("projector, extractor unbounded (nice 0, no gate, tokenizer pool; before issue 20)",
                               got["unbounded"],
                               None))
    rows.append(Row(PAIR, "projector CPU ms / 1k events", "extractor running", summarise(got["running"]["cpu_running"]),
                    "extractor paused", summarise(got["running"]["cpu_paused"]),
                    note="same work per event ⇒ a slowdown above is CPU contention, not coupling",
                    ratio_rounds=paired_ratios(got["running"]["cpu_running"], got["running"]["cpu_paused"])))
    own = {name: summarise(g["own"]) for name, g in got.items()}
    rows.append(Row(PAIR, "extractor records/s, beside projector", "bounded (default)", own["running"],
                    "no headroom gate", own["no gate"],
                    note="during the projector's rebuild: the lag memory takes so that the projector does not",
                    ratio_rounds=paired_ratios(got["running"]["own"], got["no gate"]["own"])))
    if nice:
        rows.append(Row(PAIR, "extractor records/s, beside projector", "bounded (default)", own["running"],
                        "unbounded (before issue 20)", own["unbounded"],
                        ratio_rounds=paired_ratios(got["running"]["own"], got["unbounded"]["own"])))
        rows.append(Row(PAIR, "extractor records/s, alone", "bounded (default)", summarise(alone["bounded"]),
                        "unbounded (before)", summarise(alone["unbounded"]),
                        note="what the bounds cost the extractor with the machine to itself",
                        ratio_rounds=paired_ratios(alone["bounded"], alone["unbounded"])))
    return rows

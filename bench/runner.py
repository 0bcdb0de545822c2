"""Runs the selected pairs one after another on one stack and collects their rows."""

from __future__ import annotations

import os
import time
import traceback
from typing import Any

from bench._env import BenchEnv, open_env
from bench._model import PAIRS, Row
from bench._rounds import progress

__all__ = ["run_bench"]


def _sizes(quick: bool, rounds: int | None) -> dict[str, Any]:
    r = rounds or (2 if quick else 5)
    return {
        "rounds": r,
        "publish_events": 8_000 if quick else 20_000,
        "boundary_calls": 40 if quick else 120,
        "projection_runs": 400 if quick else 2_000,
        "recovery_runs": 2_000 if quick else 10_000,
        "recovery_topics": (50_000, 200_000) if quick else (250_000, 1_000_000),
        "projection_rounds": min(r, 2 if quick else 3),  # the Quix side runs at ~1.5-2k events/s here
        "memory_events": 10_000 if quick else 120_000,  # ~3 s windows at ~40k events/s
        "memory_rounds": 2 if quick else min(r, 4),  # paired back to back (SIGSTOP/SIGCONT), ~13 s a round
        "memory_nice": not quick,  # the unbounded (before) and extractor-alone sides: full runs only
        "footprint_seconds": 4 if quick else 8,
        "footprint_rounds": 1 if quick else 2,
        "console_runs": 10_000,
        "console_requests": 10 if quick else 20,
        "aio_rounds": min(r, 2 if quick else 3),
        "startup_runs": 10 if quick else 30,  # one process start per side a round: cheap, and noisy here
        "long_runs": 400 if quick else 2_000,  # 1 % of them 5,000 events long on the mixed topic
        "long_recover_events": 10_000 if quick else 50_000,
        "long_rounds": min(r, 2 if quick else 3),
        "event_cost_events": 10_000 if quick else 50_000,
        "event_cost_rounds": 1 if quick else 2,
        "payloads_rounds": 2 if quick else 3,  # 100 MB per side per round
        "spend_calls": 100 if quick else 300,
        "stream_tokens": 5_000 if quick else 20_000,
        "stream_paced": 200 if quick else 400,
        "stream_rounds": min(r, 2 if quick else 3),
        "retention_runs": (30, 6) if quick else (200, 40),  # (runs, of them in the window): a fifth kept
        "retention_archive_runs": 10 if quick else 50,  # runs per archive_runs batch (a sweep) of the throughput row
        "retention_rounds": min(r, 2 if quick else 3),
        "encryption_runs": 400 if quick else 1_000,  # per projector topic (encrypted and plain), 50 events a run
    }


def _run_pair(name: str, env: BenchEnv, shared: dict[str, Any], sizes: dict[str, Any]) -> list[Row]:
    """Run one pair (imported here: each pair's dependencies load only when it runs)."""
    r = sizes["rounds"]
    if name == "startup":
        from bench.startup import run_startup

        return run_startup(env, sizes["startup_runs"])
    if name == "streams":
        from bench.streams import StreamsConfig, run_streams

        return run_streams(env, StreamsConfig(tokens=sizes["stream_tokens"], paced=sizes["stream_paced"],
                                              rounds=sizes["stream_rounds"]))
    if name == "retention":
        from bench.retention import RetentionConfig, run_retention

        runs, window = sizes["retention_runs"]
        return run_retention(env, RetentionConfig(runs, window, sizes["retention_archive_runs"],
                                                  sizes["retention_rounds"]))
    if name == "encryption":
        from bench.encryption import EncryptionConfig, run_encryption

        return run_encryption(env, EncryptionConfig(sizes["publish_events"], sizes["boundary_calls"],
                                                    sizes["encryption_runs"], r))
    if name == "spend":
        from bench.spend import SpendConfig, run_spend

        return run_spend(env, SpendConfig(sizes["spend_calls"], min(r, 2 if sizes["spend_calls"] < 300 else 3)))
    if name == "payloads":
        from bench.payloads import PayloadsConfig, run_payloads

        return run_payloads(env, PayloadsConfig(rounds=sizes["payloads_rounds"]))
    if name == "publish":
        from bench.publish import PublishConfig, run_publish

        return run_publish(env, PublishConfig(sizes["publish_events"], r))
    if name == "boundary":
        from bench.boundary import BoundaryConfig, run_boundary

        return run_boundary(env, BoundaryConfig(sizes["boundary_calls"], r))
    if name == "projection":
        from bench.projection import ProjectionConfig, run_projection

        return run_projection(env, ProjectionConfig(sizes["projection_runs"], 50, sizes["projection_rounds"]), shared)
    if name == "recovery":
        from bench.recovery import RecoveryConfig, run_recovery

        return run_recovery(env, RecoveryConfig(sizes["recovery_runs"], sizes["recovery_topics"], r))
    if name == "memory":
        from bench.memory import run_memory

        return run_memory(env, sizes["memory_events"], sizes["memory_rounds"], nice=sizes["memory_nice"])
    if name == "console":
        from bench.console import ConsoleConfig, run_console

        return run_console(env, ConsoleConfig(sizes["console_runs"], sizes["console_requests"], r))
    if name == "event_cost":
        from bench.event_cost import run_event_cost

        return run_event_cost(env, sizes["event_cost_rounds"], sizes["event_cost_events"])
    if name == "aio":
        from bench.aio import AioConfig, run_aio

        return run_aio(env, AioConfig(100, 10, sizes["aio_rounds"]))
    if name == "long":
        from bench.long_runs import LongRunsConfig, run_long_runs

        return run_long_runs(env, LongRunsConfig(sizes["long_runs"], 5_000, sizes["long_recover_events"],
                                                 sizes["long_rounds"]))
    from bench.footprint import run_footprint

    return run_footprint(env, shared, sizes["footprint_seconds"], sizes["footprint_rounds"])


def run_bench(*, quick: bool, only: tuple[str, ...], rounds: int | None = None) -> tuple[list[Row], dict[str, Any]]:
    """Run the pairs named in ``only`` (in the canonical order) and return ``(rows, header)``.

    A pair that fails is reported in ``header["failed"]`` with its error; the others still run.
    """
    started = time.monotonic()
    sizes = _sizes(quick, rounds)
    env, where = open_env()
    progress(f"stack: {where}")
    rows: list[Row] = []
    failed: dict[str, str] = {}
    shared: dict[str, Any] = {}
    load_start = os.getloadavg()[0]
    try:
        for name in PAIRS:
            if name not in only:
                continue
            t0 = time.monotonic()
            try:
                rows.extend(_run_pair(name, env, shared, sizes))
            except Exception as exc:  # noqa: BLE001 - one pair failing must not lose the others' rows
                failed[name] = f"{type(exc).__name__}: {exc}"
                progress(f"{name} FAILED: {traceback.format_exc()}")
            progress(f"{name} done in {time.monotonic() - t0:.1f} s")
    finally:
        env.close()
    header = {"mode": "quick" if quick else "full", "rounds": sizes["rounds"], "stack": where,
              "cpus": os.cpu_count(), "load_1m_start": round(load_start, 2),
              "load_1m_end": round(os.getloadavg()[0], 2), "elapsed_s": round(time.monotonic() - started, 1),
              **({"failed": failed} if failed else {})}
    return rows, header

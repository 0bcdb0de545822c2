"""Pair 7 — the console's runs list with 10k runs in the projection.

Setup: ``runs`` run states (default 10,000) folded by the projector's reducer from real events — completed runs
with six tool calls, runs in flight, runs with an OUTCOME_UNKNOWN call after a resume, parked runs — spread over
20 tenants and 5 agents, written with the projector's own ``ProjectionStore.apply_batch`` (so each state's index
entry is written by the code that writes it in production). ``runjournal console`` runs as a subprocess.

* **Ours**: ``GET /runs`` over HTTP — the first page (100 rows, most urgent first) rendered as HTML — and
  ``GET /runs?status=RUNNING&tenant=t10`` (a filtered page), from index read to the last byte.
* **Anchor** (what the list would cost without the index): in-process, every run's full state read from Redis
  (``ProjectionStore.load`` per partition: one MGET), parsed with ``RunState.from_json``, sorted the same way —
  no HTTP, no HTML.

Latency in ms; the headline is the percentile over every sample of every round. Goal: p95 ≤ 300 ms (absolute).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

from bench._env import BenchEnv, child_env
from bench._events import run_events
from bench._model import Row, goal_met, paired_ratios, percentile, summarise
from bench._rounds import Side, progress
from bench._rounds import interleave as rounds_of
from runjournal.consumers.projector.store import ProjectionStore
from runjournal.core import redis_client
from runjournal.core.settings import Settings
from runjournal.deploy.procs import free_port
from runjournal.model.reducer import RunState, apply, block, evolve
from runjournal.producers import partition_for
from runjournal.schemas import Event, EventType

__all__ = ["ConsoleConfig", "run_console"]

PAIR = "7 console"
TENANTS, AGENTS = 20, 5


@dataclass(frozen=True)
class ConsoleConfig:
    """Sizes of pair 7."""

    runs: int
    """Runs in the projection."""
    requests: int
    """Requests per side per round."""
    rounds: int
    """Measured rounds (after one warm-up)."""


def _fold(events: list[Event]) -> RunState:
    state = None
    for offset, event in enumerate(events):
        state = apply(state, event, partition=0, offset=offset)
    assert state is not None
    return state


def _templates() -> list[RunState]:
    """Four shapes folded once: completed (6 calls), in flight, outcome unknown after a resume, parked."""
    done = _fold(run_events("tmpl-done", 30))
    running = _fold(run_events("tmpl-running", 20, finish=False))
    inflight = run_events("tmpl-unknown", 21, finish=False)  # ends on a TOOL_CALL_INTENDED
    last = inflight[-1]
    resumed = Event(event_id="tmpl-unknown-resume", run_id=last.run_id, tenant_id=last.tenant_id, seq=last.seq + 1,
                    epoch=2, producer_id="recovery", type=EventType.RUN_RESUMED, occurred_at=last.occurred_at,
                    payload={"previous_epoch": 1, "recovered_by": "bench", "plan_json": "{}", "assigned_to": "b"})
    unknown = _fold([*inflight, resumed])
    parked = block(running, running.run_id, "bench: an undecodable record", partition=0, offset=99)
    return [done, running, unknown, parked]


def _seed(settings: Settings, runs: int) -> None:
    """Write ``runs`` states (shapes 90% / 7% / 2% / 1%) with the projector's atomic batch write."""
    shapes = _templates()
    store = ProjectionStore(redis_client.client(settings), settings.topic_prefix)
    by_partition: dict[int, dict[str, RunState | None]] = {}
    for i in range(runs):
        shape = shapes[0] if i % 100 < 90 else shapes[1] if i % 100 < 97 else shapes[2] if i % 100 < 99 else shapes[3]
        run_id = f"bench-run-{i:06d}"
        state = evolve(shape, run_id=run_id, tenant_id=f"t{i % TENANTS}", agent=f"agent-{i % AGENTS}",
                       updated_at_ms=1_790_000_000_000 + i)
        by_partition.setdefault(partition_for(run_id, settings.partitions), {})[run_id] = state
    for p, states in by_partition.items():
        ids, offset = list(states), -1
        for start in range(0, len(ids), 500):
            chunk = {r: states[r] for r in ids[start:start + 500]}
            res = store.apply_batch(p, expected_offset=offset, new_offset=offset + len(chunk), states=chunk)
            if res.status != "applied":
                raise RuntimeError(f"seeding partition {p}: {res}")
            offset += len(chunk)


@contextmanager
def _console(settings: Settings) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "runjournal", "console", "--port", str(port)],
                            env=child_env(settings), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("runjournal console did not start")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


def _http_samples(client: httpx.Client, paths: list[str], n: int) -> list[float]:
    out = []
    for i in range(n):
        started = time.perf_counter()
        res = client.get(paths[i % len(paths)])
        out.append((time.perf_counter() - started) * 1000)
        if res.status_code != 200 or "bench-run-" not in res.text:
            raise RuntimeError(f"GET {paths[i % len(paths)]}: HTTP {res.status_code}")
    return out


def _naive_samples(settings: Settings, n: int) -> list[float]:
    store = ProjectionStore(redis_client.client(settings), settings.topic_prefix)
    out = []
    for _ in range(n):
        started = time.perf_counter()
        states = [s for p in range(settings.partitions) for s in store.load(p, store.run_ids(p)).values()]
        states.sort(key=lambda s: (not s.parked, -(s.updated_at_ms or 0), s.run_id))
        out.append((time.perf_counter() - started) * 1000)
    return out


def run_console(env: BenchEnv, cfg: ConsoleConfig) -> list[Row]:
    """Run pair 7; returns its rows (see the module docstring)."""
    settings = env.pair_settings("console")
    started = time.monotonic()
    _seed(settings, cfg.runs)
    progress(f"{PAIR}: {cfg.runs} run states written in {time.monotonic() - started:.1f} s")
    with _console(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        res = rounds_of(PAIR, [
            Side("GET /runs", lambda: _http_samples(client, ["/runs"], cfg.requests)),
            Side("GET /runs filtered", lambda: _http_samples(client, ["/runs?status=RUNNING&tenant=t10"],
                                                              cfg.requests)),
            Side("naive: every state", lambda: _naive_samples(settings, max(3, cfg.requests // 4)))],
            rounds=cfg.rounds)
    rows = []
    naive = [x for r in res["naive: every state"] for x in r]
    naive_p50 = summarise([percentile(r, 50) for r in res["naive: every state"]], percentile(naive, 50))
    for label in ("GET /runs", "GET /runs filtered"):
        flat = [x for r in res[label] for x in r]
        p95 = summarise([percentile(r, 95) for r in res[label]], percentile(flat, 95))
        p50 = summarise([percentile(r, 50) for r in res[label]], percentile(flat, 50))
        rows.append(Row(PAIR, "ms p95", f"{label}, {cfg.runs:,} runs", p95, "absolute goal", None, goal="≤ 300",
                        met=goal_met(p95.value, "≤ 300"),
                        note="HTTP GET of the first page (100 rows, HTML) from a runjournal console subprocess"))
        rows.append(Row(PAIR, "ms p50", f"{label}, {cfg.runs:,} runs", p50, "naive: MGET + parse every state",
                        naive_p50, ratio_rounds=paired_ratios([percentile(r, 50) for r in res[label]],
                                                               [percentile(r, 50) for r in res["naive: every state"]])))
    return rows

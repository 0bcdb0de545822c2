"""Pair 11 — per-event projection cost at the end of a long run (issue 29): a 50,000-event run vs a short run.

Each side folds one run (``bench._events.run_events``: node blocks with two tool calls each, INTENDED + COMMITTED, and
transcript messages; a 50,000-event run holds 12,500 execution records) with the real reducer and stores it batch by
batch through the real ``ProjectionStore`` (``prepare_batch`` with the batch's before-states, then ``run_batch``: the
apply script on the bench's Redis) — the projector's steps 4 and 6-7 in process, without Kafka. The long run is
written in batches of 5,000 events up to its last 1,000, which are timed in batches of :data:`BATCH` events; the short
run (100 events) is timed whole in the same batches. Goal: the long run's per-event cost ≤ 1.5× the short run's
(before the hash layout it grew with the run: 86 µs at 200 events, 24.5 ms at 10,000).

Also Redis bytes per run: ``MEMORY USAGE`` of the run key of the short and the long run.

``python -m bench.event_cost [SIZE ...]`` prints the per-event cost of the last events of runs of each size (default
200 4000 10000 50000) on the Redis of ``RUNJOURNAL_REDIS_URL`` — the quick before/after table of issue 29 (it also runs
against a checkout without ``prepare_batch(before=…)``: then every batch writes the whole state).
"""

from __future__ import annotations

import inspect
import sys
import time
import uuid
from typing import Any

from bench._events import run_events
from runjournal.consumers.projector.store import ProjectionStore
from runjournal.model.reducer import RunState, fold

__all__ = ["BATCH", "measure", "run_event_cost"]

PAIR = "11 event cost"
BATCH = 10
"""Events of the run per timed batch (a projector batch holds a few events of each of many runs)."""
BULK = 5_000
"""Events per batch while a long run is written up to its timed tail."""


def measure(store: ProjectionStore, run_id: str, events: int, *, timed: int, batch: int = BATCH,
            partition: int = 0) -> tuple[float, int]:
    """Fold and store a run of ``events`` events, timing its last ``timed`` events.

    Returns:
        ``(µs per event over the timed events, MEMORY USAGE of the run key in bytes)``.

    Raises:
        RuntimeError: a batch was not applied.
    """
    evs = run_events(run_id, events, finish=False)
    with_before = "before" in inspect.signature(store.prepare_batch).parameters
    state: RunState | None = None
    applied = store.applied_offset(partition)
    spent = 0.0

    def step(lo: int, hi: int) -> float:
        nonlocal state, applied
        started = time.perf_counter()
        items = [(e, partition, applied + 1 + i) for i, e in enumerate(evs[lo:hi])]
        after = fold(items, state)
        assert after is not None
        kw: dict[str, Any] = {"before": {run_id: state}} if with_before else {}
        prepared = store.prepare_batch(partition, expected_offset=applied, new_offset=applied + len(items),
                                       states={run_id: after}, **kw)
        result = store.run_batch(prepared)
        if result.status != "applied":
            raise RuntimeError(f"batch {lo}..{hi} of {run_id}: {result}")
        state, applied = after, prepared.new_offset
        return time.perf_counter() - started

    start = events - timed
    for lo in range(0, start, BULK):
        step(lo, min(lo + BULK, start))
    for lo in range(start, events, batch):
        spent += step(lo, min(lo + batch, events))
    usage = int(store.client.memory_usage(store.run_key(partition, run_id), samples=0) or 0)
    return spent / timed * 1e6, usage


def run_event_cost(env: Any, rounds: int, long_events: int = 50_000) -> list[Any]:
    """Run pair 11 (``rounds`` rounds, short then long in each): two rows (per-event µs, Redis bytes per run)."""
    from bench._model import Row, goal_met, paired_ratios, summarise
    from runjournal.core import redis_client

    settings = env.pair_settings("event-cost", partitions=1)
    store = ProjectionStore(redis_client.client(settings), settings.topic_prefix)
    short_us: list[float] = []
    long_us: list[float] = []
    sizes: tuple[int, int] = (0, 0)
    try:
        for _ in range(rounds + 1):  # the first round warms up (discarded)
            s_us, s_bytes = measure(store, f"short-{uuid.uuid4().hex[:8]}", 100, timed=100)
            l_us, l_bytes = measure(store, f"long-{uuid.uuid4().hex[:8]}", long_events, timed=1_000)
            short_us.append(s_us)
            long_us.append(l_us)
            sizes = (s_bytes, l_bytes)
    finally:
        store.wipe()
    short_us, long_us = short_us[1:], long_us[1:]
    ratio = summarise(long_us).value / summarise(short_us).value
    goal = "≤ 1.5×"
    return [
        Row(PAIR, "µs per event (fold + store)", f"last 1,000 events of a {long_events:,}-event run",
            summarise(long_us), "a 100-event run", summarise(short_us), goal=goal, met=goal_met(ratio, goal),
            ratio_rounds=paired_ratios(long_us, short_us),
            note=f"reducer + ProjectionStore.prepare_batch/run_batch on the bench's Redis, batches of {BATCH} events"),
        Row(PAIR, "Redis bytes per run", f"MEMORY USAGE, {long_events:,}-event run", summarise([sizes[1]]),
            "100-event run", summarise([sizes[0]]), note="the run's hash (s + one field per record, node, approval)"),
    ]


def main(argv: list[str]) -> None:
    """``python -m bench.event_cost [SIZE ...]``: per-event µs of the last events of runs of each size."""
    from runjournal.core import redis_client
    from runjournal.core.settings import Settings

    sizes = [int(a) for a in argv] or [200, 4_000, 10_000, 50_000]
    client = redis_client.client(Settings.load())  # RUNJOURNAL_REDIS_URL, else the running stack's
    store = ProjectionStore(client, f"event-cost-{uuid.uuid4().hex[:8]}")
    try:
        for n in sizes:
            timed = min(n, 1_000)
            us, usage = measure(store, f"run-{n}-{uuid.uuid4().hex[:8]}", n, timed=timed)
            print(f"{n:>7} events: {us:9.1f} µs/event over the last {timed} (batches of {BATCH}); "
                  f"run key {usage / 1024:.0f} KiB", flush=True)
    finally:
        store.wipe()


if __name__ == "__main__":
    main(sys.argv[1:])

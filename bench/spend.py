"""Pair 13 — spend: a model call's reserve + settle pair, against one journaled side-effecting call.

Ours, per round: ``N`` times ``run.reserve(model, …)`` then ``settle(usage)`` on one run — two calls of the
built-in tools ``runjournal.spend.reserve`` / ``runjournal.spend.settle``, each an intent and an outcome (group
commit, as an agent runs by default) plus one Redis script on the tenant's ledger (budgets checked for the run and
the tenant) — **pairs/s**.

Anchor, same journal, same round: ``N`` times ``run.call`` of a side-effecting tool that does nothing (one intent
and one outcome, group commit) — **calls/s**. The ratio says what a model call's accounting costs next to the
journaled call it usually sits beside (two calls and two scripts: about 0.5 is the expected shape).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from bench._env import BenchEnv
from bench._model import Row, paired_ratios, summarise
from bench._rounds import Side, interleave

__all__ = ["SpendConfig", "run_spend"]

PAIR = "13 spend"


@dataclass(frozen=True)
class SpendConfig:
    calls: int = 200
    rounds: int = 3


def run_spend(env: BenchEnv, config: SpendConfig) -> list[Row]:
    """Run pair 13 (see the module docstring); returns its rows."""
    from runjournal.producers import Journal

    settings = env.pair_settings("spend", partitions=1).model_copy(update={
        "spend_prices": {"m": {"input_per_mtok": "3", "output_per_mtok": "15"}},
        "spend_budgets": {"tenant": {"model_calls": 10**12}, "run": {"output_tokens": 10**12}}})
    journal = Journal(settings, producer_id=f"bench-{uuid.uuid4().hex[:6]}")

    class Noop:
        name, side_effect, timeout_ms = "noop", True, 1000

        def __call__(self, args: dict[str, Any], key: str) -> Any:
            return {"ok": True}

        def reconcile(self, key: str) -> Any:
            return None

    def ours() -> float:
        run = journal.start_run("bench", "spend", {})
        started = time.perf_counter()
        for _ in range(config.calls):
            run.reserve("m", input_tokens=1000, output_tokens=256).settle(input_tokens=900, output_tokens=200)
        elapsed = time.perf_counter() - started
        run.succeed()
        return config.calls / elapsed

    def anchor() -> float:
        run = journal.start_run("bench", "calls", {})
        tool = Noop()
        started = time.perf_counter()
        for i in range(config.calls):
            run.call(tool, {"i": i})
        elapsed = time.perf_counter() - started
        run.succeed()
        return config.calls / elapsed

    try:
        res = interleave(PAIR, [Side("reserve+settle", ours), Side("one call", anchor)], rounds=config.rounds,
                         rotate=True)
    finally:
        journal.close()
    return [Row(PAIR, "per s", "reserve+settle", summarise(res["reserve+settle"]), "one call",
                summarise(res["one call"]),
                note=f"{config.calls} model calls' reserve + settle (two built-in calls, two ledger scripts, group "
                     "commit) vs as many journaled side-effecting calls of a no-op tool, same journal",
                ratio_rounds=paired_ratios(res["reserve+settle"], res["one call"]))]

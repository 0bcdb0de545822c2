"""Two threads on one RunHandle calling the same tool with the same arguments at once (no ``step``): two calls,
two keys, each run once — the second is never taken for a retry of the first while the first is still running
(``LastCall.running``). Spend rides the same rule: two model calls reserved at once are two reservations. A breaker
found both collapsed into one key (four of eight calls charged)."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from runjournal.core.settings import Settings
from runjournal.model.reducer import fold
from runjournal.producers import Journal
from runjournal.producers.spend import fold_spend
from tests.support.readback import read_committed

pytestmark = pytest.mark.integration


class Slow:
    """A side effect that holds every caller until ``n`` of them are inside it at once."""

    name, side_effect, timeout_ms = "slow", True, 2000

    def __init__(self, n: int) -> None:
        self.barrier = threading.Barrier(n, timeout=30)
        self.keys: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, args: dict[str, Any], key: str) -> Any:
        with self.lock:
            self.keys[key] += 1
        self.barrier.wait()
        return {"ok": True}

    def reconcile(self, key: str) -> Any:
        return None


def _records(settings: Settings, run_id: str) -> list[Any]:
    state = fold((r.event, r.partition, r.offset) for r in read_committed(settings) if r.event.run_id == run_id)
    assert state is not None
    return list(state.records.values())


def test_two_threads_calling_the_same_tool_with_the_same_args_are_two_calls(topics: Settings) -> None:
    tool = Slow(2)
    with Journal(topics, producer_id=f"sh-{uuid.uuid4().hex[:8]}") as journal:
        run = journal.start_run("t", "a", {})
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda _: run.call(tool, {"same": 1}), range(2)))
        run.succeed()
    assert results == [{"ok": True}, {"ok": True}]
    assert len(tool.keys) == 2 and set(tool.keys.values()) == {1}, tool.keys  # two keys, each run once
    committed = [r for r in _records(topics, run.run_id) if r.tool == "slow"]
    assert sorted(r.idempotency_key for r in committed) == sorted(tool.keys)


def test_two_threads_reserving_the_same_estimate_are_two_reservations(topics: Settings) -> None:
    settings = topics.model_copy(update={"spend_prices": {"m": {"input_per_mtok": "1", "output_per_mtok": "1"}}})
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    with Journal(settings, producer_id=f"sh-{uuid.uuid4().hex[:8]}") as journal:
        run = journal.start_run(tenant, "a", {})
        start = threading.Barrier(8, timeout=30)

        def model_call(i: int) -> str:
            start.wait()
            with run.reserve("m", input_tokens=10, output_tokens=10) as r:
                r.settle(input_tokens=10, output_tokens=10)
            return r.key

        with ThreadPoolExecutor(8) as pool:
            keys = list(pool.map(model_call, range(8)))
        run.succeed()
        used = journal.spend_ledger.scope(tenant, "run", run.run_id)["used"]
    assert len(set(keys)) == 8, keys  # eight model calls, eight reservations
    assert used["model_calls"] == 8 and used["input_tokens"] == 80
    assert fold_spend(_records(settings, run.run_id)).settled == used


def test_two_threads_settling_one_reservation_settle_it_once(topics: Settings) -> None:
    settings = topics.model_copy(update={"spend_prices": {"m": {"input_per_mtok": "1", "output_per_mtok": "1"}}})
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    with Journal(settings, producer_id=f"sh-{uuid.uuid4().hex[:8]}") as journal:
        run = journal.start_run(tenant, "a", {})
        r = run.reserve("m", input_tokens=100, output_tokens=100)
        with ThreadPoolExecutor(2) as pool:
            charges = list(pool.map(lambda out: r.settle(input_tokens=10, output_tokens=out), (50, 70)))
        run.succeed()
        used = journal.spend_ledger.scope(tenant, "run", run.run_id)["used"]
    assert charges[0] == charges[1] and used["model_calls"] == 1  # one settle stood, both callers got its charge
    assert used["output_tokens"] == charges[0]["output_tokens"]
    assert fold_spend(_records(settings, run.run_id)).settled == used

"""The spend ledger from asyncio code (``AsyncRunHandle.reserve``, issue 32): the same reserve and settle steps as
the sync API, driven by ``AsyncRunHandle.call`` on the real broker and Redis — charged in every scope, refused past
a budget, answered from the journal on a resumed run, and the journal's fold equal to the ledger."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core.settings import Settings
from runjournal.model.reducer import fold
from runjournal.producers.aio import AsyncJournal, AsyncRunHandle
from runjournal.producers.spend import DIMS, AsyncReservation, BudgetExceededError, fold_spend
from tests.support.readback import read_committed

pytestmark = [pytest.mark.integration]

PRICES = {"big": {"input_per_mtok": "2.50", "output_per_mtok": "10"}}


@pytest.fixture
def spend(topics: Settings) -> Settings:
    return topics.model_copy(update={"spend_prices": PRICES, "spend_budgets": {}})


def run_records(settings: Settings, run_id: str) -> list[Any]:
    records = read_committed(settings)
    state = fold((r.event, r.partition, r.offset) for r in records if r.event.run_id == run_id)
    assert state is not None
    return list(state.records.values())


def test_async_reserve_and_settle_charge_every_scope_and_the_fold_equals_the_ledger(spend: Settings) -> None:
    tenant = f"t-{uuid.uuid4().hex[:6]}"

    async def main() -> tuple[str, dict[str, int], dict[str, Any]]:
        async with await AsyncJournal.open(spend, producer_id=f"spa-{uuid.uuid4().hex[:6]}",
                                           producer_threads=4) as journal:
            ledger = journal.sync.spend_ledger
            run = await journal.start_run(tenant, "a", {})
            async with await run.reserve("big", input_tokens=1000, output_tokens=500, user_id="u1") as r:
                assert isinstance(r, AsyncReservation) and not r.recorded
                assert ledger.scope(tenant)["open"]["cost_micros"] == 7500
                charge = await r.settle({"prompt_tokens": 900, "completion_tokens": 120})
                assert await r.settle({"prompt_tokens": 1, "completion_tokens": 1}) == charge  # the first stands
            async with await run.reserve("big", input_tokens=10, output_tokens=10, step="second"):
                pass  # left without a settle: settled at the estimate
            scopes = {kind: ledger.scope(tenant, kind, ident)
                      for kind, ident in (("tenant", None), ("run", run.run_id), ("user", "u1"))}
            await run.succeed()
            return run.run_id, charge, scopes

    run_id, charge, scopes = asyncio.run(main())
    assert charge == {"input_tokens": 900, "output_tokens": 120, "cost_micros": 3450, "model_calls": 1}
    assert scopes["user"]["used"] == charge  # only the first reservation named the user
    both = {d: charge[d] + {"input_tokens": 10, "output_tokens": 10, "cost_micros": 125, "model_calls": 1}[d]
            for d in DIMS}
    assert scopes["tenant"]["used"] == scopes["run"]["used"] == both
    assert all(v == 0 for v in scopes["run"]["open"].values())
    summary = fold_spend(run_records(spend, run_id))
    assert summary.reservations == 2 and summary.open == dict.fromkeys(DIMS, 0)
    assert summary.charged() == scopes["run"]["used"]  # the journal's fold = the ledger's run scope


def test_an_async_reserve_past_a_budget_raises_and_charges_nothing(spend: Settings) -> None:
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    settings = spend.model_copy(update={"spend_budgets": {"run": {"output_tokens": 600}}})

    async def main() -> tuple[BudgetExceededError, dict[str, int], str]:
        async with await AsyncJournal.open(settings, producer_id=f"spa-{uuid.uuid4().hex[:6]}",
                                           producer_threads=4) as journal:
            run = await journal.start_run(tenant, "a", {})
            r = await run.reserve("big", input_tokens=5, output_tokens=500)
            await r.settle(input_tokens=5, output_tokens=450)
            with pytest.raises(BudgetExceededError) as refused:
                await run.reserve("big", input_tokens=5, output_tokens=200)
            used = journal.sync.spend_ledger.scope(tenant, "run", run.run_id)["used"]
            await run.fail("out of budget")
            return refused.value, used, run.run_id

    refused, used, run_id = asyncio.run(main())
    assert (refused.scope, refused.dim, refused.left, refused.asked) == (f"run:{run_id}", "output_tokens", 150, 200)
    assert used["output_tokens"] == 450 and used["model_calls"] == 1  # the refusal charged nothing
    summary = fold_spend(run_records(settings, run_id))
    assert summary.refused == 1 and summary.charged() == used


def test_a_resumed_async_run_meets_its_recorded_spend_and_charges_nothing_again(spend: Settings) -> None:
    tenant = f"t-{uuid.uuid4().hex[:6]}"

    async def agent(run: AsyncRunHandle) -> list[bool]:
        seen = []
        for i in range(2):
            async with await run.reserve("big", input_tokens=100, output_tokens=50) as r:
                seen.append(r.recorded)
                await r.settle(input_tokens=90 + i, output_tokens=40)
        return seen

    async def first() -> tuple[str, dict[str, int]]:
        journal = await AsyncJournal.open(spend, producer_id=f"dead-{uuid.uuid4().hex[:6]}", producer_threads=4)
        run = await journal.start_run(tenant, "a", {})
        assert await agent(run) == [False, False]
        await journal.close()  # the run stays unfinished: recovery hands it on
        return run.run_id, journal.sync.spend_ledger.scope(tenant)["used"]

    async def second(run_id: str) -> dict[str, int]:
        async with await AsyncJournal.open(spend, producer_id=f"live-{uuid.uuid4().hex[:6]}",
                                           producer_threads=4) as live:
            job = RecoveryJob(spend)
            try:
                await asyncio.to_thread(job.recover, stale=True)
            finally:
                job.close()
            assert await live.claim_assignment(timeout_s=10) == run_id
            resumed = await live.resume(run_id)
            assert await agent(resumed) == [True, True]
            await resumed.succeed()
            return live.sync.spend_ledger.scope(tenant)["used"]

    run_id, used = asyncio.run(first())
    assert asyncio.run(second(run_id)) == used  # nothing charged again
    assert fold_spend(run_records(spend, run_id)).settled == used


def test_two_tasks_settling_one_async_reservation_at_once_charge_it_once(spend: Settings) -> None:
    """Two tasks settle the same reservation at once (different usages): one settle step runs, both get its
    charge, and the ledger is charged once — as the sync Reservation's lock gives threads."""
    tenant = f"t-{uuid.uuid4().hex[:6]}"

    async def main() -> tuple[list[Any], dict[str, Any], str]:
        async with await AsyncJournal.open(spend, producer_id=f"spa-{uuid.uuid4().hex[:6]}",
                                           producer_threads=4) as journal:
            run = await journal.start_run(tenant, "a", {})
            r = await run.reserve("big", input_tokens=1000, output_tokens=500)
            charges = await asyncio.gather(r.settle(input_tokens=900, output_tokens=100),
                                           r.settle(input_tokens=10, output_tokens=10), return_exceptions=True)
            scope = journal.sync.spend_ledger.scope(tenant, "run", run.run_id)
            await run.succeed()
            return list(charges), scope, run.run_id

    charges, scope, run_id = asyncio.run(main())
    assert not any(isinstance(c, BaseException) for c in charges), charges
    assert charges[0] == charges[1] == scope["used"]
    assert scope["used"]["model_calls"] == 1 and all(v == 0 for v in scope["open"].values())
    summary = fold_spend(run_records(spend, run_id))
    assert summary.charged() == scope["used"]

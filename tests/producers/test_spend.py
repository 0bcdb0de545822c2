"""The spend ledger (runjournal.producers.spend; docs/design/decisions/0053-spend-ledger.md): reserve before a model
call, settle after, budgets checked atomically per tenant, charged once across retries, resumes and forks, and the
journal's fold equal to the ledger."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from runjournal.core import redis_client
from runjournal.core.settings import Settings
from runjournal.core.spend_policy import SpendConfigError, SpendPolicy, SpendValueError, UnknownCurrencyError, Usage
from runjournal.model.reducer import fold
from runjournal.producers import Journal
from runjournal.producers.spend import (
    DIMS,
    RESERVE_TOOL,
    BudgetExceededError,
    SettleWithoutReservationError,
    SpendLedger,
    UnknownModelError,
    fold_spend,
)
from tests.support.readback import events_of, read_committed, take_over

PRICES = {"small": {"input_per_mtok": "0.15", "output_per_mtok": "0.60"},
          "big": {"input_per_mtok": "2.50", "output_per_mtok": "10"}}


# -- the policy: pure ------------------------------------------------------------------------------------------------
def test_amounts_are_integers_and_money_is_micro_units_rounded_up() -> None:
    policy = SpendPolicy.parse("usd", PRICES, {})
    assert policy.currency == "USD"
    assert policy.amounts("big", Usage(1000, 100)) == {"input_tokens": 1000, "output_tokens": 100,
                                                      "cost_micros": 3500, "model_calls": 1}
    assert policy.cost_micros("small", Usage(1, 1)) == math.ceil(0.15 + 0.60)  # 0.75 micro-units → 1
    with pytest.raises(UnknownModelError, match="no price for model 'other'"):
        policy.cost_micros("other", Usage(1, 1))
    assert SpendPolicy.parse("EUR", {**PRICES, "*": {"input_per_mtok": 1}}, {}).cost_micros("other", Usage(2, 0)) == 2
    assert SpendPolicy.parse("USD", {}, {}).cost_micros("anything", Usage(10**6, 10**6)) == 0  # no prices: not counted


@pytest.mark.parametrize("bad", [-1, 1.5, float("nan"), float("inf"), True, "10", None, 2**53])
def test_bad_token_counts_are_named_errors(bad: Any) -> None:
    with pytest.raises(SpendValueError):
        Usage(input_tokens=bad)


@pytest.mark.parametrize(("currency", "prices", "budgets", "error"), [
    ("XYZ", {}, {}, UnknownCurrencyError),
    ("USD", {"m": {"input_per_mtok": "-1"}}, {}, SpendConfigError),
    ("USD", {"m": {"input_per_mtok": "nan"}}, {}, SpendConfigError),
    ("USD", {"m": {"per_token": 1}}, {}, SpendConfigError),
    ("USD", {}, {"team": {"model_calls": 1}}, SpendConfigError),
    ("USD", {}, {"run:x": {"model_calls": 1}}, SpendConfigError),
    ("USD", {}, {"tenant": {"dollars": 1}}, SpendConfigError),
    ("USD", {}, {"tenant": {"cost": 1}}, SpendConfigError),  # a money budget with no prices
    ("USD", PRICES, {"tenant": {"cost": -1}}, SpendConfigError),
    ("USD", {}, {"tenant": {"model_calls": -1}}, SpendValueError),
])
def test_bad_prices_and_budgets_are_named_errors_at_settings_load(currency: str, prices: dict, budgets: dict,
                                                                   error: type[Exception]) -> None:
    with pytest.raises(error):
        SpendPolicy.parse(currency, prices, budgets)
    with pytest.raises(ValueError):  # the same, when the settings are loaded
        Settings(spend_currency=currency, spend_prices=prices, spend_budgets=budgets)


# -- the ledger on the real stack ------------------------------------------------------------------------------------
@pytest.fixture
def spend(topics: Settings) -> Settings:
    return topics.model_copy(update={"spend_prices": PRICES, "spend_budgets": {}})


@pytest.fixture
def journal(spend: Settings) -> Iterator[Journal]:
    with Journal(spend, producer_id=f"sp-{uuid.uuid4().hex[:8]}") as j:
        yield j


def run_records(settings: Settings, run_id: str) -> list[Any]:
    records = read_committed(settings)
    state = fold((r.event, r.partition, r.offset) for r in records if r.event.run_id == run_id)
    assert state is not None
    return list(state.records.values())


@pytest.mark.integration
def test_reserve_then_settle_charges_the_actual_usage_in_every_scope(journal: Journal, spend: Settings) -> None:
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    run = journal.start_run(tenant, "a", {})
    with run.reserve("big", input_tokens=1000, output_tokens=500, user_id="u1") as r:
        ledger = journal.spend_ledger
        assert ledger.scope(tenant)["open"] == {"input_tokens": 1000, "output_tokens": 500, "cost_micros": 7500,
                                                 "model_calls": 1}
        assert not r.recorded
        charge = r.settle({"prompt_tokens": 900, "completion_tokens": 120})
    assert charge == {"input_tokens": 900, "output_tokens": 120, "cost_micros": 3450, "model_calls": 1}
    for kind, ident in (("tenant", None), ("run", run.run_id), ("user", "u1")):
        scope = ledger.scope(tenant, kind, ident)
        assert scope["used"] == charge, kind
        assert all(v == 0 for v in scope["open"].values()), kind
    with run.reserve("small", input_tokens=10, output_tokens=10):  # left without a settle: charged at the estimate
        pass
    run.succeed()
    summary = fold_spend(run_records(spend, run.run_id))
    assert summary.reservations == 2 and summary.open == dict.fromkeys(DIMS, 0)
    assert summary.settled == ledger.scope(tenant, "run", run.run_id)["used"]  # the journal's fold = the ledger
    assert summary.by_model["small"] == {"input_tokens": 10, "output_tokens": 10, "cost_micros": 8, "model_calls": 1}


@pytest.mark.integration
def test_a_reserve_past_a_budget_is_refused_with_what_is_left_and_charges_nothing(spend: Settings) -> None:
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    settings = spend.model_copy(update={"spend_budgets": {f"tenant:{tenant}": {"output_tokens": 1000},
                                                          "run": {"model_calls": 3}}})
    with Journal(settings, producer_id=f"sp-{uuid.uuid4().hex[:8]}") as journal:
        run = journal.start_run(tenant, "a", {})
        with run.reserve("small", input_tokens=5, output_tokens=600) as r:
            r.settle(input_tokens=5, output_tokens=700)
        with pytest.raises(BudgetExceededError) as refused:
            run.reserve("small", input_tokens=5, output_tokens=400)
        assert (refused.value.scope, refused.value.dim, refused.value.left) == (f"tenant:{tenant}", "output_tokens",
                                                                                300)
        assert journal.spend_ledger.scope(tenant)["used"]["output_tokens"] == 700  # nothing charged by the refusal
        run.reserve("small", input_tokens=5, output_tokens=300).settle(input_tokens=1, output_tokens=1)
        with pytest.raises(BudgetExceededError) as calls:  # the run's default budget: 3 model calls
            for _ in range(3):
                run.reserve("small", input_tokens=0, output_tokens=0).settle()
        assert calls.value.scope == f"run:{run.run_id}" and calls.value.dim == "model_calls"
        # an operator raises the tenant's budget: the next reserve passes
        journal.spend_ledger.set_limit(tenant, "run", run.run_id, "model_calls", 10)
        run.reserve("small", input_tokens=0, output_tokens=0).settle()
        run.succeed()
    summary = fold_spend(run_records(settings, run.run_id))
    # the second refusal was retried (same step, same estimate) after the raise: its record is the later attempt
    assert summary.refused == 1 and summary.settled["model_calls"] == 4


@pytest.mark.integration
def test_the_ledger_refuses_a_settle_without_its_reservation_and_settles_once(journal: Journal) -> None:
    ledger: SpendLedger = journal.spend_ledger
    tenant, run_id = f"t-{uuid.uuid4().hex[:6]}", "r1"
    amounts = {"input_tokens": 1, "output_tokens": 1, "cost_micros": 1, "model_calls": 1}
    with pytest.raises(SettleWithoutReservationError):
        ledger.settle(tenant_id=tenant, run_id=run_id, user_id=None, key="k1", settle_key="s1", actual=amounts)
    ledger.reserve(tenant_id=tenant, run_id=run_id, user_id=None, key="k1", model="small", estimate=amounts)
    ledger.reserve(tenant_id=tenant, run_id=run_id, user_id=None, key="k1", model="small", estimate=amounts)  # retry
    assert ledger.scope(tenant)["used"]["model_calls"] == 1
    twice = {**amounts, "input_tokens": 5}
    first = ledger.settle(tenant_id=tenant, run_id=run_id, user_id=None, key="k1", settle_key="s1", actual=twice)
    again = ledger.settle(tenant_id=tenant, run_id=run_id, user_id=None, key="k1", settle_key="s1", actual=amounts)
    assert first == again and ledger.scope(tenant)["used"]["input_tokens"] == 5
    assert ledger.settled_by(tenant, run_id, "s1")["usage"] == twice


@pytest.mark.integration
def test_a_resumed_run_meets_its_recorded_spend_and_charges_nothing_again(spend: Settings) -> None:
    tenant = f"t-{uuid.uuid4().hex[:6]}"

    def agent(run: Any) -> list[bool]:
        seen = []
        for i in range(3):
            with run.reserve("big", input_tokens=100, output_tokens=50) as r:
                seen.append(r.recorded)
                r.settle(input_tokens=90 + i, output_tokens=40)
        return seen

    dead = Journal(spend, producer_id=f"dead-{uuid.uuid4().hex[:6]}")
    run = dead.start_run(tenant, "a", {})
    assert agent(run) == [False, False, False]
    run_id = run.run_id
    dead.close()
    used = dead.spend_ledger.scope(tenant)["used"]
    with Journal(spend, producer_id=f"live-{uuid.uuid4().hex[:6]}") as live:
        resumed = take_over(live, spend, run_id)
        assert agent(resumed) == [True, True, True]
        with resumed.reserve("big", input_tokens=1, output_tokens=1) as r:
            assert not r.recorded
        resumed.succeed()
        after = live.spend_ledger.scope(tenant)["used"]
    assert after["model_calls"] == used["model_calls"] + 1 and after["input_tokens"] == used["input_tokens"] + 1
    assert fold_spend(run_records(spend, run_id)).settled == after


@pytest.mark.integration
def test_a_refused_reserve_is_journaled_as_a_retryable_failure(spend: Settings) -> None:
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    settings = spend.model_copy(update={"spend_budgets": {"tenant": {"model_calls": 0}}})
    with Journal(settings, producer_id=f"sp-{uuid.uuid4().hex[:8]}") as journal:
        run = journal.start_run(tenant, "a", {})
        with pytest.raises(BudgetExceededError):
            run.reserve("small", input_tokens=1, output_tokens=1)
        run.fail("out of budget")
    failed = [e for e in events_of(read_committed(settings), run.run_id) if e.payload.get("tool") == RESERVE_TOOL]
    assert [e.type.value for e in failed] == ["TOOL_CALL_INTENDED", "TOOL_CALL_FAILED"]
    assert failed[1].payload["retryable"] is True and "budget tenant:" in failed[1].payload["error"]
    assert redis_client.client(settings).exists(journal.spend_ledger.keys.spend_tenant(tenant)) == 0


@pytest.mark.integration
def test_a_fork_charges_only_what_runs_after_its_fork_point_and_its_budget_starts_there(spend: Settings) -> None:
    from runjournal.consumers.ops.control import Operator
    from runjournal.schemas import EventType

    tenant = f"t-{uuid.uuid4().hex[:6]}"
    settings = spend.model_copy(update={"spend_budgets": {"run": {"model_calls": 3}}})

    def agent(run: Any) -> list[bool]:
        seen = []
        for i in range(3):
            with run.reserve("big", input_tokens=100, output_tokens=50) as r:
                seen.append(r.recorded)
                r.settle(input_tokens=10 * (i + 1), output_tokens=5)
        return seen

    with Journal(settings, producer_id=f"sp-{uuid.uuid4().hex[:8]}", lease_ttl_ms=1500) as journal, \
            Operator(settings, wait_s=10, poll_s=0.1) as operator:
        source = journal.start_run(tenant, "a", {})
        agent(source)
        source.succeed()
        ledger = journal.spend_ledger
        before = ledger.scope(tenant)["used"]
        settles = [e.seq for e in events_of(read_committed(settings), source.run_id)
                   if e.type is EventType.TOOL_CALL_COMMITTED and e.payload["tool"] == "runjournal.spend.settle"]
        forked = operator.fork(source.run_id, at_seq=settles[1], reason="retry the last turn", requested_by="ops")
        assert forked.outcome == "forked", forked
        assert journal.claim_assignment(10) == forked.fork_run_id
        fork = journal.resume(forked.fork_run_id)
        assert agent(fork) == [True, True, False]  # two model calls recorded at the fork point: not charged again
        # the fork's run budget (3 calls) started from the 2 recorded at its fork point: a fourth is refused
        with pytest.raises(BudgetExceededError) as refused:
            fork.reserve("big", input_tokens=1, output_tokens=1)
        assert refused.value.scope == f"run:{fork.run_id}" and refused.value.used == 3
        fork.succeed()
        after = ledger.scope(tenant)["used"]
        fork_scope = ledger.scope(tenant, "run", fork.run_id)["used"]
    assert after["model_calls"] == before["model_calls"] + 1  # the tenant pays only the call after the fork point
    assert after["input_tokens"] == before["input_tokens"] + 30
    assert fork_scope == fold_spend(run_records(settings, fork.run_id)).settled  # its fold: the copied + its own


def test_a_providers_usage_object_settles_and_an_ambiguous_report_is_a_named_error() -> None:
    class CompletionUsage:  # the shape of openai's: attributes, not a mapping
        prompt_tokens, completion_tokens, total_tokens = 12, 5, 17

    assert Usage.of(CompletionUsage()) == Usage(12, 5)
    assert Usage.of({"input_tokens": 3, "output_tokens": 4}) == Usage(3, 4)  # LangChain's usage_metadata
    with pytest.raises(SpendValueError, match="which is it"):
        Usage.of({"input_tokens": 0, "prompt_tokens": 50, "output_tokens": 1})
    with pytest.raises(SpendValueError, match="no input_tokens"):
        Usage.of({"input_tokens": None, "output_tokens": 1})


@pytest.mark.integration
def test_amounts_up_to_2_53_stay_exact_in_the_ledger_and_the_journal(journal: Journal) -> None:
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    big = 2**53 - 3
    run = journal.start_run(tenant, "a", {})
    policy_free = run.reserve("small", input_tokens=0, output_tokens=0)
    charge = policy_free.settle(Usage(input_tokens=big, output_tokens=0))
    assert charge["input_tokens"] == big and isinstance(charge["input_tokens"], int)
    assert journal.spend_ledger.scope(tenant, "run", run.run_id)["used"]["input_tokens"] == big
    run.succeed()


@pytest.mark.integration
def test_a_remade_model_call_reporting_other_usage_on_resume_meets_its_recorded_settle(spend: Settings) -> None:
    """Re-executed code calls the model again and gets other usage: the recorded settle answers (charged once),
    never a PlanMismatchError for a model that is not deterministic."""
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    dead = Journal(spend, producer_id=f"dead-{uuid.uuid4().hex[:6]}", lease_ttl_ms=1500)
    run = dead.start_run(tenant, "a", {})
    with run.reserve("big", input_tokens=100, output_tokens=50) as r:
        r.settle(input_tokens=90, output_tokens=40)
    run_id = run.run_id
    dead.close()
    with Journal(spend, producer_id=f"live-{uuid.uuid4().hex[:6]}") as live:
        resumed = take_over(live, spend, run_id)
        with resumed.reserve("big", input_tokens=100, output_tokens=50) as again:
            charge = again.settle(input_tokens=95, output_tokens=47)  # the model answered differently this time
        resumed.succeed()
        used = live.spend_ledger.scope(tenant, "run", run_id)["used"]
    assert again.recorded and charge["input_tokens"] == 90 and used["input_tokens"] == 90 and used["model_calls"] == 1


@pytest.mark.integration
def test_a_cancel_requested_between_a_reserve_and_its_settle_waits_for_the_settle(spend: Settings) -> None:
    from runjournal.consumers.ops.control import Operator
    from runjournal.producers import RunCancelledError

    tenant = f"t-{uuid.uuid4().hex[:6]}"
    with Journal(spend, producer_id=f"sp-{uuid.uuid4().hex[:8]}") as journal, \
            Operator(spend, wait_s=0, poll_s=0.1) as operator:
        run = journal.start_run(tenant, "a", {})
        r = run.reserve("big", input_tokens=100, output_tokens=50)
        operator.cancel(run.run_id, reason="stop spending", requested_by="ops@test")
        deadline = time.monotonic() + 10
        while run.pending_request() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # the owner reads its requests with its heartbeat
        assert run.pending_request() is not None  # the cancel is pending at the settle
        r.settle(input_tokens=80, output_tokens=30)  # the money was spent: the settle goes through
        with pytest.raises(RunCancelledError):
            run.reserve("big", input_tokens=1, output_tokens=1)  # the next step is a boundary: the cancel
        scope = journal.spend_ledger.scope(tenant, "run", run.run_id)
    assert scope["used"]["input_tokens"] == 80 and all(v == 0 for v in scope["open"].values())
    assert fold_spend(run_records(spend, run.run_id)).settled == scope["used"]


@pytest.mark.integration
def test_a_fork_between_a_reserve_and_its_settle_settles_the_copied_reservation_in_its_own_scope(
        spend: Settings) -> None:
    """The campaign's controls fault forked a run right after a reserve: the fork's settle named a reservation its
    ledger never held (SettleWithoutReservationError, the fork never ended). The copied reservation is settled in the
    fork's scope only; the tenant was charged where it was reserved."""
    from runjournal.consumers.ops.control import Operator
    from runjournal.schemas import EventType

    tenant = f"t-{uuid.uuid4().hex[:6]}"

    def agent(run: Any) -> None:
        for i in range(2):
            with run.reserve("big", input_tokens=100, output_tokens=50) as r:
                r.settle(input_tokens=10 * (i + 1), output_tokens=5)

    with Journal(spend, producer_id=f"sp-{uuid.uuid4().hex[:8]}", lease_ttl_ms=1500) as journal, \
            Operator(spend, wait_s=10, poll_s=0.1) as operator:
        source = journal.start_run(tenant, "a", {})
        agent(source)
        source.succeed()
        before = journal.spend_ledger.scope(tenant)["used"]
        reserves = [e.seq for e in events_of(read_committed(spend), source.run_id)
                    if e.type is EventType.TOOL_CALL_COMMITTED and e.payload["tool"] == RESERVE_TOOL]
        forked = operator.fork(source.run_id, at_seq=reserves[1], reason="after the reserve", requested_by="ops")
        assert forked.outcome == "forked", forked
        assert journal.claim_assignment(10) == forked.fork_run_id
        fork = journal.resume(forked.fork_run_id)
        agent(fork)  # the second reservation is copied, its settle is the fork's own
        fork.succeed()
        ledger = journal.spend_ledger
        after, scope = ledger.scope(tenant)["used"], ledger.scope(tenant, "run", fork.run_id)
    assert after == before  # nothing new ran: the tenant pays nothing more
    assert scope["used"] == fold_spend(run_records(spend, fork.run_id)).settled
    assert scope["used"]["input_tokens"] == 30 and scope["used"] == scope["base"]  # all of it copied spend

"""``runjournal spend`` as a user runs it (a subprocess, the real stack; issue 32, docs/guide/spend.md § See it): a
run's spend is the fold of its records next to the ledger's run scope (a disagreement flagged), a tenant's and a
user's budgets, ``spend budget`` sets and clears an operator's limit the next reserve meets, a bad limit is
``SpendValueError`` (exit 2) — and the agent's ``runjournal_spend_*_total`` counters in base units."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from runjournal.core import redis_client
from runjournal.core.settings import Settings
from runjournal.model.reducer import fold
from runjournal.producers import Journal
from runjournal.producers.metrics import JournalMetrics
from runjournal.producers.spend import BudgetExceededError, SpendLedger, fold_spend
from tests.cli.test_paths import json_error, rj
from tests.package.test_docs import ROOT
from tests.support.readback import read_committed

pytestmark = pytest.mark.integration

PRICES = {"small": {"input_per_mtok": "0.15", "output_per_mtok": "0.60"},
          "big": {"input_per_mtok": "2.50", "output_per_mtok": "10"}}


@pytest.fixture
def spend(topics: Settings) -> Settings:
    return topics.model_copy(update={"spend_prices": PRICES, "spend_budgets": {}})


@pytest.fixture
def env(spend: Settings, service_env: dict[str, str]) -> dict[str, str]:
    """The child's environment: the test's stack and prices, and this tree's code."""
    own = {k: v for k, v in spend.as_env().items() if k.startswith("RUNJOURNAL_SPEND_")}
    return {**service_env, **own, "PYTHONPATH": str(ROOT)}


def ok(env: dict[str, str], *args: str) -> Any:
    proc, _ = rj(env, *args)
    assert proc.returncode == 0, (args, proc.stderr[-3000:])
    return proc


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def run_records(settings: Settings, run_id: str) -> list[Any]:
    state = fold((r.event, r.partition, r.offset) for r in read_committed(settings) if r.event.run_id == run_id)
    assert state is not None
    return list(state.records.values())


def test_spend_of_a_run_is_the_journal_fold_next_to_the_ledger(spend: Settings, env: dict[str, str]) -> None:
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    registry = CollectorRegistry()
    with Journal(spend, producer_id=f"sp-{uuid.uuid4().hex[:8]}", metrics=JournalMetrics(registry)) as journal:
        run = journal.start_run(tenant, "a", {})
        with run.reserve("big", input_tokens=1000, output_tokens=500, user_id="u1") as r:
            r.settle({"prompt_tokens": 900, "completion_tokens": 120})
        run.reserve("small", input_tokens=10, output_tokens=10)  # never settled: open (unknown spend)
        run.succeed()
        ledger = journal.spend_ledger
        # the agent's counters, base units: estimates reserved, actual usage settled
        assert sample(registry, "runjournal_spend_reserved_total", model="big", dim="cost_micros") == 7500
        assert sample(registry, "runjournal_spend_settled_total", model="big", dim="cost_micros") == 3450
        assert sample(registry, "runjournal_spend_settled_total", model="big", dim="input_tokens") == 900
        assert sample(registry, "runjournal_spend_reserved_total", model="small", dim="model_calls") == 1
        assert sample(registry, "runjournal_spend_settled_total", model="small", dim="model_calls") == 0
    ok(env, "projector", "--until-caught-up", "--json")

    doc = json.loads(ok(env, "spend", run.run_id, "--json").stdout)
    summary = fold_spend(run_records(spend, run.run_id))
    assert doc["journal"] == json.loads(json.dumps({**summary.as_dict(), "reconciled_charge": summary.charged()}))
    assert doc["ledger"] == ledger.scope(tenant, "run", run.run_id)
    assert doc["match"] is True and doc["mismatch"] == {}
    assert doc["tenant_id"] == tenant and doc["currency"] == "USD"
    assert doc["journal"]["settled"]["cost_micros"] == 3450 and doc["journal"]["open"]["model_calls"] == 1
    assert doc["journal"]["by_model"]["big"]["output_tokens"] == 120
    assert json.loads(ok(env, "spend", "--run", run.run_id, "--json").stdout) == doc  # the same, spelled --run
    text = ok(env, "spend", run.run_id).stdout
    assert "0.003450 USD" in text and "journal and ledger agree" in text

    # the ledger charged what the journal does not say (a reserve by hand): flagged, per dim
    ledger.reserve(tenant_id=tenant, run_id=run.run_id, user_id=None, key="by-hand", model="small",
                   estimate={"input_tokens": 0, "output_tokens": 0, "cost_micros": 0, "model_calls": 1})
    doc = json.loads(ok(env, "spend", run.run_id, "--json").stdout)
    assert doc["match"] is False
    assert doc["mismatch"]["used"] == {"model_calls": {"journal": 2, "ledger": 3}}
    assert "MISMATCH used model_calls" in ok(env, "spend", run.run_id).stdout

    missing, _ = rj(env, "spend", "no-such-run", "--json")
    assert missing.returncode == 1 and json_error(missing)["error"] == "RunNotFound"


def test_spend_of_a_tenant_and_a_user_from_the_ledger(spend: Settings, env: dict[str, str]) -> None:
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    with Journal(spend, producer_id=f"sp-{uuid.uuid4().hex[:8]}") as journal:
        run = journal.start_run(tenant, "a", {})
        run.reserve("big", input_tokens=100, output_tokens=10, user_id="u1").settle(input_tokens=80, output_tokens=5)
        run.succeed()
        ledger = journal.spend_ledger
    doc = json.loads(ok(env, "spend", "--tenant", tenant, "--user", "u1", "--json").stdout)
    assert doc["currency"] == "USD" and doc["user_id"] == "u1"
    assert doc["scopes"] == [{"scope": f"tenant:{tenant}", **ledger.scope(tenant)},
                             {"scope": "user:u1", **ledger.scope(tenant, "user", "u1")}]
    assert doc["scopes"][0]["used"]["cost_micros"] == 250 and isinstance(doc["scopes"][0]["used"]["cost_micros"], int)
    text = ok(env, "spend", "--tenant", tenant).stdout
    assert "0.000250 USD" in text and f"tenant:{tenant}" in text
    for argv in ((run.run_id, "--tenant", tenant), ("--user", "u1")):  # a run and a tenant; neither
        usage, _ = rj(env, "spend", *argv, "--json")
        assert usage.returncode == 2 and json_error(usage)["error"] == "UsageError", argv


@pytest.mark.parametrize("argv", [["spend", "r1", "--json"], ["spend", "--tenant", "t", "--json"],
                                  ["spend", "budget", "--tenant", "t", "--dim", "model_calls", "--limit", "3",
                                   "--json"]], ids=lambda a: "-".join(a[:2]))
def test_no_stack_is_named_with_the_fix(service_env: dict[str, str], argv: list[str]) -> None:
    from runjournal.deploy.procs import free_port

    env = {**service_env, "PYTHONPATH": str(ROOT), "RUNJOURNAL_BOOTSTRAP": f"127.0.0.1:{free_port()}",
           "RUNJOURNAL_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    proc, _ = rj(env, *argv, timeout=60)
    doc = json_error(proc)
    assert doc["error"] == "StackUnavailableError" and "runjournal stack up" in doc["message"], doc


def test_spend_budget_sets_the_limit_the_next_reserve_meets(spend: Settings, env: dict[str, str]) -> None:
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    registry = CollectorRegistry()
    with Journal(spend, producer_id=f"sp-{uuid.uuid4().hex[:8]}", metrics=JournalMetrics(registry)) as journal:
        run = journal.start_run(tenant, "a", {})
        run.reserve("big", input_tokens=1000, output_tokens=0).settle(input_tokens=1000, output_tokens=0)  # 2500
        proc = ok(env, "spend", "budget", "--tenant", tenant, "--dim", "cost", "--limit", "0.004", "--by", "alice",
                  "--reason", "pilot cap", "--json")
        doc = json.loads(proc.stdout)
        assert doc == {"tenant_id": tenant, "scope": f"tenant:{tenant}", "dim": "cost_micros", "limit": 4000,
                       "cleared": False, "effective_limit": 4000, "used": 2500, "currency": "USD", "by": "alice",
                       "reason": "pilot cap"}
        logged = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
        assert any(e["msg"] == "spend budget set" and e["by"] == "alice" and e["reason"] == "pilot cap"
                   and e["limit"] == 4000 for e in logged), proc.stderr
        with pytest.raises(BudgetExceededError) as refused:
            run.reserve("big", input_tokens=1000, output_tokens=0)  # 2500 more: past 4000
        assert (refused.value.scope, refused.value.dim, refused.value.left) == (f"tenant:{tenant}", "cost_micros",
                                                                                1500)
        assert sample(registry, "runjournal_spend_refused_total", dim="cost_micros", scope_kind="tenant") == 1

        # a run's and a user's budget; then the tenant's removed: the reserve passes
        ok(env, "spend", "budget", "--tenant", tenant, "--run", run.run_id, "--dim", "model_calls", "--limit", "1")
        with pytest.raises(BudgetExceededError) as calls:
            run.reserve("small", input_tokens=1, output_tokens=1)
        assert calls.value.scope == f"run:{run.run_id}" and calls.value.dim == "model_calls"
        assert sample(registry, "runjournal_spend_refused_total", dim="model_calls", scope_kind="run") == 1
        ok(env, "spend", "budget", "--tenant", tenant, "--run", run.run_id, "--dim", "model_calls", "--clear")
        ok(env, "spend", "budget", "--tenant", tenant, "--user", "u9", "--dim", "output_tokens", "--limit", "5")
        with pytest.raises(BudgetExceededError) as user:
            run.reserve("small", input_tokens=1, output_tokens=6, user_id="u9")
        assert user.value.scope == "user:u9"
        run.reserve("small", input_tokens=1, output_tokens=4, user_id="u9").settle(input_tokens=1, output_tokens=4)
        # alert-ready: how close each limited budget is, after the last reserve (4 of the user's 5 output tokens)
        assert sample(registry, "runjournal_spend_budget_used_ratio", tenant="", scope_kind="user",
                      dim="output_tokens") == pytest.approx(0.8)
        cleared = json.loads(ok(env, "spend", "budget", "--tenant", tenant, "--dim", "cost", "--clear",
                                "--json").stdout)
        assert cleared["cleared"] is True and cleared["limit"] is None and cleared["effective_limit"] is None
        run.reserve("big", input_tokens=1000, output_tokens=0).settle(input_tokens=1000, output_tokens=0)
        run.succeed()
        assert journal.spend_ledger.scope(tenant)["used"]["cost_micros"] == 5003  # 2500 + 3 (small: 1 in, 4 out) + 2500
        assert journal.spend_ledger.scope(tenant)["limit"] == {}


@pytest.mark.parametrize(("dim", "limit", "says"), [
    ("cost", "-1", "must be an amount >= 0"),
    ("model_calls", "-1", "whole number of model_calls"),
    ("output_tokens", "1.5", "whole number of output_tokens"),
    ("cost", "nan", "finite"),
    ("cost", "0.0000001", "micro-unit"),
    ("dollars", "1", "--dim 'dollars'"),
    ("model_calls", "1e999999999", "at most 2**53 - 1"),  # refused at once (it once hung the command for minutes)
    ("cost", "1e99999999", "at most 2**53 - 1"),
])
def test_a_bad_budget_is_a_named_error_and_changes_nothing(spend: Settings, env: dict[str, str], dim: str,
                                                           limit: str, says: str) -> None:
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    bad, _ = rj(env, "spend", "budget", "--tenant", tenant, "--dim", dim, "--limit", limit, "--json")
    doc = json_error(bad)
    assert bad.returncode == 2 and doc["error"] == "SpendValueError" and says in doc["message"], doc
    ledger = SpendLedger(redis_client.client(spend), spend.topic_prefix, spend.spend_policy())
    assert ledger.scope(tenant) == {"used": {}, "open": {}, "base": {}, "limit": {}}


@pytest.mark.parametrize(("argv", "says"), [
    (["spend", "--user", "u1"], "--user needs --tenant"),
    (["spend", "r1", "--user", "u1"], "--user needs --tenant"),
    (["spend"], "name a run"),
])
def test_spend_usage_errors_name_the_fix(service_env: dict[str, str], argv: list[str], says: str) -> None:
    """A user without a tenant is told to add --tenant (not to name a run); a bare ``spend`` to name one."""
    bad, _ = rj(service_env, *argv, "--json")
    doc = json_error(bad)
    assert bad.returncode == 2 and says in doc["message"], doc

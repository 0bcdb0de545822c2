"""The campaign's spend check (``runjournal.demo.verify.spend_checks``) on a fork that took no step of its own after
its fork point: its ledger scope never started (a run's scope starts at its first reserve or settle), so its spend
is all copied — its base, never charged to the tenant. The CI rehearsal of 2026-12-04 failed on it
(``ledger 0 != journal 8 calls`` for the controls fault's fork)."""

from __future__ import annotations

import uuid

import pytest

from runjournal.core import redis_client
from runjournal.core.settings import Settings
from runjournal.demo.verify import spend_checks
from runjournal.model.reducer import fold
from runjournal.producers import Journal
from runjournal.schemas import EventType
from tests.producers.test_spend import PRICES
from tests.support.readback import events_of, read_committed

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_fork_with_no_step_of_its_own_matches_its_copied_spend(topics: Settings) -> None:
    from runjournal.consumers.ops.control import Operator

    settings = topics.model_copy(update={"spend_prices": PRICES, "spend_budgets": {}})
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    with Journal(settings, producer_id=f"sp-{uuid.uuid4().hex[:8]}", lease_ttl_ms=1500) as journal, \
            Operator(settings, wait_s=10, poll_s=0.1) as operator:
        source = journal.start_run(tenant, "a", {})
        for i in range(2):
            with source.reserve("big", input_tokens=100, output_tokens=50) as r:
                r.settle(input_tokens=10 * (i + 1), output_tokens=5)
        source.succeed()
        events = events_of(read_committed(settings), source.run_id)
        last = max(e.seq for e in events if e.type is EventType.TOOL_CALL_COMMITTED)
        forked = operator.fork(source.run_id, at_seq=last, reason="no step after", requested_by="ops")
        assert forked.outcome == "forked", forked
        assert journal.claim_assignment(10) == forked.fork_run_id
        fork = journal.resume(forked.fork_run_id)
        fork.succeed()  # no reserve, no settle: its ledger scope never starts
    read = read_committed(settings)
    states = {rid: fold((r.event, r.partition, r.offset) for r in read if r.event.run_id == rid)
              for rid in (source.run_id, fork.run_id)}
    checked = [(source.run_id, None, None), (fork.run_id, None, source.run_id)]
    out = spend_checks(settings, redis_client.client(settings), checked, states)  # type: ignore[arg-type]
    assert out["mismatches"] == [], out
    assert out["tenants"][tenant]["used"]["model_calls"] == 2  # the fork's copied calls are never charged again

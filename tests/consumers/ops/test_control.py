"""Operator controls (issue 31): cancel, pause and resume a run, against the real broker and Redis.

docs/design/decisions/0047-operator-controls.md. The witness of "never twice, never dropped" is a ledger of the tool's
own (what really ran, by idempotency key); the journal is read back to the end (a fold), never the projection alone.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from runjournal.consumers.ops.control import ControlRefusedError, Operator
from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core.settings import Settings
from runjournal.model.reducer import CallStatus, RunStatus
from runjournal.producers import (
    Journal,
    Outcome,
    RunCancelledError,
    RunPausedError,
    stop_requested,
)
from runjournal.schemas import EventType
from tests.support.readback import events_of, read_committed

pytestmark = pytest.mark.integration

LEASE_MS = 1200  # heartbeats every 0.4 s: a request is seen within half a second


class Ledger:
    """A side-effecting tool with a provider-side ledger (what really ran, by key) and ``reconcile``."""

    name = "charge"
    side_effect = True
    timeout_ms = 500

    def __init__(self, *, block: threading.Event | None = None) -> None:
        self.ran: dict[str, int] = {}
        self.block = block
        self.started = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        self.started.set()
        if self.block is not None:
            assert self.block.wait(30)
        with self.lock:
            self.ran[idempotency_key] = self.ran.get(idempotency_key, 0) + 1
        return {"charged": args.get("amount"), "key": idempotency_key}

    def reconcile(self, idempotency_key: str) -> Outcome | None:
        with self.lock:
            n = self.ran.get(idempotency_key, 0)
        return Outcome(executed=bool(n), result={"charged": None, "key": idempotency_key} if n else None)

    def total(self) -> int:
        return sum(self.ran.values())


@pytest.fixture
def journal(topics: Settings) -> Iterator[Journal]:
    with Journal(topics, producer_id=f"a-{uuid.uuid4().hex[:8]}", lease_ttl_ms=LEASE_MS) as j:
        yield j


@pytest.fixture
def operator(topics: Settings) -> Iterator[Operator]:
    with Operator(topics, wait_s=20, poll_s=0.1) as op:
        yield op


def _types(topics: Settings, run_id: str) -> list[str]:
    return [e.type.value for e in events_of(read_committed(topics), run_id)]


def _fold(operator: Operator, run_id: str) -> Any:
    return operator._fold(run_id)  # noqa: SLF001 - the journal read to its end, not the projection


def test_a_live_owner_cancels_at_its_next_call_and_nothing_after_the_request_runs(
        topics: Settings, journal: Journal, operator: Operator) -> None:
    tool = Ledger()
    run = journal.start_run("t", "payer", {"n": 3})
    assert run.call(tool, {"amount": 1})["charged"] == 1
    results: list[Any] = []
    asking = threading.Thread(target=lambda: results.append(operator.cancel(run.run_id, reason="runaway loop",
                                                                            requested_by="ops@test")))
    asking.start()
    deadline = time.monotonic() + 10
    with pytest.raises(RunCancelledError) as info:
        while time.monotonic() < deadline:  # the agent's loop: a call per step until the request stops it
            run.call(tool, {"amount": 2})
            time.sleep(0.05)
    asking.join(30)
    (result,) = results
    assert result.outcome == "cancelled" and result.seen is True, result
    assert info.value.requested_by == "ops@test" and info.value.reason == "runaway loop"
    types = _types(topics, run.run_id)
    assert types[-1] == "RUN_CANCELLED"
    state = _fold(operator, run.run_id)
    assert state.status is RunStatus.CANCELLED and state.requested_by == "ops@test" and state.error == "runaway loop"
    intents = types.count("TOOL_CALL_INTENDED")
    outcomes = types.count("TOOL_CALL_COMMITTED") + types.count("TOOL_CALL_RECONCILED")
    assert intents == outcomes and tool.total() == types.count("TOOL_CALL_COMMITTED")  # none abandoned, none lost
    assert operator.controls.get(run.run_id) is None  # carried out: removed
    with pytest.raises(RunCancelledError):
        run.call(tool, {"amount": 9})
    assert not run.writable
    with pytest.raises(ControlRefusedError, match="already ended"):
        operator.cancel(run.run_id)


def test_a_pause_hands_the_run_over_to_nobody_and_a_resume_continues_it_once(
        topics: Settings, journal: Journal, operator: Operator) -> None:
    tool = Ledger()
    run = journal.start_run("t", "payer", {"n": 2})
    first = run.call(tool, {"amount": 1})
    result: list[Any] = []
    asking = threading.Thread(target=lambda: result.append(operator.pause(run.run_id, reason="budget review")))
    asking.start()
    with pytest.raises(RunPausedError):
        for _ in range(200):
            run.call(tool, {"amount": 2})
            time.sleep(0.05)
    asking.join(30)
    assert result[0].outcome == "paused", result[0]
    state = _fold(operator, run.run_id)
    assert (state.status, state.owner, state.epoch, state.request_reason) == (RunStatus.PAUSED, None, 2,
                                                                              "budget review")
    paid_before = tool.total()
    # paused: recovery passes leave it alone, and nobody is handed it
    report = RecoveryJob(topics).recover(stale=True).as_dict()
    assert all(r["run_id"] != run.run_id or r["action"] == "paused" for r in report["runs"])
    assert journal.claim_assignment(0) is None
    resumed = operator.resume(run.run_id, reason="approved", requested_by="lead@test")
    assert resumed.outcome == "resumed" and resumed.owner == journal.producer_id, resumed
    assert journal.claim_assignment(5) == run.run_id
    again = journal.resume(run.run_id)
    assert again.epoch == 3
    assert again.call(tool, {"amount": 1}) == first  # recorded: returned, not run
    for _ in range(3):  # the interrupted steps, then on
        again.call(tool, {"amount": 2})
    again.succeed("done")
    assert tool.total() >= paid_before
    for key, n in tool.ran.items():
        assert n == 1, f"{key} ran {n} times"
    final = _fold(operator, run.run_id)
    assert final.status is RunStatus.SUCCEEDED and final.requested_by == "lead@test"


def test_a_dead_owners_run_is_cancelled_by_the_operators_recovery_pass(topics: Settings, operator: Operator) -> None:
    tool = Ledger()
    j = Journal(topics, producer_id=f"dead-{uuid.uuid4().hex[:6]}", lease_ttl_ms=LEASE_MS)
    run = j.start_run("t", "payer", {})
    run.call(tool, {"amount": 1})
    j.close()  # the lease goes: a dead instance with an unfinished run
    result = operator.cancel(run.run_id, reason="no longer wanted")
    assert result.outcome == "cancelled", result
    state = _fold(operator, run.run_id)
    assert state.status is RunStatus.CANCELLED and state.epoch == 1 and state.owner == j.producer_id
    assert tool.total() == 1
    assert RecoveryJob(topics).recover(stale=True).as_dict()["runs_recovered"] == 0  # never resumed


def test_a_cancel_of_a_dead_owners_run_with_an_unknown_call_reconciles_it_first(
        topics: Settings, journal: Journal, operator: Operator) -> None:
    """The call in flight when the owner died is settled with the provider by the next owner before the cancel is
    carried out — neither run again nor abandoned as unknown."""
    block = threading.Event()
    tool = Ledger(block=block)
    j = Journal(topics, producer_id=f"dies-{uuid.uuid4().hex[:6]}", lease_ttl_ms=LEASE_MS)
    run = j.start_run("t", "payer", {})
    caller = threading.Thread(target=lambda: _swallow(lambda: run.call(tool, {"amount": 5})), daemon=True)
    caller.start()
    assert tool.started.wait(10)
    j._lapse("test: the instance dies with a request in flight")  # noqa: SLF001 - fenced for good, as a crash
    j._stop.set()  # noqa: SLF001 - its heartbeat stops: the lease expires as a dead process's would
    block.set()  # the provider completes the charge after the owner is gone
    caller.join(10)
    time.sleep(LEASE_MS / 1000 + 0.5)
    result_box: list[Any] = []
    asking = threading.Thread(target=lambda: result_box.append(operator.cancel(run.run_id, reason="stop")))
    asking.start()
    assert journal.claim_assignment(20) == run.run_id  # resumed to the live instance: it reconciles first
    taken = journal.resume(run.run_id)
    with pytest.raises(RunCancelledError):
        taken.call(tool, {"amount": 5})  # reconciled: executed → its result, recorded
        taken.call(tool, {"amount": 6})  # a new intent: the cancel stops it before it is sent
    asking.join(30)
    assert result_box[0].outcome == "cancelled", result_box[0]
    state = _fold(operator, run.run_id)
    assert state.status is RunStatus.CANCELLED
    (record,) = state.records.values()
    assert record.status is CallStatus.RECONCILED and tool.total() == 1
    assert "TOOL_CALL_RECONCILED" in _types(topics, run.run_id)


def test_a_tool_sees_the_request_while_it_runs(topics: Settings, journal: Journal, operator: Operator) -> None:
    seen: list[Any] = []

    class Long:
        name = "crawl"
        side_effect = False
        timeout_ms = 5000

        def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and stop_requested() is None:
                time.sleep(0.05)
            seen.append(stop_requested())
            return "partial"

    run = journal.start_run("t", "crawler", {})
    asking = threading.Thread(target=lambda: operator.cancel(run.run_id, reason="enough"))
    asking.start()
    assert run.call(Long(), {}) == "partial"  # the tool stopped early; its result is recorded
    assert seen[0] is not None and seen[0].action == "cancel" and seen[0].reason == "enough"
    with pytest.raises(RunCancelledError):
        run.call(Long(), {"again": 1})
    asking.join(30)
    assert stop_requested() is None  # outside a tool: nothing


def test_two_operators_at_once_one_request_stands(topics: Settings, operator: Operator) -> None:
    j = Journal(topics, producer_id=f"dead-{uuid.uuid4().hex[:6]}", lease_ttl_ms=LEASE_MS)
    run = j.start_run("t", "payer", {})
    run.call(Ledger(), {"amount": 1})
    j.close()
    results: list[Any] = []
    ops = [Operator(topics, wait_s=20, poll_s=0.05) for _ in range(2)]
    threads = [threading.Thread(target=lambda o=o, a=a: results.append(getattr(o, a)(run.run_id, reason=a)))
               for o, a in zip(ops, ("cancel", "pause"), strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for o in ops:
        o.close()
    events = events_of(read_committed(topics), run.run_id)
    enders = [e.type for e in events if e.type is EventType.RUN_CANCELLED or (
        e.type is EventType.RUN_RESUMED and e.payload.get("paused"))]
    state = _fold(operator, run.run_id)
    # a cancel stands against a later pause; a pause carried out first is then cancelled: either way ends CANCELLED
    # or PAUSED-then-CANCELLED, each carried out once, with no seq used twice
    seqs = [e.seq for e in events]
    assert len(seqs) == len(set(seqs)) and not state.parked
    assert enders.count(EventType.RUN_CANCELLED) <= 1
    assert state.status in (RunStatus.CANCELLED, RunStatus.PAUSED), state.status
    assert {r.outcome for r in results} <= {"cancelled", "paused", "requested", "withdrawn"}
    # a pause stored first and then replaced by the cancel (a pending cancel stands; a cancel replaces a pending
    # pause) is "withdrawn" for the pausing operator, and the run ends CANCELLED — never the cancel withdrawn
    withdrawn = [r for r in results if r.outcome == "withdrawn"]
    assert all(r.action == "pause" for r in withdrawn), withdrawn
    if withdrawn:
        assert state.status is RunStatus.CANCELLED, state.status


def _swallow(fn: Any) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001 - the dying owner's call: whatever it raises
        pass

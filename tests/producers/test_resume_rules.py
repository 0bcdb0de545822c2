"""Resume follows the journal's decisions: a non-retryable failure is not re-run, other args are refused."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import pytest

from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core.settings import Settings
from runjournal.producers import Journal, PlanMismatchError, RunHandle

pytestmark = pytest.mark.integration


class Booking:
    """Seat HAT123 is taken the first time it is asked for (not retryable); every booking is counted."""

    name = "book"
    side_effect = True
    timeout_ms = 100

    def __init__(self) -> None:
        self.executed: Counter[str] = Counter()

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        if args["flight"] == "HAT123" and not self.executed:
            raise RuntimeError("seat unavailable")
        self.executed[args["flight"]] += 1
        return {"booking": f"B-{args['flight']}"}


def agent(run: RunHandle, tool: Booking, first_choice: str = "HAT123") -> Any:
    """The run's code: try the first choice, fall back to HAT456 if it fails."""
    with run.node("book"):
        try:
            return run.call(tool, {"flight": first_choice})
        except Exception:  # noqa: BLE001 - the agent's own fallback
            return run.call(tool, {"flight": "HAT456"})


def crash_and_recover(topics: Settings, tool: Booking) -> tuple[str, Journal]:
    dead = Journal(topics, producer_id=f"dead-{uuid.uuid4().hex[:6]}", lease_ttl_ms=2000)  # 500: lapsed under load
    run = dead.start_run("t", "booker", {})
    assert agent(run, tool) == {"booking": "B-HAT456"}
    dead.close()  # the instance is gone with the run unfinished (its lease goes with it)
    live = Journal(topics, producer_id=f"live-{uuid.uuid4().hex[:6]}")
    job = RecoveryJob(topics)
    report = job.recover(stale=True).as_dict()
    job.close()
    (outcome,) = report["runs"]
    assert outcome["action"] == "resumed" and outcome["calls"] == {"FAILED": 1, "COMMITTED": 1}
    assert live.claim_assignment(timeout_s=5) == run.run_id
    return run.run_id, live


def test_a_non_retryable_failure_is_raised_again_not_re_run(topics: Settings) -> None:
    tool = Booking()
    run_id, live = crash_and_recover(topics, tool)
    with live:
        resumed = live.resume(run_id)
        assert agent(resumed, tool) == {"booking": "B-HAT456"}  # the same path as before the crash
        resumed.succeed()
    assert tool.executed == Counter({"HAT456": 1}), "HAT123 must not be booked on resume: the run chose HAT456"


def test_a_resumed_call_with_other_args_is_refused(topics: Settings) -> None:
    tool = Booking()
    run_id, live = crash_and_recover(topics, tool)
    with live:
        resumed = live.resume(run_id)
        with pytest.raises(PlanMismatchError, match="other arguments"):
            with resumed.node("book"):
                resumed.call(tool, {"flight": "ZZZ999"})
    assert tool.executed == Counter({"HAT456": 1})

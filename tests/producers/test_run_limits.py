"""A run's event budget and hard event limit (README § Limits; Settings.run_events_warn / run_events_max), on the
real broker: past the limit new work is refused before anything is published, while outcomes, node ends and the
run's end still go through — no effect is left unrecorded."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest

from runjournal.core.errors import ConfigError
from runjournal.core.settings import Settings
from runjournal.producers import Journal, RunTooLongError
from runjournal.schemas import EventType
from tests.support.readback import events_of, read_committed

pytestmark = pytest.mark.integration


class Counting:
    """A side-effecting tool that counts its executions."""

    name = "count"
    side_effect = True
    timeout_ms = 500

    def __init__(self) -> None:
        self.executed = 0

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        self.executed += 1
        return {"n": args["n"]}


def test_new_work_past_the_limit_is_refused_before_publishing_and_outcomes_still_land(
        topics: Settings, caplog: pytest.LogCaptureFixture) -> None:
    settings = topics.model_copy(update={"run_events_warn": 5, "run_events_max": 7})
    tool = Counting()
    with Journal(settings, producer_id=f"p-{uuid.uuid4().hex[:8]}") as journal, \
            caplog.at_level(logging.WARNING, logger="runjournal"):
        run = journal.start_run("t", "a", {})                      # seq 1
        with run.node("work"):                                      # seq 2 … NODE_SUCCEEDED after the refusal
            for n in range(3):                                      # intents 3, 5, 7; commits 4, 6, 8 (past 7)
                assert run.call(tool, {"n": n}) == {"n": n}
            with pytest.raises(RunTooLongError) as refused:         # intent 9: refused, the tool never runs
                run.call(tool, {"n": 3})
        run.succeed({"ok": True})                                   # the run's end is never refused
        assert journal.stats["runs_over_event_budget"] == 1
    assert tool.executed == 3
    err = refused.value
    assert (err.run_id, err.events, err.limit) == (run.run_id, 9, 7)
    assert "RUNJOURNAL_RUN_EVENTS_MAX" in str(err)
    warned = [r for r in caplog.records if "event budget" in r.getMessage()]
    assert len(warned) == 1 and "RUNJOURNAL_RUN_EVENTS_WARN" in warned[0].getMessage()
    events = events_of(read_committed(settings), run.run_id)
    assert [e.seq for e in events] == list(range(1, 11))
    assert [e.type for e in events][6:] == [EventType.TOOL_CALL_INTENDED, EventType.TOOL_CALL_COMMITTED,
                                            EventType.NODE_SUCCEEDED, EventType.RUN_SUCCEEDED]


def test_no_limit_by_default_and_a_budget_of_zero_never_warns(topics: Settings) -> None:
    settings = topics.model_copy(update={"run_events_warn": 0})
    assert Settings().run_events_max == 0 and Settings().run_events_warn == 10_000
    with Journal(settings, producer_id=f"p-{uuid.uuid4().hex[:8]}") as journal:
        run = journal.start_run("t", "a", {})
        for i in range(30):
            run.emit(EventType.MESSAGE, {"role": "assistant", "content": str(i)})
        run.succeed(None)
        assert journal.stats["runs_over_event_budget"] == 0


@pytest.mark.parametrize("name", ["RUNJOURNAL_RUN_EVENTS_MAX", "RUNJOURNAL_RUN_EVENTS_WARN"])
def test_a_negative_budget_is_a_config_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch,
                                                                  name: str) -> None:
    monkeypatch.setenv(name, "-1")
    with pytest.raises(ConfigError, match=name):
        Settings.load()


def test_a_run_resumed_past_its_limit_settles_recorded_work_then_refuses_new_work(topics: Settings) -> None:
    """A break-it finding: a run resumed past ``run_events_max`` could not enter its node again (NODE_STARTED was new
    work), so an open call could never be settled and every recovery pass added an event. Entering a node, a recorded
    call's answer and the run's end go through; the next new call is refused."""
    from runjournal.consumers.recovery.job import RecoveryJob

    settings = topics.model_copy(update={"run_events_max": 4})
    tool = Counting()
    with Journal(settings, producer_id=f"a-{uuid.uuid4().hex[:6]}") as first:
        run = first.start_run("t", "a", {})                          # seq 1
        with run.node("work"):                                        # seq 2
            assert run.call(tool, {"n": 0}) == {"n": 0}               # seq 3, 4
        first.flush()                                                 # the instance goes away with the run open
    with Journal(settings, producer_id=f"b-{uuid.uuid4().hex[:6]}") as second:
        job = RecoveryJob(settings, max_wait_s=0)
        try:
            assert [r.action for r in job.recover(runs=[run.run_id], assign_to=second.producer_id).runs] == \
                ["resumed"]                                           # RUN_RESUMED: seq 6 (NODE_SUCCEEDED was 5)
        finally:
            job.close()
        again = second.resume(run.run_id)
        with again.node("work"):                                      # NODE_STARTED past the limit: settling
            assert again.call(tool, {"n": 0}) == {"n": 0}             # the recorded answer, no event, no re-run
            with pytest.raises(RunTooLongError):
                again.call(tool, {"n": 1})                            # new work: refused before its intent
        again.succeed(None)
    assert tool.executed == 1
    types = [e.type for e in events_of(read_committed(settings), run.run_id)]
    assert types.count(EventType.TOOL_CALL_INTENDED) == 1 and types[-1] is EventType.RUN_SUCCEEDED


def test_a_result_limit_below_the_inline_size_holds_too(topics: Settings) -> None:
    """A break-it finding: with ``max_result_bytes`` under ``inline_result_bytes`` (8 KiB), a 2 KB result was stored
    inline without a word. The limit is checked first: the effect is recorded committed without a result and
    ``ResultTooLargeError`` is raised."""
    from runjournal.producers.errors import ResultTooLargeError

    class Big(Counting):
        def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
            super().__call__(args, idempotency_key)
            return {"blob": "z" * 2_000}

    settings = topics.model_copy(update={"max_result_bytes": 1024})
    tool = Big()
    with Journal(settings, producer_id=f"p-{uuid.uuid4().hex[:8]}") as journal:
        run = journal.start_run("t", "a", {})
        with pytest.raises(ResultTooLargeError, match="RUNJOURNAL_MAX_RESULT_BYTES"):
            run.call(tool, {"n": 0})
        journal.flush()
    assert tool.executed == 1
    (committed,) = [e for e in events_of(read_committed(settings), run.run_id)
                    if e.type is EventType.TOOL_CALL_COMMITTED]
    assert committed.payload["result_json"] is None and committed.payload["result_ref"] is None

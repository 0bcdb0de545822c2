"""Issue 31: the campaign's ``controls`` fault — the rules its actions are checked against
(``runjournal.demo.verify.control_checks``, ``outcome_differs``) and how the demo agents find a fork's script
(``runjournal.demo.agent.script_for``). The fault itself runs in ``tests/demo/test_demo.py`` (a small campaign with
``controls``)."""

from __future__ import annotations

from typing import Any

from runjournal.demo.agent import script_for
from runjournal.demo.verify import args_digest, control_checks, outcome_differs
from runjournal.demo.workload import RunScript, Step
from runjournal.model.reducer import fold
from runjournal.producers import idempotency_key
from runjournal.schemas import Event, EventType, new_event_id, utcnow

RUN = "gen-0007"
FORK = "gen-0007-fork-0000abcd"
SCRIPT = RunScript(run_id=RUN, tenant_id="t", user_id="u", agent="a", instruction="go", succeeded=True, steps=(
    Step(kind="message", role="user", content="hi"),
    Step(kind="tool", tool="get_user_details", args={"user_id": "u"}, result="{}"),
    Step(kind="tool", tool="book_reservation", args={"n": 1}, result="ok", side_effect=True),
    Step(kind="tool", tool="book_reservation", args={"n": 2}, result="ok", side_effect=True),
    Step(kind="message", role="user", content="bye"),
))


def key(run_id: str, step: int) -> str:
    """The demo agents' key of step ``step`` (``call(step="step<i>")``)."""
    return idempotency_key(run_id, f"#step{step}", 1)


class Journal:
    """Builds one run's events in order."""

    def __init__(self, run_id: str, **started: Any) -> None:
        self.run_id, self.events = run_id, []
        self.add(EventType.RUN_STARTED, {"agent": "a", "input_json": "{}", "user_id": "u", **started})

    def add(self, etype: EventType, payload: dict[str, Any], epoch: int = 1) -> Journal:
        self.events.append(Event(new_event_id(), self.run_id, "t", len(self.events) + 1, epoch, "agent-1", etype,
                                 utcnow(), payload, None, None))
        return self

    def call(self, step: int, *, outcome: EventType | None = EventType.TOOL_CALL_COMMITTED) -> Journal:
        s = SCRIPT.steps[step]
        common = {"call_id": key(self.run_id, step), "tool": s.tool, "idempotency_key": key(self.run_id, step),
                  "args_digest": args_digest(s.args)}
        self.add(EventType.TOOL_CALL_INTENDED, {**common, "side_effect": s.side_effect, "attempt": 1,
                                                 "timeout_ms": 2000, "args_json": None})
        if outcome is not None:
            self.add(outcome, {**common, "result_json": '"ok"', "result_ref": None, "result_digest": "d"})
        return self

    def positioned(self) -> list[tuple[Event, int, int]]:
        return [(e, 0, i) for i, e in enumerate(self.events)]


def checks_of(action: dict[str, Any], runs: dict[str, Journal], ledger: dict[str, dict[str, int]],
              expected: str | None = None) -> dict[str, bool]:
    by_run = {rid: j.positioned() for rid, j in runs.items()}
    states = {rid: fold(evs) for rid, evs in by_run.items()}
    per_run = {rid: {"status": st.status.value, "outcome_matches": outcome_differs(
        SCRIPT, st, cancelled=expected == "CANCELLED") is None, "projection_matches": True}
        for rid, st in states.items() if st is not None}
    (out,) = control_checks([action], {RUN: SCRIPT}, by_run, states, per_run, ledger)
    return {c["check"]: c["held"] for c in out["checks"]}


def cancelled() -> Journal:
    return Journal(RUN).call(1).call(2).add(EventType.RUN_CANCELLED, {"reason": "x", "requested_by": "op",
                                                                       "request_id": "r1"})


CANCEL = {"action": "cancel", "run_id": RUN, "outcome": "cancelled", "live": {"became CANCELLED": True}}


def test_a_cancelled_run_holds_when_the_ledger_shows_exactly_its_committed_effects_once() -> None:
    held = checks_of(CANCEL, {RUN: cancelled()}, {RUN: {key(RUN, 2): 1}}, expected="CANCELLED")
    assert all(held.values()) and len(held) == 5, held


def test_each_cancel_rule_catches_its_breach() -> None:
    late = cancelled().call(3, outcome=None)  # an intent after RUN_CANCELLED, and it has no outcome
    held = checks_of(CANCEL, {RUN: late}, {RUN: {key(RUN, 2): 1}}, expected="CANCELLED")
    assert not held["no intent after its RUN_CANCELLED"] and not held["no intent without an outcome"], held
    twice = checks_of(CANCEL, {RUN: cancelled()}, {RUN: {key(RUN, 2): 2}}, expected="CANCELLED")
    unrecorded = checks_of(CANCEL, {RUN: cancelled()}, {RUN: {key(RUN, 2): 1, key(RUN, 3): 1}}, expected="CANCELLED")
    name = "each side effect executed at most once, exactly those the journal records committed"
    assert not twice[name] and not unrecorded[name]
    ended = checks_of(CANCEL, {RUN: Journal(RUN).call(1).call(2).call(3).add(EventType.RUN_SUCCEEDED, {})},
                      {RUN: {key(RUN, 2): 1, key(RUN, 3): 1}}, expected="CANCELLED")
    assert not ended["ended CANCELLED after a prefix of its input's calls"], ended


def test_a_cancelled_runs_calls_must_be_a_prefix_of_its_inputs() -> None:
    state = fold(cancelled().positioned())
    assert outcome_differs(SCRIPT, state, cancelled=True) is None
    assert outcome_differs(SCRIPT, state) is not None  # not cancelled on purpose: it must end as its input says
    skipped = fold(Journal(RUN).call(1).call(3).add(EventType.RUN_CANCELLED, {}).positioned())
    assert outcome_differs(SCRIPT, skipped, cancelled=True) is not None  # step 3 before step 2: not a prefix


def fork_action(listed: list[str]) -> dict[str, Any]:
    return {"action": "fork", "run_id": RUN, "outcome": "forked", "fork_run_id": FORK, "at_seq": 5,
            "may_repeat": listed, "live": {}}


def forked() -> Journal:
    return Journal(FORK, forked_from=RUN, forked_at_seq=5, fork_lineage=[RUN]).call(1).call(2).call(3).add(
        EventType.RUN_SUCCEEDED, {})


def test_a_fork_may_perform_only_what_its_dry_run_listed() -> None:
    rule = "performed only effects its dry run listed in may_repeat"
    ok = checks_of(fork_action([key(RUN, 3)]), {FORK: forked()}, {FORK: {key(FORK, 3): 1}})
    assert all(ok.values()), ok
    unlisted = checks_of(fork_action([key(RUN, 3)]), {FORK: forked()}, {FORK: {key(FORK, 2): 1, key(FORK, 3): 1}})
    assert not unlisted[rule]
    rerun = checks_of(fork_action([key(RUN, 3)]), {FORK: forked()}, {FORK: {key(RUN, 2): 1, key(FORK, 3): 1}})
    assert not rerun[rule]  # the source's key executed again under the fork's id: not a listed effect
    twice = checks_of(fork_action([key(RUN, 3)]), {FORK: forked()}, {FORK: {key(FORK, 3): 2}})
    assert not twice["each of its effects executed once"]


def test_a_failed_live_check_fails_the_action() -> None:
    action = {**CANCEL, "live": {"the owner's code got RunCancelledError": False}}
    held = checks_of(action, {RUN: cancelled()}, {RUN: {key(RUN, 2): 1}}, expected="CANCELLED")
    assert held["no intent after its RUN_CANCELLED"] and not held["the owner's code got RunCancelledError"]


def test_a_fork_runs_with_the_script_of_its_lineage_root() -> None:
    scripts = {RUN: SCRIPT}
    assert script_for(scripts, RUN) is SCRIPT
    assert script_for(scripts, FORK, (RUN,)) is SCRIPT
    assert script_for(scripts, f"{FORK}-fork-1", (FORK, RUN)) is SCRIPT  # a fork of a fork: nearest source first

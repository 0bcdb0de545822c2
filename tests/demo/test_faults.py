"""Issue 17: ``runjournal demo --faults`` — the seeded schedule, and kinds refused before anything starts.

The campaign itself runs in ``tests/demo/test_demo.py`` (a small one, every fault kind a 1-broker stack takes) and
``tests/campaign`` (``make test-campaign``: 200 real runs, ``--faults all`` on 3 brokers with a registry).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from runjournal.core.settings import Settings
from runjournal.demo.faults import KINDS, FaultSpecError, parse_faults, schedule
from tests.cli.test_paths import json_error, rj


def test_schedule_is_seeded_and_covers_every_kind_the_requested_times() -> None:
    kinds = list(KINDS)
    plan = schedule(kinds, times=2, kills=5, rng=random.Random(7))
    assert plan == schedule(kinds, times=2, kills=5, rng=random.Random(7))  # the seed fixes the schedule
    assert plan != schedule(kinds, times=2, kills=5, rng=random.Random(8))
    counts = {k: sum(1 for s in plan if s.kind == k) for k in kinds}
    assert counts["agents"] == 5 and all(counts[k] == 2 for k in kinds if k != "agents"), counts
    assert all(0 < s.at < 1 for s in plan) and [s.at for s in plan] == sorted(s.at for s in plan)


def test_all_takes_what_the_stack_allows_and_says_why_not_the_rest() -> None:
    allowed: dict[str, str | None] = {**dict.fromkeys(KINDS), "broker": "needs 3 brokers"}
    kinds, skipped = parse_faults("all", allowed=allowed)
    assert "broker" not in kinds and set(kinds) == set(KINDS) - {"broker"} and skipped == {"broker": "needs 3 brokers"}
    assert parse_faults("none", allowed=allowed) == ([], {})
    assert parse_faults("redis, agents,redis", allowed=allowed) == (["redis", "agents"], {})
    with pytest.raises(FaultSpecError, match="needs 3 brokers"):
        parse_faults("agents,broker", allowed=allowed)
    with pytest.raises(FaultSpecError, match="unknown fault kind"):
        parse_faults("agents,meteor", allowed=allowed)


@pytest.mark.integration
@pytest.mark.parametrize(("spec", "named"), [("agents,meteor", "meteor"), ("broker", "--brokers 3")])
def test_a_fault_the_stack_cannot_take_is_a_json_error_before_anything_starts(service_env: dict[str, str],
                                                                              spec: str, named: str) -> None:
    """An unknown kind, or ``broker`` on the session's 1-broker stack: a named error (JSON on stderr, exit != 0)
    before any topic, process or progress bar."""
    proc, _ = rj(service_env, "demo", "--runs", "2", "--faults", spec, "--fault-times", "2", "--json", timeout=120)
    doc = json_error(proc)
    assert doc["error"] == "FaultSpecError" and named in doc["message"], doc


def test_every_fault_kind_is_named_in_the_cli_help_and_the_operations_guide() -> None:
    """A kind added to the campaign is one a user can find: ``runjournal demo --help`` and the kinds table."""
    import inspect
    from pathlib import Path

    from runjournal.cli import demo as demo_cli

    source = inspect.getsource(demo_cli)
    guide = (Path(__file__).resolve().parents[2] / "docs" / "operations" / "main-job-and-faults.md").read_text()
    for kind in KINDS:
        assert f" {kind}," in source.replace('"\n', " ").replace('"', " ") or f" {kind}." in source, kind
        assert f"| `{kind}` |" in guide, kind


def test_the_recovery_faults_bait_runs_reach_a_side_effect_before_any_approval() -> None:
    """The bait agent dies at ``producers.call.before_send``, a point only a side effect's call passes, after its
    intent is committed: a held run must reach one without waiting for a decision, or the armed pass gets a run
    with no fact (requeued, nothing to resume) — the demo's 'recovery 0' failure."""
    import dataclasses

    from runjournal.core.failpoints import REGISTRY
    from runjournal.demo.faults import BAIT_FAILPOINT, _effect_before_approval
    from runjournal.demo.workload import Step, generated_workload

    assert BAIT_FAILPOINT in REGISTRY and "read-only calls never pass here" in REGISTRY[BAIT_FAILPOINT]
    scripts = generated_workload(64, seed=3)
    fit = [s for s in scripts if _effect_before_approval(s)]
    assert fit, "the generated workload has runs the recovery fault can hold"
    for s in fit:
        tools = [t for t in s.steps if t.kind == "tool"]
        first_effect = next(i for i, t in enumerate(tools) if t.side_effect)
        assert not any(t.needs_approval for t in tools[:first_effect + 1])
    read_only = dataclasses.replace(scripts[0], steps=(Step(kind="tool", tool="get_user_details"),))
    approval_first = dataclasses.replace(scripts[0], steps=(
        Step(kind="tool", tool="cancel_reservation", side_effect=True, needs_approval=True),
        Step(kind="tool", tool="book_reservation", side_effect=True)))
    assert not _effect_before_approval(read_only) and not _effect_before_approval(approval_first)


def test_controls_is_a_kind_of_its_own_scheduled_like_the_others() -> None:
    """Issue 31: operator actions are a fault kind — named alone or with others, in ``all``, and scheduled by the
    seed ``--fault-times`` times."""
    allowed: dict[str, str | None] = dict.fromkeys(KINDS)
    assert "controls" in KINDS and parse_faults("controls", allowed=allowed) == (["controls"], {})
    assert "controls" in parse_faults("all", allowed=allowed)[0]
    plan = schedule(["agents", "controls"], times=2, kills=3, rng=random.Random(1))
    assert [s.kind for s in plan].count("controls") == 2 and all(0.05 <= s.at <= 0.75 for s in plan
                                                                  if s.kind == "controls")


def test_a_protected_agent_is_picked_by_no_fault_and_killed_by_none(tmp_path: Path) -> None:
    """The owner of a run an operator's request waits on (the controls fault) is never SIGKILLed or picked meanwhile:
    what its code saw is the request's doing."""
    import subprocess

    from runjournal.demo.fleet import Fleet

    fleet = Fleet(env={}, workdir=tmp_path, workload_path=tmp_path / "w.json", provider_url="",
                  rng=random.Random(1))
    proc = subprocess.Popen(["sleep", "30"])
    try:
        fleet.agents["agent-001"] = proc
        fleet.protected.add("agent-001")
        assert fleet.pick_agent() is None and fleet.kill_agent("agent-001") is False and proc.poll() is None
        fleet.protected.discard("agent-001")
        assert fleet.pick_agent() == "agent-001" and fleet.kill_agent("agent-001") is True
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.integration
def test_the_controls_faults_runs_are_held_paced_and_queued_first(settings: Settings, tmp_path: Path) -> None:
    """The runs a controls fault acts on are held out of the queue (the longest, the most side effects), paced like a
    model's turns, and queued at the head when the fault starts — so it always has runs that just started, also
    when the others are done."""
    from runjournal.core import redis_client
    from runjournal.demo.agent import DemoKeys
    from runjournal.demo.controls import CONTROL_RUNS
    from runjournal.demo.faults import Campaign
    from runjournal.demo.fleet import Fleet
    from runjournal.demo.workload import generated_workload

    scripts = generated_workload(16, seed=3)
    plan = schedule(["controls", "recovery"], times=1, kills=0, rng=random.Random(3))
    fleet = Fleet(env={}, workdir=tmp_path, workload_path=tmp_path / "w.json", provider_url="",
                  rng=random.Random(3))
    campaign = Campaign(fleet, settings, plan, random.Random(3), stack=None, restart_memory=None)
    keys = DemoKeys(settings.topic_prefix)
    r = redis_client.client(settings)
    try:
        held = campaign.hold_bait(scripts, keys.queue, keys.bait, keys.controls)
        controls = [x.decode() for x in r.lrange(keys.controls, 0, -1)]
        longest = sorted(scripts, key=lambda s: (-s.side_effects, -len(s.steps), s.run_id))[:CONTROL_RUNS]
        assert controls == [s.run_id for s in longest] and set(controls) < set(held) and len(held) == CONTROL_RUNS + 1
        assert campaign.holding == CONTROL_RUNS + 1
        assert {m.decode() for m in r.smembers(keys.paced)} == set(controls)
        r.rpush(keys.queue, "gen-9999")
        assert campaign._release_controls() == controls  # moved one by one to the head, the order kept
        assert [x.decode() for x in r.lrange(keys.queue, 0, -1)] == [*controls, "gen-9999"]
        assert campaign.holding == 1 and r.llen(keys.controls) == 0
    finally:
        campaign.abort()


@pytest.mark.integration
def test_with_the_archiver_the_operators_fault_holds_a_failing_run_and_acts_only_on_runs_not_yet_due(
        settings: Settings, tmp_path: Path) -> None:
    """Issue 30: with the ``archiver`` kind on, the ``operators`` fault has a failing run of its own held out of the
    queue (queued when it starts, continued as soon as it ended), and the ``operators`` and ``controls`` faults act
    only on finished runs the archiver has not noted, or noted less than ARCHIVE_PICK_WINDOW_S ago by Redis's clock —
    never a run it may archive under them."""
    from runjournal.consumers.archive.store import redis_now_ms
    from runjournal.core import redis_client
    from runjournal.core.redis_keys import RedisKeys
    from runjournal.demo.agent import DemoKeys
    from runjournal.demo.faults import ARCHIVE_PICK_WINDOW_S, ARCHIVE_RETENTION_S, Campaign
    from runjournal.demo.fleet import Fleet
    from runjournal.demo.workload import generated_workload

    assert "archiver" in KINDS and ARCHIVE_RETENTION_S - ARCHIVE_PICK_WINDOW_S >= 30
    scripts = generated_workload(16, seed=3)
    plan = schedule(["operators", "archiver"], times=1, kills=0, rng=random.Random(3))
    fleet = Fleet(env={}, workdir=tmp_path, workload_path=tmp_path / "w.json", provider_url="",
                  rng=random.Random(3))
    campaign = Campaign(fleet, settings, plan, random.Random(3), stack=None, restart_memory=None)
    keys, r = DemoKeys(settings.topic_prefix), redis_client.client(settings)
    try:
        held = campaign.hold_bait(scripts, keys.queue, keys.bait, keys.controls)
        failing = [s.run_id for s in scripts if not s.succeeded]
        assert held == campaign.held_operators == failing[-1:] and campaign.holding == 1
        ids = ["a-fresh", "a-old", "a-unnoted"]
        assert campaign.archive_safe(ids) == set(ids)  # no archiver running: every run
        fleet.archiver = object()  # type: ignore[assignment]  # the fleet runs one
        now = redis_now_ms(r)
        r.zadd(RedisKeys(settings.topic_prefix).archive_due(),
               {"a-fresh": now - 1000, "a-old": now - int(ARCHIVE_PICK_WINDOW_S * 1000) - 1000})
        assert campaign.archive_safe(ids) == {"a-fresh", "a-unnoted"}
        campaign.release_held()
        assert [x.decode() for x in r.lrange(keys.queue, 0, -1)] == failing[-1:] and campaign.holding == 0
    finally:
        fleet.archiver = None
        campaign.abort()

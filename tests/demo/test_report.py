"""The demo report (``runjournal.demo.report``) and its checks (``runjournal.demo.run._checks``): the verdict comes
first and names what failed; a run's status is not painted as its check; recovery passes are a table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runjournal.demo.report import write_report
from runjournal.demo.run import _checks

CANCEL_FAILED = {"action": "cancel", "run_id": "gen-1", "outcome": "cancelled", "t_s": 9.5, "detail": "RUN_CANCELLED",
                 "owner": "agent-002", "held": False, "checks": [
                     {"check": "no intent after its RUN_CANCELLED", "held": False, "observed": "intents after: [14]"}]}
FORK = {"action": "fork", "run_id": "gen-2", "outcome": "forked", "t_s": 12.0, "detail": "epoch 2",
        "owner": "agent-003", "fork_run_id": "gen-2-fork-1", "at_seq": 7, "may_repeat": ["k"],
        "dry_run": {"returned": 1, "reconciled": 0, "rerun": 0, "may_repeat": 1}, "held": True, "checks": [
            {"check": "performed only effects its dry run listed in may_repeat", "held": True, "observed": "1 of 1"}]}


def _summary(**changes: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "runs_total": 2, "runs_completed": 2, "finished_in_time": True, "runs_outcome_matches_input": 2,
        "side_effects_executed": 3, "side_effects_expected": 3, "side_effect_duplicates": 0,
        "projection_mismatches": 0, "acked_events_missing": 0, "acked_events": 40, "runs_unfinished": 0,
        "runs_parked": 0, "runs_orphaned": 0, "faults_ok": True, "faults_injected": {"agents": 2},
        "memory_items_written": 5, "memory_items_without_provenance": 0, "topic_prefix": "rj-demo-x",
        "per_run": {
            "gen-1": {"status": "FAILED", "outcome_matches": True, "projection_matches": True, "epoch": 1,
                      "events": 9, "calls": []},
            "gen-2": {"status": "SUCCEEDED", "outcome_matches": False, "projection_matches": True, "epoch": 2,
                      "events": 12, "calls": []},
        },
        "recoveries": [{"t_s": 12.5, "fenced": ["agent-002"], "runs": [
            {"run_id": "gen-2", "action": "resumed", "previous_epoch": 1, "epoch": 2, "assigned_to": "agent-003",
             "calls": {"COMMITTED": 1, "UNKNOWN": 1}, "detail": None}]}],
    }
    s.update(changes)
    s["checks"] = _checks(s, memory=True)
    s["ok"] = all(c["held"] for c in s["checks"])
    return s


def test_every_check_holds_on_a_clean_summary() -> None:
    checks = _checks(_summary(), memory=True)
    assert checks and all(c["held"] for c in checks), [c for c in checks if not c["held"]]


def test_each_broken_figure_fails_its_own_check() -> None:
    for changes, name in [({"side_effect_duplicates": 1}, "every side effect executed exactly once"),
                          ({"acked_events_missing": 2}, "every acknowledged event is in the topic"),
                          ({"runs_parked": 1}, "no run left unfinished, parked or orphaned"),
                          ({"faults_ok": False}, "every requested fault was injected"),
                          ({"memory_items_written": 0}, "memory items carry provenance"),
                          ({"finished_in_time": False}, "every run ended within the timeout"),
                          ({"controls_ok": False, "controls": [CANCEL_FAILED]}, "every operator action held its rule"),
                          ({"spend_mismatches": 1, "spend": {"currency": "USD", "tenants": {}, "mismatches": [
                              "run gen-1: ledger {} != journal {}"]}},
                           "model spend charged exactly once (the ledger equals the journal's fold)")]:
        failed = [c["check"] for c in _checks(_summary(**changes), memory=True) if not c["held"]]
        assert failed == [name], (changes, failed)


def test_the_verdict_comes_first_and_names_what_failed(tmp_path: Path) -> None:
    path = tmp_path / "r.html"
    write_report(path, _summary(side_effect_duplicates=1))
    html = path.read_text()
    verdict = html.index("FAILED — every side effect executed exactly once (3 of 3, 1 duplicate(s))")
    assert verdict < html.index("<h2>Summary</h2>") and "<script" not in html
    write_report(path, _summary())
    html = path.read_text()
    assert html.index("PASSED — all 11 checks held") < html.index("<h2>Summary</h2>")


def test_a_failed_run_is_not_painted_green_and_a_mismatch_is_red(tmp_path: Path) -> None:
    path = tmp_path / "r.html"
    write_report(path, _summary())
    html = path.read_text()
    gen1 = html[html.index("<td>gen-1</td>"):].split("</tr>")[0]
    gen2 = html[html.index("<td>gen-2</td>"):].split("</tr>")[0]
    assert "class='status-FAILED'" in gen1 and "class='ok'>as recorded" in gen1
    assert "class='bad'>outcome differs from the input" in gen2


def test_recovery_passes_are_a_table_not_json(tmp_path: Path) -> None:
    path = tmp_path / "r.html"
    write_report(path, _summary())
    html = path.read_text()
    section = html[html.index("<h2>Recovery passes</h2>"):]
    assert "<td>gen-2</td><td>resumed</td><td>1 → 2</td><td>agent-003</td><td>COMMITTED 1, UNKNOWN 1</td>" \
           "<td>agent-002</td>" in section
    assert "<pre>" not in section and '"run_id"' not in section


def test_operator_actions_are_a_table_with_each_rule_checked(tmp_path: Path) -> None:
    """The controls fault's actions: what was done to which run, the outcome, and each rule held or FAILED (the
    verdict names the failed check)."""
    path = tmp_path / "r.html"
    write_report(path, _summary(controls=[CANCEL_FAILED, FORK], controls_ok=False))
    html = path.read_text()
    assert "FAILED — every operator action held its rule (cancel gen-1: FAILED, fork gen-2: held)" in html
    section = html[html.index("<h2>Operator controls</h2>"):html.index("<h2>Throughput")]
    assert "<td>cancel</td><td>gen-1</td>" in section and "gen-2 → gen-2-fork-1 at seq 7" in section
    assert "class='bad'>FAILED: " in section and "no intent after its RUN_CANCELLED — intents after: [14]" in section
    assert "class='ok'>held: " in section and "may_repeat 1" in section
    write_report(path, _summary())
    assert "no operator action (the controls fault was not requested)" in path.read_text()

"""The demo report (``runjournal.demo.report``) and its checks (``runjournal.demo.run._checks``): the verdict comes
first and names what failed; a run's status is not painted as its check; recovery passes are a table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runjournal.demo.report import write_report
from runjournal.demo.run import _checks


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
                          ({"finished_in_time": False}, "every run ended within the timeout")]:
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
    assert html.index("PASSED — all 9 checks held") < html.index("<h2>Summary</h2>")


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

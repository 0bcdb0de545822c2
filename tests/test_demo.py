"""The main job end to end, small: generated workload with approvals, SIGKILL chaos, every check must hold."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.crash]
POLICY = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "knowledge" / "tau-bench-airline-policy.md"

REQUIRED = {"runs_total", "runs_completed", "runs_outcome_matches_input", "events_published", "agents",
            "crashes_injected", "projector_kills", "runs_recovered", "side_effects_expected",
            "side_effects_executed", "side_effect_duplicates", "outcome_unknown_reconciled", "projection_mismatches",
            "memory_items_written", "memory_items_without_provenance", "projector_lag_ms_p50", "projector_lag_ms_p99",
            "elapsed_s", "ok"}


@pytest.mark.parametrize("idempotency", ["off"])
def test_demo_generated_workload_under_chaos(service_env: dict[str, str], tmp_path: Path, idempotency: str) -> None:
    report = tmp_path / "report.html"
    proc = subprocess.run(
        [sys.executable, "-m", "runjournal", "demo", "--runs", "16", "--agents", "3", "--kills", "4", "--seed", "3",
         "--provider-idempotency", idempotency, "--json", "--report", str(report), "--knowledge", str(POLICY)],
        env=service_env, capture_output=True, text=True, timeout=600, check=False)
    summary = json.loads(proc.stdout)  # --json: stdout is one JSON document and nothing else
    raw_librdkafka = [line for line in proc.stderr.splitlines() if re.match(r"^%\d+\|", line)]
    assert raw_librdkafka == []  # librdkafka's lines go through Python logging (runjournal.core.kafka)
    assert REQUIRED <= set(summary)
    assert summary["ok"] is True and proc.returncode == 0, {k: summary[k] for k in REQUIRED}
    assert summary["crashes_injected"] >= 4 and summary["projector_kills"] == 1
    assert summary["side_effects_executed"] == summary["side_effects_expected"] > 0
    assert summary["approvals_granted"] > 0  # the generated workload has approvals
    html = report.read_text()
    assert html.startswith("<!doctype html>") and "Fleet timeline" in html and "<script" not in html
    # every model turn built its context: facts first, advice labelled; the report shows one run's
    contexts = {k: v for k, v in summary.items() if k.startswith("contexts_")}
    assert summary["contexts_built"] > 0 and summary["contexts_with_knowledge"] > 0, contexts
    assert summary["contexts_advice_unavailable"] == 0, contexts  # the extractor served the agents' reads
    assert "One run's context" in html and "Execution facts (fact: StateStore / ExecutionRecordStore" in html
    assert "Knowledge (advisory)" in html and "never an execution fact" in html

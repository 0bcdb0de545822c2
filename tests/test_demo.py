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
    # issue 14 (g): without --keep the demo removes what it created
    prefix = summary["topic_prefix"]
    assert summary["cleanup"]["cleanup_errors"] == [], summary["cleanup"]
    assert leftovers(service_env, prefix) == ([], 0), "topics or Redis keys of the demo were left behind"
    assert summary["cleanup"]["qdrant_collections_deleted"] and not Path(summary["workdir"]).exists()


def leftovers(env: dict[str, str], prefix: str) -> tuple[list[str], int]:
    """(topics, Redis key count) left under ``prefix``."""
    import redis

    from runjournal.core import kafka
    from runjournal.core.settings import Settings

    settings = Settings.load(bootstrap=env["RUNJOURNAL_BOOTSTRAP"], redis_url=env["RUNJOURNAL_REDIS_URL"])
    names = [t for t in kafka.admin_client(settings).list_topics(timeout=10).topics if t.startswith(f"{prefix}.")]
    r = redis.Redis.from_url(settings.redis_url)
    patterns = (f"{prefix}:*", f"rj:{{{prefix}*", f"rj:{prefix}:*")
    keys = sum(1 for pattern in patterns for _ in r.scan_iter(match=pattern))
    return names, keys


def test_demo_keep_leaves_its_data_and_every_option_runs(service_env: dict[str, str]) -> None:
    """``--keep`` keeps the demo's topics and keys (removed here by the same cleanup); the remaining demo options
    (``--kill-every``, ``--no-memory``, ``--partitions``) run as a user runs them."""
    from runjournal.core.settings import Settings
    from runjournal.demo.cleanup import remove_demo

    proc = subprocess.run(
        [sys.executable, "-m", "runjournal", "demo", "--runs", "3", "--agents", "2", "--kill-every", "30",
         "--no-memory", "--partitions", "2", "--seed", "5", "--keep", "--json"],
        env=service_env, capture_output=True, text=True, timeout=600, check=False)
    summary = json.loads(proc.stdout)
    assert proc.returncode == 0 and summary["ok"] is True, proc.stderr[-3000:]
    prefix = summary["topic_prefix"]
    names, keys = leftovers(service_env, prefix)
    settings = Settings.load(bootstrap=service_env["RUNJOURNAL_BOOTSTRAP"],
                             redis_url=service_env["RUNJOURNAL_REDIS_URL"], topic_prefix=prefix)
    assert sorted(names) == sorted(settings.all_topics) and keys > 0 and "cleanup" not in summary
    remove_demo(settings, Path(summary["workdir"]))
    assert leftovers(service_env, prefix) == ([], 0)

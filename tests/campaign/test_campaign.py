"""The full fault campaign (marker ``campaign``; ``make test-campaign``): the main job on the real input (200 tau-bench
runs) on a 3-broker stack with a schema registry, ``--faults all``, checked by its own independent witnesses.

The stack is started the way a user starts it — ``runjournal stack up --brokers 3 --registry`` — in a temp directory
on free ports, and stopped at the end (``RJ_CAMPAIGN_STACK_DIR`` names a running one instead). Each cell of
``RJ_CAMPAIGN_MATRIX`` (``seed:idempotency[:mode[:encryption]]``, mode ``group`` (default) or ``strict``: the agents'
outcome commit; encryption ``enc`` — the whole fleet with ``RUNJOURNAL_ENCRYPTION=on`` and a key directory of the
cell's own, issue 33, docs/guide/encryption.md — or ``plain`` (default); ``make test-campaign`` runs
``1:off:group,1:off:strict``, the acceptance matrix ``make campaign-acceptance`` every seed and idempotency in group
commit plus three strict cells and one encrypted cell) is one demo run that must end ``ok`` with no
duplicate, no acknowledged event missing, no projection mismatch, every run terminal and matching its input, and
every fault kind injected. Each cell's summary is appended to ``RJ_CAMPAIGN_RESULTS`` (JSON lines) when set.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import RUNJOURNAL, base_env, cli, free_port_block

pytestmark = [pytest.mark.campaign, pytest.mark.integration, pytest.mark.crash]

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
INPUT = DATA / "trajectories" / "tau-bench-gpt-4o-airline.json"
POLICY = DATA / "knowledge" / "tau-bench-airline-policy.md"


def parse_cell(cell: str) -> tuple[str, str, str, str]:
    """``seed:idempotency[:mode[:encryption]]`` → ``(seed, idempotency, mode, encryption)``.

    ``mode`` defaults to ``group``; ``encryption`` is ``enc`` (the fleet runs with ``RUNJOURNAL_ENCRYPTION=on`` and a
    key directory of the cell's own, docs/guide/encryption.md) or ``plain`` (the default). Anything else is refused
    (a typo must not run a plain cell that claims to be encrypted).
    """
    parts = cell.split(":")
    if not 2 <= len(parts) <= 4:
        raise ValueError(f"campaign cell {cell!r}: expected seed:idempotency[:mode[:encryption]]")
    seed, idempotency, mode, encryption = (*parts, *("group", "plain")[len(parts) - 2:])
    if mode not in ("group", "strict") or encryption not in ("enc", "plain"):
        raise ValueError(f"campaign cell {cell!r}: mode is group|strict, encryption enc|plain")
    return seed, idempotency, mode, encryption


CELLS = [parse_cell(c) for c in os.environ.get("RJ_CAMPAIGN_MATRIX", "1:off").split(",") if c]
"""``(seed, idempotency, outcome mode, encryption)`` per cell; ``seed:idempotency`` runs group commit, plain."""
KINDS = {"agents", "zombies", "same_id", "projector", "projector_stall", "broker", "redis", "recovery", "memory",
         "qdrant", "registry", "recovery_pair", "operators", "cancels", "skew", "graph", "broker_stall", "partitions",
         "controls", "archiver"}


@pytest.fixture(scope="module")
def stack_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A 3-broker stack with a registry (see the module docstring)."""
    given = os.environ.get("RJ_CAMPAIGN_STACK_DIR")
    if given:
        yield {**base_env(), "RUNJOURNAL_STACK_DIR": given}
        return
    env = {**base_env(), "RUNJOURNAL_STACK_DIR": str(tmp_path_factory.mktemp("campaign-stack"))}
    base = free_port_block(9)
    up = cli(env, "stack", "up", "--brokers", "3", "--registry", "--json", "--kafka-port", str(base),
             "--controller-port", str(base + 1), "--redis-port", str(base + 6), "--registry-port", str(base + 7),
             timeout_s=900)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield env
    finally:
        down = cli(env, "stack", "down", "--json")
        assert down.returncode == 0, down.stderr


@pytest.mark.skipif(not INPUT.exists(), reason=f"the real input is not here: {INPUT}")
@pytest.mark.parametrize(("seed", "idempotency", "mode", "encryption"), CELLS,
                         ids=[f"seed{s}-idem-{i}-{m}" + ("-enc" if e == "enc" else "") for s, i, m, e in CELLS])
def test_the_main_job_holds_under_every_fault(stack_env: dict[str, str], tmp_path: Path, seed: str,
                                               idempotency: str, mode: str, encryption: str) -> None:
    report = tmp_path / "report.html"
    keys = tmp_path / "keys"
    # stack_env has no RUNJOURNAL_* of the caller's (base_env): a plain cell is plain
    env = {**stack_env, "RUNJOURNAL_ENCRYPTION": "on", "RUNJOURNAL_KEYS_DIR": str(keys)} if encryption == "enc" \
        else stack_env
    started = time.monotonic()
    proc = subprocess.run(
        [RUNJOURNAL, "demo", "--input", str(INPUT), "--knowledge", str(POLICY), "--agents", "4", "--kills", "20",
         "--faults", "all", "--seed", seed, "--provider-idempotency", idempotency, "--outcome-commit", mode,
         "--json", "--report", str(report)],
        env=env, capture_output=True, text=True, timeout=1800, check=False)
    elapsed = time.monotonic() - started
    summary = json.loads(proc.stdout)
    brief = {k: v for k, v in summary.items() if not isinstance(v, dict | list) or k == "faults_injected"}
    if results := os.environ.get("RJ_CAMPAIGN_RESULTS"):
        with open(results, "a") as f:
            f.write(json.dumps({"seed": seed, "idempotency": idempotency, "mode": mode, "encryption": encryption,
                                "wall_s": round(elapsed, 1),
                                "loadavg": os.getloadavg(), **brief}, default=str) + "\n")
    differs = {rid: r for rid, r in summary.get("per_run", {}).items() if not r.get("outcome_matches", True)
               or not r.get("projection_matches", True)}
    (tmp_path / "summary.json").write_text(json.dumps(summary, default=str))
    assert summary["ok"] is True and proc.returncode == 0, (brief, differs, summary.get("fault_errors"),
                                                            proc.stderr[-3000:])
    assert summary["outcome_commit"] == mode
    if encryption == "enc":  # the fleet did encrypt: the agents made their tenants' keys
        assert any(keys.glob("kek/*.json")), "encryption on, but no key was made: nothing was encrypted"
    assert summary["runs_total"] == summary["runs_completed"] == summary["runs_outcome_matches_input"] == 200
    assert summary["side_effect_duplicates"] == 0 and summary["acked_events_missing"] == 0 < summary["acked_events"]
    assert summary["projection_mismatches"] == 0
    assert summary["runs_unfinished"] == summary["runs_parked"] == summary["runs_orphaned"] == 0
    assert set(summary["faults_injected"]) == KINDS and all(n >= 1 for n in summary["faults_injected"].values())
    # issue 31: operator actions, each checked against its rule (a cancel, a pause and resume, a fork)
    assert summary["controls_ok"] is True and {c["action"] for c in summary["controls"]} == {
        "pause", "resume", "cancel", "fork"}, summary["controls"]
    # issue 30: an archiver killed mid-archive; every run hot or archived exactly once, none half-removed
    assert summary["archive"]["ok"] is True and summary["archive"]["runs_archived"] > 0, summary["archive"]
    html = report.read_text()
    for marker in ("fault broker: SIGKILL", "fault redis: SIGKILL", "fault registry: SIGKILL", "fault qdrant",
                   "fault zombies", "fault same_id", "fault projector_stall", "fault recovery: SIGKILL at",
                   "fault memory: SIGKILL", "fault recovery_pair", "fault operators", "fault cancels", "fault skew",
                   "fault graph", "fault broker_stall: SIGSTOP", "fault partitions", "fault controls: pause requested",
                   "fault controls: fork of", "fault archiver: armed"):
        assert marker in html, marker  # every fault is on the report's timeline

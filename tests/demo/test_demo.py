"""The main job end to end, small: generated workload with approvals, a small fault campaign (agents, the projector,
zombies, a restart under the same producer_id, Redis, the recovery service — and, in one case, operator actions:
``controls``) on a private stack, every check must hold. The full campaign (200 real runs, every fault kind, 3
brokers) is ``tests/campaign`` (``make test-campaign``)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runjournal.core.settings import default_cache_dir
from runjournal.deploy.procs import free_port
from runjournal.deploy.stack import Stack, StackPorts

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.slow]
POLICY = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "knowledge" / "tau-bench-airline-policy.md"

REQUIRED = {"runs_total", "runs_completed", "runs_outcome_matches_input", "events_published", "agents",
            "crashes_injected", "projector_kills", "runs_recovered", "side_effects_expected",
            "side_effects_executed", "side_effect_duplicates", "outcome_unknown_reconciled", "projection_mismatches",
            "memory_items_written", "memory_items_without_provenance", "projector_lag_ms_p50", "projector_lag_ms_p99",
            "elapsed_s", "ok", "faults_injected", "acked_events", "acked_events_missing", "runs_unfinished",
            "runs_parked", "runs_orphaned", "spend", "spend_mismatches"}
SMALL_CAMPAIGN = ("agents", "projector", "zombies", "same_id", "redis", "recovery", "recovery_pair", "operators",
                  "cancels")
WITH_CONTROLS = (*SMALL_CAMPAIGN, "controls")
"""Issue 31's acceptance in small: the campaign with operator actions (about 110 s on 2 cores)."""


@pytest.fixture(scope="module")
def own_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A private 1-broker stack (the campaign SIGKILLs its Redis: never the session's), as ``stack up`` starts it;
    the environment of a process that uses it through its state file."""
    stack_dir = tmp_path_factory.mktemp("demo-stack")
    cache = Path(os.environ.get("RUNJOURNAL_CACHE_DIR") or default_cache_dir())
    stack = Stack(stack_dir, cache, ports=StackPorts(free_port(), free_port(), free_port()))
    try:
        stack.up()
        yield {**{k: v for k, v in os.environ.items() if not k.startswith("RUNJOURNAL_")},
               "RUNJOURNAL_STACK_DIR": str(stack_dir), "RUNJOURNAL_REPLICATION_FACTOR": "1"}
    finally:
        stack.down()


@pytest.mark.parametrize(("idempotency", "mode", "kinds", "encryption"),
                         [("off", "strict", SMALL_CAMPAIGN, "on"), ("off", "group", WITH_CONTROLS, "off")],
                         ids=["off-strict-encrypted", "off-group-controls"])
def test_demo_generated_workload_under_chaos(own_stack: dict[str, str], tmp_path: Path, idempotency: str,
                                             mode: str, kinds: tuple[str, ...], encryption: str) -> None:
    """The main job under chaos. The group-commit cell has the operator controls too (its faults are the strict
    cell's and more); the strict cell runs with encryption on (issue 33: agents seal every content field, SIGKILLed
    agents' runs are resumed with the keys, the projector, the recovery job and the memory extractor hold none; CI's
    campaign cell runs group commit with encryption on, on the real input)."""
    report = tmp_path / "report.html"
    keys = tmp_path / "keys"
    env = {**own_stack, "RUNJOURNAL_ENCRYPTION": encryption, "RUNJOURNAL_KEYS_DIR": str(keys)}
    proc = subprocess.run(
        [sys.executable, "-m", "runjournal", "demo", "--runs", "16", "--agents", "3", "--kills", "4", "--seed", "3",
         "--faults", ",".join(kinds), "--provider-idempotency", idempotency, "--json", "--report",
         str(report), "--knowledge", str(POLICY), "--outcome-commit", mode],
        env=env, capture_output=True, text=True, timeout=600, check=False)
    assert any(keys.glob("kek/*.json")) is (encryption == "on"), "encryption on made no key, or off made one"
    summary = json.loads(proc.stdout)  # --json: stdout is one JSON document and nothing else
    assert summary["outcome_commit"] == mode
    raw_librdkafka = [line for line in proc.stderr.splitlines() if re.match(r"^%\d+\|", line)]
    assert raw_librdkafka == []  # librdkafka's lines go through Python logging (runjournal.core.kafka)
    assert REQUIRED <= set(summary)
    if not summary["ok"]:
        print(json.dumps(summary, indent=1, default=str))  # shown with the failure
    assert summary["ok"] is True and proc.returncode == 0, {k: summary[k] for k in REQUIRED}
    assert summary["crashes_injected"] >= 4 and summary["projector_kills"] == 1
    # issue 32: budgets on — every model turn charged exactly once (each run's ledger = the journal's fold)
    assert summary["spend_mismatches"] == 0 and summary["spend"]["runs_with_spend"] >= 16, summary["spend"]
    assert all(t["used"]["model_calls"] > 0 and t["open"]["model_calls"] >= 0
               for t in summary["spend"]["tenants"].values()), summary["spend"]
    assert set(summary["faults_injected"]) == set(kinds), summary["faults_injected"]
    assert summary["faults_injected"]["agents"] >= 4 and min(summary["faults_injected"].values()) >= 1
    assert summary["acked_events_missing"] == 0 < summary["acked_events"]
    assert summary["runs_unfinished"] == summary["runs_parked"] == summary["runs_orphaned"] == 0
    assert summary["side_effects_executed"] == summary["side_effects_expected"] > 0
    assert summary["approvals_granted"] > 0  # the generated workload has approvals
    html = report.read_text()
    assert html.startswith("<!doctype html>") and "Fleet timeline" in html and "<script" not in html
    for marker in ("fault redis: SIGKILL", "fault zombies", "fault same_id", "fault recovery: SIGKILL at",
                   "fault recovery: an agent taking a held run"):
        assert marker in html, marker  # each fault is on the timeline, with its time
    assert html.index("PASSED — all") < html.index("<h2>Summary</h2>")  # the verdict first
    assert all(c["held"] for c in summary["checks"]) and "<h2>Recovery passes</h2><table>" in html
    if "controls" in kinds:
        _check_controls(summary, html)
    # every model turn built its context: facts first, advice labelled; the report shows one run's
    contexts = {k: v for k, v in summary.items() if k.startswith("contexts_")}
    assert summary["contexts_built"] > 0 and summary["contexts_with_knowledge"] > 0, contexts
    assert summary["contexts_advice_unavailable"] == 0, contexts  # the extractor served the agents' reads
    assert "One run's context" in html and "Execution facts (fact: StateStore / ExecutionRecordStore" in html
    assert "Knowledge (advisory)" in html and "never an execution fact" in html
    # issue 14 (g): without --keep the demo removes what it created
    prefix = summary["topic_prefix"]
    assert summary["cleanup"]["cleanup_errors"] == [], summary["cleanup"]
    assert leftovers(own_stack, prefix) == ([], 0), "topics or Redis keys of the demo were left behind"
    assert summary["cleanup"]["qdrant_collections_deleted"] and not Path(summary["workdir"]).exists()


def _check_controls(summary: dict[str, Any], html: str) -> None:
    """Issue 31's acceptance: a pause, a cancel, a resume and a fork, each held against its rule (see
    ``runjournal.demo.verify.control_checks``); 0 duplicates; the report shows them."""
    actions = {c["action"]: c for c in summary["controls"]}
    assert set(actions) == {"pause", "cancel", "resume", "fork"} and summary["controls_ok"] is True, actions
    assert all(c["held"] and c["checks"] for c in summary["controls"]), summary["controls"]
    assert summary["runs_cancelled"] == summary["runs_forked"] == 1 and summary["side_effect_duplicates"] == 0
    checked = {c["check"] for a in summary["controls"] for c in a["checks"]}
    assert {"no intent after its RUN_CANCELLED", "no intent without an outcome",
            "performed only effects its dry run listed in may_repeat", "the owner's code got RunPausedError",
            "each side effect executed once"} <= checked, checked
    assert actions["resume"]["run_id"] == actions["pause"]["run_id"] != actions["cancel"]["run_id"]
    assert actions["fork"]["fork_run_id"].startswith(f"{actions['fork']['run_id']}-fork-")
    assert "<h2>Operator controls</h2>" in html and "fault controls: pause requested" in html


def leftovers(env: dict[str, str], prefix: str) -> tuple[list[str], int]:
    """(topics, Redis key count) left under ``prefix``."""
    from runjournal.core import kafka, redis_client
    from runjournal.core.redis_keys import RedisKeys
    from runjournal.core.settings import Settings

    settings = Settings.load(stack_dir=Path(env["RUNJOURNAL_STACK_DIR"])) if "RUNJOURNAL_BOOTSTRAP" not in env else \
        Settings.load(bootstrap=env["RUNJOURNAL_BOOTSTRAP"], redis_url=env["RUNJOURNAL_REDIS_URL"])
    names = [t for t in kafka.admin_client(settings).list_topics(timeout=10).topics if t.startswith(f"{prefix}.")]
    r = redis_client.client(settings)
    keys = sum(1 for pattern in RedisKeys(prefix).patterns() for _ in redis_client.scan_keys(r, pattern))
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


def test_ctrl_c_stops_every_process_the_demo_started_and_removes_its_data(service_env: dict[str, str],
                                                                          settings: object) -> None:
    """Issue 35 case 8: a Ctrl-C (SIGINT to the terminal's foreground process group) printed a traceback from each
    child (the provider's among them). The demo's children run in their own sessions, so only the demo gets it: it
    stops every process it started, removes its topics and keys, says so in one line and exits 130."""
    import psutil

    from runjournal.core import kafka
    from runjournal.core.settings import Settings

    assert isinstance(settings, Settings)
    admin = kafka.admin_client(settings)
    demo = subprocess.Popen([sys.executable, "-m", "runjournal", "demo", "--runs", "40", "--agents", "2",
                             "--faults", "agents,projector,recovery,recovery_pair",
                             "--no-memory", "--json"], env=service_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,  # its group: the "terminal"
                            # as a terminal starts it: a suite run from a background job inherits SIGINT ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        children: list[psutil.Process] = []
        while time.monotonic() < deadline:  # until its fleet runs: provider, projector, recovery, agents
            children = psutil.Process(demo.pid).children(recursive=True)
            if len([c for c in children if "runjournal.demo.agent" in " ".join(c.cmdline())]) >= 2:
                break
            assert demo.poll() is None, demo.stderr.read() if demo.stderr else ""
            time.sleep(0.5)
        assert len(children) >= 4, [c.cmdline() for c in children]
        prefix = children[0].environ()["RUNJOURNAL_TOPIC_PREFIX"]  # the demo's own: every process it starts has it
        time.sleep(12)  # a few runs in: the campaign's first faults are due (a fault may be running on its worker)
        os.killpg(demo.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
        _out, err = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "interrupted" in err.strip().splitlines()[-1], err[-3000:]
    _gone, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, [p.cmdline() for p in alive]
    time.sleep(2)  # anything started late (a fault's restart) would be up by now

    def of_the_demo(p: psutil.Process) -> bool:
        try:
            return p.environ().get("RUNJOURNAL_TOPIC_PREFIX") == prefix and p.status() != psutil.STATUS_ZOMBIE
        except (psutil.Error, OSError):
            return False

    assert [p.cmdline() for p in psutil.process_iter() if of_the_demo(p)] == []  # none left, not even started late
    assert [t for t in admin.list_topics(timeout=10).topics if t.startswith(f"{prefix}.")] == []


def test_a_locked_qdrant_directory_is_named_before_anything_is_created(service_env: dict[str, str],
                                                                         settings: object) -> None:
    """Another process holds the embedded Qdrant directory: the demo says so within seconds, naming the fix, and
    creates nothing (it used to run its whole fleet and fail at the end, leaving its data behind)."""
    from qdrant_client import QdrantClient

    from runjournal.core import kafka
    from runjournal.core.settings import Settings

    assert isinstance(settings, Settings)
    admin = kafka.admin_client(settings)
    before = {t for t in admin.list_topics(timeout=10).topics if t.startswith("demo-")}
    holder = QdrantClient(path=str(settings.effective_qdrant_path))
    try:
        proc = subprocess.run([sys.executable, "-m", "runjournal", "demo", "--runs", "2", "--agents", "1", "--json"],
                              env=service_env, capture_output=True, text=True, timeout=120, check=False)
    finally:
        holder.close()
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout[-2000:]
    error = json.loads(proc.stderr.strip().splitlines()[-1])
    assert error["error"] == "StoreLockedError" and "--no-memory" in error["message"], error
    assert {t for t in admin.list_topics(timeout=10).topics if t.startswith("demo-")} == before


def test_a_demo_that_fails_part_way_removes_what_it_created(service_env: dict[str, str], settings: object,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure once the demo has created its topics and started its processes (here: the memory service
    refuses to start): without --keep its topics and Redis keys go, and the processes it started are stopped."""
    from runjournal.core.settings import Settings
    from runjournal.demo import run as demo_run
    from runjournal.demo.run import DemoOptions

    assert isinstance(settings, Settings)
    for key, value in service_env.items():
        monkeypatch.setenv(key, value)
    seen: dict[str, str] = {}

    def refuse(fleet: object, settings: Settings) -> bool:
        seen["prefix"] = settings.topic_prefix
        raise RuntimeError("injected: the memory service cannot start")

    monkeypatch.setattr(demo_run.services, "start_memory", refuse)
    children = _live_descendants()
    with pytest.raises(RuntimeError, match="injected"):
        demo_run.run_demo(DemoOptions(generated_runs=2, agents=1))
    assert leftovers(service_env, seen["prefix"]) == ([], 0), "the failed demo left its topics or keys"
    left = _live_descendants() - children
    assert left == set(), f"processes the failed demo started are still running: {left}"


def _live_descendants() -> set[tuple[int, str]]:
    """(pid, command) of this process's descendants that are not zombies (from /proc)."""
    parent: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()  # noqa: SIM115,PTH123
        except OSError:
            continue
        rest = stat[stat.rindex(")") + 2:].split()
        if rest[0] != "Z":
            parent[int(entry)], names[int(entry)] = int(rest[1]), stat[stat.index("(") + 1:stat.rindex(")")]
    out, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier}
        out |= {(pid, names[pid]) for pid in frontier}
    return out

"""Acceptance: ``runjournal console`` against the real stack after a small demo, driven in headless Chromium.

Debian's ``/usr/bin/chromium`` (``make deps-test``) driven by Playwright for Python (``executable_path``: no
browser download). After ``runjournal demo`` the demo's prefix gets the long-running services a deployment
has — ``projector``, ``memory-extractor`` and ``recover --stale --watch`` with ``--metrics-port`` — and two
consoles: one started with an operator token, one without. Then, in the browser:

1. the runs list shows every run of the demo (and filters them);
2. a run recovered after a SIGKILL inside a tool call (its outcome unknown, reconciled through the provider by
   the resumed owner) shows both ownership epochs and the reconciled call;
3. without the token the approve/deny buttons are absent and the endpoint refuses; with it, an approval granted
   in the browser is journaled by the run's owner and the run completes;
4. the lag page shows projector, memory and recovery lag from the services' ``/metrics``;
5. an operator pauses a running run and resumes it through the run page's buttons (issue 31).

Screenshots of the list and of the recovered run's page go to ``$RJ_SCREENSHOT_DIR`` (``docs/`` holds the
ones the README shows) or the test's temp folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from runjournal.consumers.projector.store import ProjectionStore
from runjournal.core.settings import Settings
from runjournal.demo.cleanup import remove_demo
from runjournal.demo.workload import generated_workload
from runjournal.deploy.procs import free_port
from runjournal.schemas.keys import partition_for
from tests.support.provider import Provider, child, running_provider, wait_lease, wait_lease_gone

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.browser, pytest.mark.slow]
CHROMIUM = "/usr/bin/chromium"
# as the machine's notes say: without the background-networking flags Chromium keeps dialling out
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
TOKEN = "operator-" + uuid.uuid4().hex
DEMO_RUNS, DEMO_SEED = 8, 4


@dataclass
class Stack:
    """The demo's prefix with its services and two consoles."""

    settings: Settings
    env: dict[str, str]
    provider: Provider
    demo: dict[str, Any]
    console: str
    """URL of the console started with the operator token."""
    read_only: str
    """URL of the console started without one."""
    recovered_run: str
    shots: Path


def _spawn(env: dict[str, str], *argv: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "runjournal", *argv], env=env, stdout=log.open("ab"),
                            stderr=subprocess.STDOUT)


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.3)
    raise AssertionError(f"{url} did not answer within {timeout_s} s: {log.read_text()[-3000:]}")


def _demo(service_env: dict[str, str]) -> dict[str, Any]:
    argv = ["demo", "--runs", str(DEMO_RUNS), "--agents", "2", "--kills", "1", "--seed", str(DEMO_SEED), "--json"]
    helped = subprocess.run([sys.executable, "-m", "runjournal", "demo", "--help"], env=service_env,
                            capture_output=True, text=True, timeout=60, check=False).stdout
    if "--keep" in helped:  # a demo that cleans up after itself must leave its prefix for the console
        argv.append("--keep")
    proc = subprocess.run([sys.executable, "-m", "runjournal", *argv], env=service_env, capture_output=True,
                          text=True, timeout=900, check=False)
    summary = json.loads(proc.stdout)
    assert proc.returncode == 0 and summary["ok"], proc.stderr[-3000:]
    return summary


def _recovered_run(settings: Settings, env: dict[str, str], provider: Provider) -> str:
    """A run whose owner is SIGKILLed right after its tool ran (outcome unknown); the running ``recover --watch``
    hands it to agent-b, which reconciles the call through the provider and finishes the run."""
    run_id = f"console-recovered-{uuid.uuid4().hex[:6]}"
    crashed = child(env, run_id, "agent-a", provider, failpoint="producers.call.after_tool=1")
    assert crashed.wait(60) == -signal.SIGKILL, crashed.stderr.read()[-3000:] if crashed.stderr else ""
    wait_lease_gone(settings, "agent-a")
    taker = child(env, run_id, "agent-b", provider, resume=True)
    assert taker.wait(120) == 0, taker.stderr.read()[-3000:] if taker.stderr else ""
    return run_id


@pytest.fixture(scope="module")
def stack(endpoints: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("console")
    base = Settings.load(bootstrap=endpoints.bootstrap, redis_url=endpoints.redis_url, partitions=6,
                         stack_dir=tmp / "stack", qdrant_path=tmp / "qdrant",
                         replication_factor=endpoints.replication_factor)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RUNJOURNAL_")}
    summary = _demo({**clean, **base.as_env()})
    settings = base.model_copy(update={"topic_prefix": summary["topic_prefix"]})
    env = {**clean, **settings.as_env()}
    procs: list[subprocess.Popen] = []
    with running_provider(tmp, env) as provider:
        try:
            for name, argv in (("projector", ["projector", "--metrics-port", str(free_port())]),
                               ("memory", ["memory-extractor", "--metrics-port", str(free_port())]),
                               ("recovery", ["recover", "--stale", "--watch", "0.5", "--json",
                                             "--metrics-port", str(free_port())])):
                procs.append(_spawn(env, *argv, log=tmp / f"{name}.log"))
            recovered = _recovered_run(settings, env, provider)
            urls = []
            for name, extra in (("console", {"RUNJOURNAL_CONSOLE_OPERATOR_TOKEN": TOKEN}), ("read-only", {})):
                port = free_port()
                procs.append(_spawn({**env, **extra}, "console", "--port", str(port), log=tmp / f"{name}.log"))
                urls.append(f"http://127.0.0.1:{port}")
                _wait_http(f"{urls[-1]}/healthz", procs[-1], tmp / f"{name}.log")
            shots = Path(os.environ.get("RJ_SCREENSHOT_DIR") or tmp)
            yield Stack(settings, env, provider, summary, urls[0], urls[1], recovered, shots)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(30)
            remove_demo(settings, None)  # what the demo kept for the console (--keep)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: `make deps-test` installs it"
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(60_000)
    yield context.new_page()
    context.close()


def test_runs_list_shows_the_demos_runs(stack: Stack, page: Any) -> None:
    demo_runs = {s.run_id for s in generated_workload(DEMO_RUNS, seed=DEMO_SEED)}
    page.goto(f"{stack.console}/runs")
    listed = set(page.locator("#runs tbody tr").evaluate_all("rows => rows.map(r => r.dataset.run)"))
    assert demo_runs <= listed and stack.recovered_run in listed
    page.screenshot(path=str(stack.shots / "console-runs.png"), full_page=True)
    # filter in the browser: status SUCCEEDED, then one tenant
    page.select_option("select[name=status]", "SUCCEEDED")
    page.click("form.filters button")
    statuses = page.locator("#runs tbody tr .status").all_inner_texts()
    assert statuses and set(statuses) == {"SUCCEEDED"}
    tenant = next(s.tenant_id for s in generated_workload(DEMO_RUNS, seed=DEMO_SEED))
    page.select_option("select[name=status]", "")
    page.select_option("select[name=tenant]", tenant)
    page.click("form.filters button")
    shown = set(page.locator("#runs tbody tr").evaluate_all("rows => rows.map(r => r.dataset.run)"))
    assert shown == {s.run_id for s in generated_workload(DEMO_RUNS, seed=DEMO_SEED) if s.tenant_id == tenant}


def test_a_recovered_runs_page_shows_its_epochs_and_the_reconciled_call(stack: Stack, page: Any) -> None:
    page.goto(f"{stack.console}/runs")
    page.click(f"#runs a[href='/runs/{stack.recovered_run}']")
    assert page.inner_text("#run-status") == "SUCCEEDED" and page.inner_text("#run-epoch") == "2"
    epochs = page.locator("#epochs tbody tr").all_inner_texts()
    assert len(epochs) == 2 and "RUN_STARTED" in epochs[0] and "agent-a" in epochs[0]
    assert "RUN_RESUMED" in epochs[1] and "agent-b" in epochs[1] and "OUTCOME_UNKNOWN=1" in epochs[1]
    records = page.locator("#records tbody tr").all_inner_texts()
    assert len(records) == 1 and "send_email" in records[0] and "reconciled (committed)" in records[0]
    timeline = [row.split("\t") for row in page.locator("#timeline tbody tr").all_inner_texts()]
    offsets = [int(cells[0]) for cells in timeline]
    assert offsets == sorted(offsets)  # offset order; seq and epoch beside each
    resumed = next(cells for cells in timeline if cells[3] == "RUN_RESUMED")
    assert resumed[2] == "2" and int(resumed[1]) > 1
    assert "TOOL_CALL_RECONCILED" in [cells[3] for cells in timeline]
    page.screenshot(path=str(stack.shots / "console-run.png"), full_page=True)


def test_memory_items_carry_provenance_to_event_offsets(stack: Stack, page: Any) -> None:
    runs = httpx.get(f"{stack.console}/api/runs", timeout=60).json()["runs"]
    with_memory = None
    for run in runs:  # the demo's extractor wrote memory for some runs; find one
        detail = httpx.get(f"{stack.console}/api/runs/{run['run_id']}", timeout=60).json()
        if detail["memory"]:
            with_memory = detail
            break
    assert with_memory is not None, "no demo run has memory items"
    page.goto(f"{stack.console}/runs/{with_memory['run_id']}")
    cells = page.locator("#memory tbody tr td.mono").all_inner_texts()
    offsets = {int(c.rsplit("@", 1)[1]) for c in cells}
    timeline = {int(row.split("\t")[0]) for row in page.locator("#timeline tbody tr").all_inner_texts()}
    assert offsets and offsets <= timeline  # every item points at an event of this run's timeline
    assert "advisory" in page.inner_text("#memory h2")


def test_approval_granted_in_the_browser_with_the_token_is_journaled_and_the_run_completes(
        stack: Stack, page: Any) -> None:
    run_id = f"console-approval-{uuid.uuid4().hex[:6]}"
    owner = child(stack.env, run_id, "agent-c", stack.provider, approval=True)
    try:
        wait_lease(stack.settings, "agent-c")
        _wait_pending(stack, run_id)
        # the read-only console: no buttons, and its endpoint refuses even the right token
        page.goto(f"{stack.read_only}/runs/{run_id}")
        assert page.locator("#approvals button").count() == 0 and page.is_visible("#read-only")
        refused = httpx.post(f"{stack.read_only}/runs/{run_id}/approvals/send", data={"decision": "grant"},
                             headers={"authorization": f"Bearer {TOKEN}"}, timeout=30)
        assert refused.status_code == 403
        # the operator console before sign-in: no buttons, the endpoint refuses
        page.goto(f"{stack.console}/runs/{run_id}")
        assert page.locator("#approvals button").count() == 0
        assert httpx.post(f"{stack.console}/runs/{run_id}/approvals/send", data={"decision": "grant"},
                          timeout=30).status_code == 401
        # sign in with the token, approve in the browser
        page.click("text=operator sign-in")
        page.fill("input[name=name]", "alice")
        page.fill("input[name=token]", TOKEN)
        page.click("form.login button")
        page.goto(f"{stack.console}/runs/{run_id}")
        asked = page.inner_text("#approvals")  # issue 35: the approver sees what they decide about
        assert "bob@example.com" in asked and "booking 0" in asked, asked
        assert "Approve: the run's owner runs send_email" in asked and "Deny: the owner never runs it" in asked
        page.fill("#approvals input[name=comment]", "looks right")
        page.click("#approvals button.grant")
        assert "written to the run's inbox" in page.inner_text("#decided-note")
        assert owner.wait(120) == 0, owner.stderr.read()[-3000:] if owner.stderr else ""
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(10)
    assert stack.provider.executions() >= 1
    state = _wait_state(stack, run_id, lambda s: s.status.value == "SUCCEEDED")
    (decision,) = state.approvals.values()
    assert (decision.decision.value, decision.approver, decision.note) == ("GRANTED", "alice (console)",
                                                                           "looks right")
    page.goto(f"{stack.console}/runs/{run_id}")
    assert page.inner_text("#run-status") == "SUCCEEDED"
    assert "APPROVAL_GRANTED" in page.inner_text("#timeline") and "alice (console)" in page.inner_text("#decided")
    assert page.locator("#behind").count() == 0  # the header and the history agree once projected


def test_lag_page_shows_lag_from_the_services_metrics(stack: Stack, page: Any) -> None:
    page.goto(f"{stack.console}/lag")
    for service in ("projector", "memory", "recovery"):
        row = page.locator(f"tr[data-service={service}]")
        assert row.count() == 1 and "up" in row.inner_text() and "lag" in row.inner_text(), service
    assert "Recovery backlog" in page.inner_text("#backlog")
    page.goto(f"{stack.console}/runs")
    assert "projector lag" in page.inner_text(".lagline") and "— ·" not in page.inner_text(".lagline")


def test_a_service_killed_without_withdrawing_is_shown_missing(stack: Stack, page: Any) -> None:
    """Issue 35 case 3: a dead service vanished from the Lag page instead of showing trouble."""
    from runjournal.core.metrics import endpoints_key

    r = redis.Redis.from_url(stack.settings.redis_url)
    field = f"worker@ghost:{uuid.uuid4().hex[:6]}"
    stale = {"service": "worker", "url": "http://127.0.0.1:1/metrics", "host": "ghost", "pid": 4242,
             "seen_at_ms": int(time.time() * 1000) - 90_000}  # announced 90 s ago, never withdrawn: SIGKILLed
    r.hset(endpoints_key(stack.settings.topic_prefix), field, json.dumps(stale))
    try:
        time.sleep(2.5)  # past the console's lag cache (ttl 2 s)
        page.goto(f"{stack.console}/lag")
        row = page.locator("tr[data-service=worker]")
        assert row.count() == 1 and "missing" in row.inner_text() and "pid 4242" in row.inner_text()
    finally:
        r.hdel(endpoints_key(stack.settings.topic_prefix), field)


def _sign_in(stack: Stack, page: Any, name: str = "alice") -> None:
    page.goto(f"{stack.console}/login")
    page.fill("input[name=name]", name)
    page.fill("input[name=token]", TOKEN)
    page.click("form.login button")


def test_a_runs_page_is_its_event_history_with_payloads_and_search_finds_an_id_with_a_slash(
        stack: Stack, page: Any) -> None:
    """Issue 35 case 1: the run page shows input and output, every event with its payload (arguments, results,
    messages), one time format; the header's search box reaches a run whose id holds "/" and a space."""
    run_id = f"team/history {uuid.uuid4().hex[:6]}"
    owner = child(stack.env, run_id, "agent-h", stack.provider)
    assert owner.wait(120) == 0, owner.stderr.read()[-3000:] if owner.stderr else ""
    _wait_state(stack, run_id, lambda s: s.status.value == "SUCCEEDED")
    page.goto(f"{stack.read_only}/runs")
    page.fill("header form.search input[name=run_id]", run_id)
    page.click("header form.search button")
    assert page.inner_text("h1 .mono") == run_id and page.inner_text("#run-status") == "SUCCEEDED"
    assert '"to": "bob"' in page.inner_text("#run-input") and '"done": true' in page.inner_text("#run-output")
    history = page.locator("#timeline")
    intended = history.locator("tr.t-TOOL_CALL_INTENDED details")
    assert intended.count() == 1 and "bob@example.com" in intended.locator("summary").inner_text()
    intended.locator("summary").click()  # the payload in full: arguments decoded, the idempotency key
    shown = intended.locator("pre").inner_text()
    assert '"subject": "booking 0"' in shown and '"idempotency_key"' in shown
    committed = history.locator("tr.t-TOOL_CALL_COMMITTED details")
    committed.locator("summary").click()
    assert '"result": "{\\"sent\\": true}"' in committed.locator("pre").inner_text()  # the tool's text result
    assert "The email has been sent." in history.inner_text()  # messages' text, not only their type
    times = [t.strip() for t in page.locator("#timeline tbody tr td:last-child").all_inner_texts()]
    assert times and all(len(t) == 23 and t[10] == " " for t in times), times  # one format: 2026-12-02 16:05:01.123
    assert "T" not in page.inner_text("#epochs tbody td:last-child")
    shot = stack.shots / "console-run-history.png"
    page.screenshot(path=str(shot), full_page=True)


def test_an_unknown_outcome_is_settled_in_the_browser_and_never_runs_again(stack: Stack, page: Any) -> None:
    """Issue 35 case 2, in the console: "It happened" with a result beside Approve and Deny; the owner records the
    result (TOOL_CALL_RECONCILED) and calling again returns it without running."""
    from runjournal.producers import Journal, OutcomeUnknownError
    from runjournal.producers.approvals import ApprovalInbox, await_approval
    from tests.support.ledger import Ledger, LedgerTool

    class Blind(LedgerTool):
        reconcile = None  # type: ignore[assignment]

    r = redis.Redis.from_url(stack.settings.redis_url)
    ledger = Ledger(r, f"console{uuid.uuid4().hex[:8]}")
    charge = Blind(ledger, name="charge", then="timeout_after", result={"id": 7})
    run_id = f"console-settle-{uuid.uuid4().hex[:6]}"
    with Journal(stack.settings, producer_id=f"payer-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("tenant-a", "payer", {"amount": 12}, run_id=run_id)
        with pytest.raises(OutcomeUnknownError) as unknown:
            run.call(charge, {"logical": "charge", "amount": 12})
        approval = unknown.value.approval_id
        run.request_approval(approval, "the charge timed out after it was sent", tool="charge")
        journal.flush()
        _wait_state(stack, run_id, lambda s: approval in s.pending_approvals)
        _sign_in(stack, page)
        page.goto(f"{stack.console}/runs/{run_id}")
        asked = page.inner_text("#approvals")
        assert '"amount": 12' in asked and "It happened: the owner records the result you give" in asked, asked
        page.fill("#approvals input[name=result]", '{"id": 7, "via": "bank statement"}')
        page.fill("#approvals input[name=comment]", "the bank shows it")
        page.click("#approvals button.executed")
        assert "written to the run's inbox" in page.inner_text("#decided-note")
        inbox = ApprovalInbox(r, stack.settings.topic_prefix)
        assert await_approval(run, inbox, approval, "the charge timed out", tool="charge", timeout_s=30)
        assert run.call(charge, {"logical": "charge", "amount": 12}) == {"id": 7, "via": "bank statement"}
        run.succeed({})
        journal.flush()
    assert ledger.executions() == 1, "the settled charge ran again"
    state = _wait_state(stack, run_id, lambda s: s.status.value == "SUCCEEDED")
    (record,) = state.records.values()
    assert record.status.value == "RECONCILED" and record.reconciled_outcome.value == "COMMITTED"
    page.goto(f"{stack.console}/runs/{run_id}")
    assert "TOOL_CALL_RECONCILED" in page.inner_text("#timeline")


def test_an_operator_pauses_and_resumes_a_run_through_the_buttons(stack: Stack, page: Any) -> None:
    """Issue 31 in the console: Pause (with a reason) on a running run's page — its live owner stops at its next
    step and gives the run up, held for nobody: the page shows PAUSED, who and why — then Resume: handed back to a
    live instance under a new epoch, RUNNING."""
    from runjournal.producers import Journal, RunPausedError

    class Step:
        name = "lookup"
        side_effect = False
        timeout_ms = 1000

        def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
            return {"found": args["n"]}

    run_id = f"console-pause-{uuid.uuid4().hex[:6]}"
    with Journal(stack.settings, producer_id=f"looper-{uuid.uuid4().hex[:6]}", lease_ttl_ms=1200) as journal:
        run = journal.start_run("tenant-a", "looper", {"n": 0}, run_id=run_id)
        journal.flush()
        _wait_state(stack, run_id, lambda s: s.status.value == "RUNNING")
        stopped: list[BaseException] = []

        def agent_loop() -> None:  # the agent's loop: one step every 50 ms until the pause stops it
            try:
                for n in range(2000):
                    run.call(Step(), {"n": n})
                    time.sleep(0.05)
            except RunPausedError as exc:
                stopped.append(exc)

        agent = threading.Thread(target=agent_loop, daemon=True)
        agent.start()
        page.goto(f"{stack.read_only}/runs/{run_id}")  # the read-only console: no controls
        assert page.locator("#controls button").count() == 0
        _sign_in(stack, page)
        page.goto(f"{stack.console}/runs/{run_id}")
        assert page.locator("#controls button.resume").count() == 0  # not paused: no Resume
        controls = page.inner_text("#controls")
        assert "Pause: the owner stops at its next step" in controls and "Cancel: no new tool call" in controls
        page.fill("#controls form.c-pause input[name=reason]", "budget review")
        page.click("#controls button.pause")
        agent.join(30)
        assert stopped, "the agent's loop was not stopped by the pause"
        assert "carried out — the run is PAUSED" in page.inner_text("#control-notice")
        _reload_until(page, "PAUSED")
        held = page.inner_text("#paused-by")
        assert "paused by alice (console)" in held and "budget review" in held, held
        assert page.locator("#controls button.pause").count() == 0
        page.screenshot(path=str(stack.shots / "console-run-paused.png"))  # the header and the controls
        page.fill("#controls form.c-resume input[name=reason]", "approved")
        page.click("#controls button.resume")
        assert "carried out — the run was handed to a live instance" in page.inner_text("#control-notice")
        _reload_until(page, "RUNNING")
        assert "resumed at epoch 3 by alice (console): approved" in page.inner_text("#resumed-by")
        assert page.locator("#paused-by").count() == 0
        state = _wait_state(stack, run_id, lambda s: s.status.value == "RUNNING")
        assert (state.epoch, state.owner) == (3, journal.producer_id)
        assert journal.claim_assignment(10) == run_id  # the live instance continues it and finishes
        again = journal.resume(run_id)
        assert again.call(Step(), {"n": 0}) == {"found": 0}  # recorded before the pause: returned, not run
        again.succeed("done")
        journal.flush()
    _wait_state(stack, run_id, lambda s: s.status.value == "SUCCEEDED")


def _reload_until(page: Any, status: str, timeout_s: float = 30) -> None:
    """Reload the run page until its header shows ``status`` (the projector service applies what was written)."""
    deadline = time.monotonic() + timeout_s
    while page.inner_text("#run-status") != status:
        assert time.monotonic() < deadline, f"the page shows {page.inner_text('#run-status')}, not {status}"
        time.sleep(0.3)
        page.reload()


def _wait_pending(stack: Stack, run_id: str, timeout_s: float = 60) -> None:
    _wait_state(stack, run_id, lambda s: "send" in s.pending_approvals, timeout_s)


def _wait_state(stack: Stack, run_id: str, ok: Any, timeout_s: float = 60) -> Any:
    """The run's projected state once ``ok(state)`` (the projector service keeps folding)."""
    store = ProjectionStore(redis.Redis.from_url(stack.settings.redis_url), stack.settings.topic_prefix)
    partition = partition_for(run_id, stack.settings.partitions)
    deadline = time.monotonic() + timeout_s
    while True:
        state = store.get(partition, run_id)
        if state is not None and ok(state):
            return state
        assert time.monotonic() < deadline, f"run {run_id}: {state.status if state else 'no state'}"
        time.sleep(0.2)


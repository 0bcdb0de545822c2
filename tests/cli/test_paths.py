"""Issue 14 (g), case 9: every command and option the docs name (README.md, docs/**/*.md: the commands reference
names them all), run the way a user runs it (a subprocess), and
its failure paths: no stack, no topic, a refusal — each named on stderr (JSON under ``--json``, stdout
empty) with a non-zero exit, within 5 s of the command's own start, naming the command that fixes it.

Old code: ``demo`` with no stack hung 30 s and printed a raw KafkaException; ``inspect`` and ``recover`` on a
missing topic crashed with a ValueError; ``recover --json`` printed a refusal as plain text on stdout.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from runjournal.core.settings import Settings
from runjournal.deploy.procs import free_port
from tests.package.test_docs import ROOT, app_commands, documented_commands
from tests.support.faults import live, owns
from tests.support.workload import publish, run_events

pytestmark = pytest.mark.integration

#: Interpreter start plus imports on a loaded 2-core machine; the 5 s budget is the command's own.
STARTUP_S = 6.0


def rj(env: dict[str, str], *args: str, timeout: float = 180) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "runjournal", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    return proc, time.monotonic() - started


def json_error(proc: subprocess.CompletedProcess[str]) -> dict:
    """The error document of a failed ``--json`` command: the last stderr line, and nothing on stdout."""
    assert proc.returncode != 0 and proc.stdout.strip() == "", (proc.returncode, proc.stdout[-500:])
    doc = json.loads(proc.stderr.strip().splitlines()[-1])
    assert set(doc) >= {"error", "message"}
    return doc


NO_STACK_COMMANDS = [
    ["demo", "--runs", "2", "--json"],
    ["projector", "--until-caught-up", "--json"],
    ["inspect", "some-run", "--json"],
    ["recover", "--stale", "--json"],
    ["replay", "some-run", "--json"],
    ["approve", "some-run", "c1", "--json"],
    ["deny", "some-run", "c1", "--json"],
    ["erase", "some-run", "--yes", "--json"],
    ["memory-extractor", "--until-caught-up", "--json"],
    ["topics", "create", "--json"],
    ["topics", "describe", "--json"],
    ["archiver", "--until-caught-up", "--json"],
    ["query", "select 1", "--json"],
    ["stream", "some-run", "--json"],
    ["settle", "some-run", "a1", "--result", "{}", "--json"],
    ["cancel", "some-run", "--json"],
    ["pause", "some-run", "--json"],
    ["resume", "some-run", "--json"],
    ["fork", "some-run", "--json"],
    ["signal", "some-run", "go", "--json"],
    ["spend", "budget", "--tenant", "t", "--dim", "model_calls", "--limit", "1", "--json"],
    ["acls", "create", "--json"],
]
NO_STACK_EXEMPT = {
    "console": "serves pages; each page names a service that does not answer (tests/console)",
    "settings": "prints the settings, asks no service",
    "stack up": "starts the stack", "stack env": "prints the stack's variables", "stack down": "stops the stack",
    "stack status": "reports what runs, a missing stack included",
    "schemas check": "the bundled schemas only", "schemas publish": "needs a registry only when one is set",
    "memory serve": "owns the embedded Qdrant directory", "memory search": "Qdrant, embedded by default",
    "memory stats": "Qdrant, embedded by default", "knowledge ingest": "Qdrant, embedded by default",
    "knowledge search": "Qdrant, embedded by default", "knowledge stats": "Qdrant, embedded by default",
    "acls show": "prints the ACL table, asks no service",
}
"""Commands that need no broker or Redis (why), so a missing stack is not theirs to name."""


def test_every_command_is_checked_without_a_stack_or_exempt() -> None:
    """A new command that talks to the stack joins NO_STACK_COMMANDS (``query`` and ``stream`` waited 10 s and
    printed librdkafka's KafkaException; ``acls create`` waited 30 s and blamed the user's rights)."""
    from typer.main import get_command

    from runjournal.cli import app
    from tests.cli.test_values import _commands

    checked = {" ".join(a[:2]) if a[0] in ("topics", "spend", "acls") else a[0] for a in NO_STACK_COMMANDS}
    missing = [" ".join(path) for path, _c in _commands(get_command(app))
               if " ".join(path) not in checked and " ".join(path) not in NO_STACK_EXEMPT]
    assert missing == [], "add these to NO_STACK_COMMANDS (or NO_STACK_EXEMPT, saying why)"


@pytest.mark.parametrize("argv", NO_STACK_COMMANDS,
                         ids=lambda a: a[0] + ("-" + a[1] if a[0] in ("topics", "spend", "acls") else ""))
def test_case9_no_stack_is_named_within_5s_with_the_fix(service_env: dict[str, str], argv: list[str]) -> None:
    env = {**service_env, "RUNJOURNAL_BOOTSTRAP": f"127.0.0.1:{free_port()}",
           "RUNJOURNAL_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    proc, elapsed = rj(env, *argv, timeout=60)
    doc = json_error(proc)
    assert "runjournal stack up" in doc["message"], doc
    assert elapsed < 5 + STARTUP_S, f"{argv[0]} took {elapsed:.1f} s to say the stack is missing"


@pytest.mark.parametrize("argv", [["inspect", "r1", "--json"], ["approve", "r1", "c1", "--json"],
                                  ["recover", "--stale", "--json"], ["projector", "--until-caught-up", "--json"]],
                         ids=lambda a: a[0])
def test_case9_redis_alone_down_is_named_within_5s_with_the_fix(settings: Settings, service_env: dict[str, str],
                                                                argv: list[str]) -> None:
    """The broker answers, Redis does not (issue 35: the preflight's Redis branch had no test): named, one line."""
    proc, elapsed = rj({**service_env, "RUNJOURNAL_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}, *argv,
                       timeout=60)
    doc = json_error(proc)
    assert doc["error"] == "StackUnavailableError", doc
    assert "RUNJOURNAL_REDIS_URL" in doc["message"] and "runjournal stack up" in doc["message"], doc
    assert proc.stderr.strip().count("\n") == 0, proc.stderr  # one line: no traceback
    assert elapsed < 5 + STARTUP_S, f"{argv[0]} took {elapsed:.1f} s to say Redis is missing"


@pytest.mark.parametrize("argv", [["inspect", "r1", "--json"], ["recover", "--stale", "--json"],
                                  ["recover", "--run", "r1", "--json"], ["replay", "r1", "--json"],
                                  ["projector", "--until-caught-up", "--json"], ["approve", "r1", "c1", "--json"],
                                  ["erase", "r1", "--yes", "--json"], ["memory-extractor", "--until-caught-up",
                                                                       "--json"],
                                  ["topics", "describe", "--json"]],  # issue 35: it exited 0 with every topic missing
                         ids=lambda a: "-".join(a[:2]))
def test_case9_missing_topic_is_named_with_the_fix(settings: Settings, service_env: dict[str, str],
                                                   argv: list[str]) -> None:
    """``settings`` (not ``topics``): the prefix's topics were never created."""
    proc, elapsed = rj(service_env, *argv, timeout=60)
    doc = json_error(proc)
    assert doc["error"] == "TopicNotFoundError" and "runjournal topics create" in doc["message"], doc
    assert elapsed < 5 + STARTUP_S


SETTINGS_ERRORS = {"unknown_variable": ("RUNJOURNAL_BOOTSTRAPP", "x"),
                   "invalid_redis_url": ("RUNJOURNAL_REDIS_URL", "http://x")}
JSON_COMMANDS = [["topics", "describe", "--json"], ["recover", "--stale", "--json"], ["inspect", "r1", "--json"],
                 ["memory", "search", "--tenant", "t", "hello", "--json"], ["acls", "show", "--json"],
                 ["projector", "--until-caught-up", "--json"], ["stack", "status", "--json"]]


@pytest.mark.parametrize("bad", list(SETTINGS_ERRORS), ids=str)
@pytest.mark.parametrize("argv", JSON_COMMANDS, ids=lambda a: "-".join(a[:2]))
def test_a_settings_error_under_json_is_json_on_stderr(service_env: dict[str, str], argv: list[str],
                                                       bad: str) -> None:
    """Settings are loaded by every command the same way; a bad RUNJOURNAL_* variable under --json is one JSON
    document on stderr naming the variable, stdout empty, exit 2 (runjournal/cli/_app.py)."""
    name, value = SETTINGS_ERRORS[bad]
    proc, _ = rj({**service_env, name: value}, *argv, timeout=120)
    doc = json_error(proc)
    assert proc.returncode == 2 and doc["error"] == "ConfigError" and name in doc["message"], doc
    assert proc.stderr.strip().count("\n") == 0, proc.stderr  # one line: no traceback, no text beside it
    plain, _ = rj({**service_env, name: value}, *[a for a in argv if a != "--json"], timeout=120)
    assert plain.returncode == 2 and plain.stderr.startswith("error: ") and name in plain.stderr


def test_usage_errors_under_json_are_json_on_stderr(service_env: dict[str, str]) -> None:
    """A bad option value (click's BadParameter) and a bad --agent-name under --json: JSON on stderr, exit 2."""
    proc, _ = rj(service_env, "acls", "show", "--redis", "--agent-name", "a b", "--json")
    doc = json_error(proc)
    assert proc.returncode == 2 and doc["error"] == "UsageError" and "--agent-name" in doc["message"], doc
    plain, _ = rj(service_env, "acls", "show", "--redis", "--agent-name", "a b")
    assert plain.returncode == 2 and "Traceback" not in plain.stderr and "--agent-name" in plain.stderr
    proc, _ = rj(service_env, "recover", "--stale", "--watch", "abc", "--json")
    doc = json_error(proc)
    assert proc.returncode == 2 and doc["error"] == "BadParameter" and "--watch" in doc["message"], doc


def test_memory_search_json_with_no_hits_prints_an_empty_array(topics: Settings,
                                                               service_env: dict[str, str]) -> None:
    proc, _ = rj(service_env, "memory", "search", "--tenant", "nobody-" + uuid.uuid4().hex[:6], "hello", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == []


def test_case9_recover_json_refusal_is_json_on_stderr(topics: Settings, service_env: dict[str, str]) -> None:
    publish(topics, run_events("live-run", finish=False))
    owns(topics, "alive-1", "live-run")
    live(topics, "alive-1")
    proc, _ = rj(service_env, "recover", "--instance", "alive-1", "--json")
    doc = json_error(proc)
    assert doc["error"] == "RecoveryError" and "live lease" in doc["message"]
    proc, _ = rj(service_env, "recover", "--json")  # no selection: a usage error, JSON too
    assert json_error(proc)["error"] == "UsageError"
    proc, _ = rj(service_env, "inspect", "no-such-run", "--json")
    assert json_error(proc)["error"] == "RunNotFound"


#: Commands and options the docs name that need more than one small journal on the private stack (a secure
#: cluster, a registry, a pending approval, the agent fleet): the test that runs each. Checked: the file exists and
#: runs the command (its words quoted, comma-separated) with the option (quoted).
ELSEWHERE: dict[tuple[str, str | None], str] = {
    **{("acls create", o): "tests/cluster/test_redis_refusals.py" for o in (None, "--agent-name", "--json",
                                                                           "--principal", "--redis")},
    **{("approve", o): "tests/producers/test_approvals.py" for o in (None, "--approver", "--comment", "--json")},
    **{("deny", o): "tests/producers/test_approvals.py" for o in (None, "--approver", "--reason", "--json")},
    **{("settle", o): "tests/faults/test_settle_by_hand.py" for o in (None, "--result", "--approver", "--comment",
                                                                     "--json")},
    **{("console", o): "tests/core/test_metrics.py" for o in (None, "--host", "--per-page", "--port", "--scrape")},
    **{("demo", o): "tests/demo/test_demo.py" for o in (None, "--agents", "--faults", "--json", "--keep",
                                                       "--kill-every", "--kills", "--knowledge", "--no-memory",
                                                       "--outcome-commit", "--partitions", "--provider-idempotency",
                                                       "--report", "--runs", "--seed")},
    ("demo", "--fault-times"): "tests/demo/test_faults.py",
    **{("archiver", o): "tests/consumers/archive/test_archive.py" for o in (None, "--until-caught-up",
                                                                           "--sweep-interval", "--json")},
    **{("archiver", o): "tests/consumers/archive/test_archive_faults.py" for o in ("--metrics-port",
                                                                                  "--metrics-addr")},
    **{("query", o): "tests/consumers/archive/test_query.py" for o in (None, "--json", "--csv", "--no-live",
                                                                      "--no-archive")},
    **{("signal", o): "tests/cli/test_signal.py" for o in (None, "--payload", "--by", "--json")},
    **{("fork", o): "tests/cli/test_fork.py" for o in (None, "--at", "--run-id", "--reason", "--by", "--assign-to",
                                                       "--dry-run", "--json")},
    **{(c, o): "tests/cli/test_control.py" for c in ("cancel", "pause", "resume")
       for o in (None, "--reason", "--by", "--wait", "--dry-run", "--tenant", "--agent", "--status", "--older-than",
                 "--limit", "--json")},
    ("demo", "--input"): "tests/campaign/test_campaign.py",
    **{("spend", o): "tests/cli/test_spend.py" for o in (None, "--run", "--tenant", "--user", "--json")},
    **{("spend budget", o): "tests/cli/test_spend.py" for o in (None, "--tenant", "--run", "--user", "--dim",
                                                                "--limit", "--clear", "--by", "--reason", "--json")},
    ("memory serve", None): "tests/consumers/cognition/test_readers.py",
    **{("stream", o): "tests/cli/test_stream.py" for o in (None, "--from-offset", "--follow", "--json")},
    **{("erase", o): "tests/cli/test_erase_keys.py" for o in ("--tenant", "--subject")},
    ("schemas check", "--candidate"): "tests/schemas/test_evolution.py",
    ("schemas check", "--registry"): "tests/schemas/test_registry.py",
    **{("schemas publish", o): "tests/schemas/test_registry.py" for o in (None, "--json", "--registry")},
    **{(c, o): "tests/deploy/test_stack.py" for c, o in [("stack down", None), ("stack down", "--json"),
                                                        ("stack status", None), ("stack status", "--json"),
                                                        ("stack up", None), ("stack up", "--json"),
                                                        ("stack up", "--kafka-port"), ("stack up", "--controller-port"),
                                                        ("stack up", "--redis-port"), ("stack up", "--registry"),
                                                        ("stack up", "--registry-port")]},
    **{("stack up", o): "tests/deploy/test_object_store.py" for o in ("--object-store", "--object-store-port")},
    **{("stack up", o): "tests/cluster/conftest.py" for o in ("--brokers", "--secure", "--redis-cluster")},
    **{("stack env", o): "tests/cluster/conftest.py" for o in (None, "--json", "--role")},
}
#: Named in the docs and run by no test, each with the reason.
NOT_RUN: dict[tuple[str, str | None], str] = {
    ("demo", "--memory"): "the default: every demo without --no-memory runs the extractor (tests/demo/test_demo.py)",
    ("schemas publish", "--subject"): "needs a registry; tests/schemas/test_registry.py publishes to the default "
                                      "subject {prefix}.events-value",
    ("stack up", "--timeout"): "the readiness timeout: tests/deploy/test_stack.py starts the stack with the default",
}


class _Ran:
    """What the test ran: (command path, option or None), as :func:`documented_commands` names them."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, str | None]] = set()

    def __call__(self, args: tuple[str, ...] | list[str]) -> None:
        words = list(args)
        while words and words[0].startswith("-"):  # global options: --version, --log-level LEVEL
            option = words.pop(0)
            self.seen.add(("", option))
            if option == "--log-level" and words:
                words.pop(0)
        if not words:
            return
        pair = f"{words[0]} {words[1]}" if len(words) > 1 else None
        path = pair if pair is not None and pair in app_commands() else words[0]
        self.seen.add((path, None))
        self.seen.update((path, w) for w in words if w.startswith("--"))


@pytest.mark.slow
def test_every_readme_command_and_option(topics: Settings, service_env: dict[str, str], tmp_path: Path) -> None:
    """Every command and option README.md and docs/**/*.md name (docs/reference/commands.md names them all), run as
    a subprocess on one small journal — or, for those that need more (ELSEWHERE), by the test named there."""
    env = service_env
    ran = _Ran()
    ok = _ok_factory(env, ran)

    def spawn(*args: str) -> subprocess.Popen[str]:
        ran(args)
        return subprocess.Popen([sys.executable, "-m", "runjournal", *args], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    assert ok("--version").stdout.startswith("runjournal ")
    assert json.loads(ok("settings").stdout)["topic_prefix"] == topics.topic_prefix
    assert ok("--log-level", "DEBUG", "settings").returncode == 0
    created = json.loads(ok("topics", "create", "--partitions", "3", "--json").stdout)
    assert {t["action"] for t in created} == {"exists"}
    assert {t["name"] for t in json.loads(ok("topics", "describe", "--json").stdout)} >= {topics.events_topic}
    ok("topics", "describe")
    assert json.loads(ok("schemas", "check", "--json", "--samples", "2").stdout)["ok"] is True
    ok("schemas", "check")
    assert set(json.loads(ok("acls", "show", "--json").stdout)) >= {"agent", "projector", "recovery", "memory",
                                                                    "operator"}
    assert set(json.loads(ok("acls", "show", "--role", "agent", "--redis", "--agent-name", "a1", "--json").stdout)) \
        == {"agent"}
    ok("acls", "show")

    runs = ["cli-a", "cli-b", "cli-c"]
    publish(topics, run_events("cli-a") + run_events("cli-b", finish=False) + run_events("cli-c", finish=False))
    stats = json.loads(ok("projector", "--until-caught-up", "--batch-size", "5", "--json").stdout)
    assert stats["events"] == sum(len(run_events(r, finish=r == "cli-a")) for r in runs)
    ok("projector", "--until-caught-up")
    rebuilt = json.loads(ok("projector", "--until-caught-up", "--rebuild", "--json").stdout)
    assert rebuilt["events"] == stats["events"], "--rebuild folds the whole topic again"
    _served(spawn, "projector", "runjournal_projector_events", "--instance-id", f"cli-{uuid.uuid4().hex[:6]}")

    report = json.loads(ok("inspect", "cli-a", "--json").stdout)
    assert report["state"]["status"] == "SUCCEEDED" and report["timeline"]
    text = ok("inspect", "cli-a").stdout
    assert "cli-a" in text and 'input: {"q": 1}' in text and 'output: "done"' in text  # issue 35: what it did
    ok("inspect", "cli-a", "--no-timeline")
    assert json.loads(ok("inspect", "cli-a", "--timeline", "--json").stdout)["timeline"]
    assert json.loads(ok("replay", "cli-a", "--until-seq", "3", "--json").stdout)["state"]["last_seq"] == 3
    ok("replay", "cli-a")

    owns(topics, "dead-1", "cli-b")
    live(topics, "live-1")
    out = json.loads(ok("recover", "--instance", "dead-1", "--json").stdout)
    assert [(r["run_id"], r["action"], r["assigned_to"]) for r in out["runs"]] == [("cli-b", "resumed", "live-1")]
    live(topics, "live-2")
    out = json.loads(ok("recover", "--run", "cli-c", "--assign-to", "live-2", "--force", "--json").stdout)
    assert [(r["action"], r["assigned_to"]) for r in out["runs"]] == [("resumed", "live-2")]
    ok("recover", "--stale")
    port = free_port()
    watcher = spawn("recover", "--stale", "--watch", "0.5", "--json", "--metrics-port", str(port),
                    "--metrics-addr", "127.0.0.1")
    assert "runjournal_recovery_passes_total" in _get(f"http://127.0.0.1:{port}/metrics", timeout_s=60)
    time.sleep(3)
    watcher.send_signal(signal.SIGINT)
    stdout, _ = watcher.communicate(timeout=60)
    assert len([line for line in stdout.splitlines() if line.startswith("{")]) >= 2, "--watch repeats the pass"

    extracted = json.loads(ok("memory-extractor", "--until-caught-up", "--batch-size", "100", "--json").stdout)
    assert extracted["events"] > 0
    ok("memory-extractor", "--until-caught-up")
    _served(spawn, "memory-extractor", "runjournal_memory_events")
    for hit in json.loads(ok("memory", "search", "--tenant", "acme", "--user", "u1", "--agent", "airline", "--limit",
                             "3", "--all-statuses", "--json", "thanks").stdout):
        assert hit["scope"]["tenant_id"] == "acme"
    ok("memory", "search", "--tenant", "acme", "anything")
    assert "active" in json.loads(ok("memory", "stats", "--tenant", "acme", "--json").stdout)
    ok("memory", "stats")

    doc = tmp_path / "policy.md"
    doc.write_text("# Baggage\n\nEach passenger may check two bags.\n\n# Seats\n\nWindow seats cost extra.\n")
    assert json.loads(ok("knowledge", "ingest", str(doc), "--corpus", "cli", "--json").stdout)
    found = json.loads(ok("knowledge", "search", "how many bags", "--corpus", "cli", "--document", str(doc),
                          "--limit", "1", "--json").stdout)
    assert found
    ok("knowledge", "search", "window")
    assert json.loads(ok("knowledge", "stats", "--json").stdout)
    ok("knowledge", "stats")

    erased = json.loads(ok("erase", "cli-a", "--yes", "--json").stdout)
    assert erased["tombstones"] > 0
    ok("erase", "cli-b", "--yes", "--force")

    documented = documented_commands()
    missing = sorted(f"runjournal {c} {o or ''} ({where})" for (c, o), where in documented.items()
                     if (c, o) not in ran.seen and (c, o) not in ELSEWHERE and (c, o) not in NOT_RUN)
    assert missing == [], "named in the docs and run by no test: run it here, or name its test in ELSEWHERE"
    stale = sorted(f"{c} {o}" for c, o in [*ELSEWHERE, *NOT_RUN] if (c, o) not in documented or (c, o) in ran.seen)
    assert stale == [], "ELSEWHERE / NOT_RUN entries the docs no longer name, or that this test runs itself"


def test_every_command_run_elsewhere_is_run_there() -> None:
    """Each ELSEWHERE entry: the named test file runs the command (its words quoted, comma-separated) and has the
    option; a NOT_RUN entry is run by no test (else it belongs in ELSEWHERE)."""
    bad = []
    for (command, option), test in ELSEWHERE.items():
        path = ROOT / test
        text = path.read_text() if path.is_file() else ""
        needle = ", ".join(f'"{w}"' for w in command.split())
        if needle not in text or (option is not None and f'"{option}"' not in text):
            bad.append(f"{test} does not run runjournal {command} {option or ''}")
    tests = [p.read_text() for p in (ROOT / "tests").rglob("*.py") if p.name != "test_paths.py"]
    for command, option in NOT_RUN:
        needle = ", ".join(f'"{w}"' for w in command.split())
        if any(needle in text and f'"{option}"' in text for text in tests):
            bad.append(f"runjournal {command} {option} is run by a test: move it to ELSEWHERE")
    assert bad == []


def _served(spawn: Callable[..., subprocess.Popen[str]], command: str, family: str, *args: str) -> None:
    """``command --metrics-port P --metrics-addr 127.0.0.1 …`` as a service: its /metrics answers with ``family``,
    and SIGTERM stops it with exit 0."""
    port = free_port()
    served = spawn(command, "--metrics-port", str(port), "--metrics-addr", "127.0.0.1", *args)
    try:
        body = _get(f"http://127.0.0.1:{port}/metrics", timeout_s=90)
        assert family in body and "runjournal_dependency_retries" in body
    finally:
        served.send_signal(signal.SIGTERM)
        assert served.wait(60) == 0, served.stderr.read()[-2000:] if served.stderr else ""


def _ok_factory(env: dict[str, str], ran: _Ran):  # noqa: ANN202
    def ok(*args: str) -> subprocess.CompletedProcess[str]:
        ran(args)
        proc, _ = rj(env, *args)
        assert proc.returncode == 0, (args, proc.stderr[-3000:])
        return proc
    return ok


def _get(url: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - loopback
                return resp.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)

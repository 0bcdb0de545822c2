"""Issue 35 case 4, values nobody checks: every numeric option of every command has a bound, checked before the
command does anything (a usage error, exit 2, naming the option; pure JSON under ``--json``).

Old code: ``recover --stale --watch 0`` ran a hot loop (~155 passes in 5 s); ``demo --agents 0`` hung for 11 min;
``demo --runs 0`` printed a raw Redis error; a bad ``--input`` printed a traceback after creating topics.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command

from runjournal.cli import app
from runjournal.cli._values import positive_seconds
from runjournal.demo.run import DemoOptionError, DemoOptions

RUNJOURNAL = [sys.executable, "-m", "runjournal"]
UNBOUNDED = {("demo", "seed")}
"""Numeric options any value of which is meaningful."""


def _commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    if hasattr(command, "commands"):
        return [c for name, sub in command.commands.items() for c in _commands(sub, (*path, name))]
    return [(path, command)]


def test_every_numeric_option_of_every_command_has_a_bound() -> None:
    unbounded = []
    for path, command in _commands(get_command(app)):
        for param in command.params:
            annotation = str(param.type_descriptor.annotation)
            if not any(t in annotation for t in ("int", "float")) or "list" in annotation:
                continue
            bounded = param.min is not None or param.type_descriptor.parameter_info.callback is positive_seconds
            if not bounded and (" ".join(path), param.name) not in UNBOUNDED:
                unbounded.append(f"{' '.join(path)} --{param.name.replace('_', '-')}")
    assert unbounded == [], "give these a min (runjournal/cli/_values.py) or list them in UNBOUNDED"


def _nowhere_env(tmp_path: Path) -> dict[str, str]:
    """No stack at all: a command that checks its values first fails at once, without asking a broker."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNJOURNAL_")}
    return {**env, "RUNJOURNAL_BOOTSTRAP": "127.0.0.1:1", "RUNJOURNAL_REDIS_URL": "redis://127.0.0.1:1/0",
            "RUNJOURNAL_STACK_DIR": str(tmp_path / "stack")}


def _run(env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    out = subprocess.run([*RUNJOURNAL, *args], capture_output=True, text=True, env=env, timeout=60, check=False)
    return out, time.monotonic() - started


@pytest.mark.parametrize(("args", "option"), [
    (["recover", "--stale", "--watch", "0"], "--watch"),
    (["recover", "--stale", "--watch", "-1"], "--watch"),
    (["demo", "--agents", "0"], "--agents"),
    (["demo", "--runs", "0"], "--runs"),
    (["demo", "--kill-every", "0"], "--kill-every"),
    (["projector", "--batch-size", "0"], "--batch-size"),
    (["stack", "up", "--kafka-port", "70000"], "--kafka-port"),
    (["topics", "create", "--partitions", "0"], "--partitions"),
    (["memory", "search", "x", "--tenant", "t", "--limit", "0"], "--limit"),
])
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_an_out_of_range_value_is_a_usage_error_before_anything_runs(tmp_path: Path, args: list[str], option: str,
                                                                      as_json: bool) -> None:
    out, took = _run(_nowhere_env(tmp_path), *args, *(["--json"] if as_json else []))
    assert out.returncode == 2, (out.stdout[-500:], out.stderr[-500:])
    assert took < 20, f"{args}: {took:.1f} s (it asked something before checking its values?)"
    assert option in out.stderr
    if as_json:
        assert out.stdout == ""
        assert json.loads(out.stderr)["message"]


@pytest.mark.parametrize(("content", "words"), [
    ("not json", "not JSON"),
    ('{"runs": 1}', "expected a JSON array"),
    ('[{"traj": "x", "reward": 1}]', "has no 'task_id'"),
    ('[{"traj": [{"role": "assistant", "tool_calls": [{}]}], "reward": 1, "task_id": 3}]', "not a tau-bench"),
    ("[]", "holds no run"),
    (None, "cannot be read"),
])
def test_a_bad_input_is_named_before_anything_is_created(tmp_path: Path, content: str | None, words: str) -> None:
    path = tmp_path / "input.json"
    if content is not None:
        path.write_text(content)
    out, _took = _run(_nowhere_env(tmp_path), "demo", "--input", str(path), "--json")
    assert out.returncode == 2 and out.stdout == "", out.stderr[-800:]
    error = json.loads(out.stderr)
    assert error["error"] == "DemoOptionError" and words in error["message"] and "--input" in error["message"]
    assert not (tmp_path / "stack" / "demo").exists(), "a work folder was created"


@pytest.mark.parametrize("change", [{"agents": 0}, {"generated_runs": 0}, {"partitions": 0}, {"kills": -1},
                                    {"kill_every_s": 0.0}, {"fault_times": 0}, {"timeout_s": -5.0}])
def test_the_api_checks_the_same_values(change: dict[str, Any]) -> None:
    with pytest.raises(DemoOptionError):
        DemoOptions(**change).check()


@pytest.mark.integration
@pytest.mark.parametrize(("args", "kind"), [
    (["--run", "no-such-run"], "UnknownRunError"),
    (["--instance", "nobody-ever"], "UnknownInstanceError"),
])
def test_recover_names_a_run_or_instance_that_never_existed(topics: Any, service_env: dict[str, str],
                                                            args: list[str], kind: str) -> None:
    """Issue 35 case 6: ``recover --run no-such-run`` and ``--instance nobody`` exited 0 as if a pass had worked."""
    out, _took = _run(service_env, "recover", *args, "--json")
    assert out.returncode == 1 and out.stdout == "", (out.stdout, out.stderr)  # refused before any pass
    lines = [json.loads(line) for line in out.stderr.splitlines() if line.strip()]  # JSON log lines may come too
    (error,) = [line for line in lines if "error" in line]
    assert error["error"] == kind and args[1] in error["message"]


@pytest.mark.integration
def test_an_empty_watch_pass_says_so_once(topics: Any, service_env: dict[str, str]) -> None:
    """Issue 35 case 6: ``recover --stale --watch`` printed an empty table every pass and never said why."""
    import signal

    watcher = subprocess.Popen([*RUNJOURNAL, "recover", "--stale", "--watch", "0.2"], env=service_env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(6)
    watcher.send_signal(signal.SIGINT)
    stdout, stderr = watcher.communicate(timeout=60)
    assert stdout.count("nothing to recover") == 1, (stdout[-1500:], stderr[-1500:])
    assert "run" not in stdout.replace("nothing to recover: no run of", ""), stdout[-1500:]  # no empty tables

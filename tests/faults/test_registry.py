"""The entry-point and failpoint registries are complete: a new way to write to the journal, or a new failpoint, fails
here until it is registered, armed by a test and documented (tests/faults/entrypoints.py)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from runjournal.core.failpoints import REGISTRY
from tests.faults.entrypoints import CLASSES, READERS, WRITERS

ROOT = Path(__file__).resolve().parents[2]


def _cli_commands() -> list[str]:
    from typer.main import get_command

    from runjournal.cli._app import app

    def walk(command: object, prefix: str) -> list[str]:
        subs = getattr(command, "commands", None)
        if subs is None:
            return [prefix]
        own = [prefix] if getattr(command, "invoke_without_command", False) else []  # `spend RUN_ID`: a command too
        return own + [name for key, sub in sorted(subs.items()) for name in walk(sub, f"{prefix} {key}")]

    return walk(get_command(app), "cli")


def _public_methods() -> list[str]:
    out = []
    for spec in CLASSES:
        module, name = spec.split(":")
        cls = getattr(importlib.import_module(module), name)
        for attr, value in vars(cls).items():
            if not attr.startswith("_") and (callable(value) or isinstance(value, (classmethod, staticmethod))):
                out.append(f"{name}.{attr}")
    return out


def test_every_command_and_public_method_is_registered_as_writer_or_reader() -> None:
    entries = _cli_commands() + _public_methods()
    unclassified = [e for e in entries if e not in WRITERS and e not in READERS]
    assert unclassified == [], "register these in tests/faults/entrypoints.py (WRITERS with race/kill, or READERS)"
    assert not set(WRITERS) & READERS


def test_the_registry_names_nothing_that_does_not_exist() -> None:
    known = set(_cli_commands()) | set(_public_methods()) | {"await_approval", "continue_run"}
    assert sorted((set(WRITERS) | READERS) - known) == []


def _hits_in_code() -> set[str]:
    names = set()
    for path in (ROOT / "runjournal").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "hit"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "failpoints"):
                arg = node.args[0]
                assert isinstance(arg, ast.Constant), f"{path}: a failpoint name is a literal"
                names.add(arg.value)
    return names


def test_every_failpoint_in_the_code_is_registered() -> None:
    assert _hits_in_code() == set(REGISTRY)


def test_every_failpoint_is_armed_by_a_test() -> None:
    """Armed: named in a test that sets ``RJ_FAILPOINTS``, or a failpoint of a writer the generated matrix drives."""
    texts = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py") if p.name != "entrypoints.py")
    by_matrix = {fp for w in WRITERS.values() if w.matrix for fp in w.failpoints}
    unarmed = sorted(fp for fp in REGISTRY if fp not in by_matrix and not re.search(re.escape(fp) + r"\b", texts))
    assert unarmed == []


def test_every_writer_names_real_failpoints_and_tests() -> None:
    for name, writer in WRITERS.items():
        assert set(writer.failpoints) <= set(REGISTRY), name
        assert writer.matrix or writer.covered_by, f"{name}: which test races and kills it?"
        for path in filter(None, (p.strip() for p in writer.covered_by.split(","))):
            assert (ROOT / path).exists(), f"{name}: {path}"


def test_the_concurrency_page_states_each_writer() -> None:
    """docs/operations/concurrency.md says, per writing entry point, what a race and a kill do."""
    page = (ROOT / "docs" / "operations" / "concurrency.md").read_text()
    missing = [name for name in WRITERS if f"`{name}`" not in page]
    assert missing == []

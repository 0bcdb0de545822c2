"""The layout rules of docs/design/layout.md, checked on the tree: one package tree, rooms by role, no private
reach-ins across packages, docs inside the repository."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "runjournal"
CODE = sorted(p for p in PACKAGE.rglob("*.py"))
EXAMPLES = sorted((ROOT / "examples").rglob("*.py"))
DOCS = sorted(p for p in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *ROOT.glob("docs/**/*.md"),
               *PACKAGE.rglob("*.md"), *(ROOT / "examples").glob("*.md")] if p.exists())


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted name) of every absolute import, ``from a import b`` giving ``a.b``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def _private_owner(dotted: str) -> str | None:
    """The package that owns the first private component of ``dotted`` (``a.b._c.d`` → ``a.b``), or None."""
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def _reach_ins(where: str, importer: str, tree: ast.AST) -> list[str]:
    bad = []
    for line, name in _imported(tree):
        if not name.startswith("runjournal."):
            continue
        owner = _private_owner(name)
        if owner is not None and not (importer == owner or importer.startswith(owner + ".")):
            bad.append(f"{where}:{line}: {name}")
    return bad


def test_no_module_imports_another_packages_private_module() -> None:
    """A ``_private`` module is its package's own: code elsewhere (another package, an example, a doc snippet)
    imports the public name its package exports instead (tests and the bench may reach in)."""
    bad = []
    for path in CODE:
        bad += _reach_ins(str(path.relative_to(ROOT)), _module_of(path), ast.parse(path.read_text()))
    for path in EXAMPLES:
        bad += _reach_ins(str(path.relative_to(ROOT)), "examples", ast.parse(path.read_text()))
    for doc in DOCS:
        for i, block in enumerate(re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)):
            try:
                tree = ast.parse(block)
            except SyntaxError:
                continue
            bad += _reach_ins(f"{doc.relative_to(ROOT)}#{i}", "docs", tree)
    assert bad == []


def test_the_package_is_one_tree_and_the_card_names_link_into_it() -> None:
    for name in ("producers", "consumers", "schemas", "deploy"):
        link = ROOT / name
        assert link.is_symlink() and link.resolve() == (PACKAGE / name).resolve(), name
        assert (PACKAGE / name).is_dir() and not (PACKAGE / name).is_symlink(), name
    assert "class Projector:" in (PACKAGE / "consumers" / "projector" / "service.py").read_text()


def test_consumers_holds_only_rooms() -> None:
    """``runjournal/consumers/`` has subpackages only (runtime, projector, recovery, ops, vectors, memory,
    knowledge, cognition, context, streams, archive), no loose modules."""
    consumers = PACKAGE / "consumers"
    loose = sorted(p.name for p in consumers.glob("*.py") if p.name != "__init__.py")
    assert loose == []
    rooms = sorted(p.name for p in consumers.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert rooms == sorted(["archive", "cognition", "context", "knowledge", "memory", "ops", "projector", "recovery",
                            "runtime", "streams", "vectors"])


def test_tests_mirror_the_package() -> None:
    """No test module at the root of tests/ (they live beside the package part they test, or in tests/faults/), and
    one helpers folder (tests/support/)."""
    tests = ROOT / "tests"
    assert sorted(p.name for p in tests.glob("test_*.py")) == []
    assert not (tests / "helpers").exists()
    for room in ("producers", "schemas", "model", "stores", "consumers/projector", "consumers/recovery", "faults",
                 "support", "package"):
        assert (tests / room).is_dir(), room

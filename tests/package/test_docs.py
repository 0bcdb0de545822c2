"""Docs by audience, kept honest: a short README, citations that resolve inside the repository, links (and their
anchors) that work, the protocol's cited sections present, and a commands reference that names every command and
option the app has.

:func:`app_commands` and :func:`documented_commands` are shared with the slow test
tests/cli/test_paths.py::test_every_readme_command_and_option, which runs what the docs name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The pages for readers: the README, the contributor's pages and everything under docs/.
DOCS = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")])
#: Pages whose links are checked besides DOCS (they link into docs/).
LINKED = sorted([*DOCS, ROOT / "bench" / "README.md", *(ROOT / "bench" / "results").glob("*.md"),
                 ROOT / "examples" / "README.md"])
#: Where code, tests and their data live: every text file there may cite a docs page.
CITING_DIRS = ("runjournal", "tests", "bench", "examples")
#: The sections code comments cite (``protocol.md § <title>``): the ``##`` headings protocol.md must have.
PROTOCOL_SECTIONS = ["Planes and stores", "Events", "Topic layout", "The side-effect protocol", "Projector",
                     "Recovery job", "Zombies: fence first, then read", "Replay is not resume", "Memory",
                     "Local stack", "One failure policy", "Schema evolution", "After the effect",
                     "Decisions after the first build", "Decisions after the second build"]
COMMANDS_PAGE = ROOT / "docs" / "reference" / "commands.md"

PAGE = re.compile(r"(?<![\w/.-])(docs/[\w./-]+\.md)")
#: Where the ``§ …`` after a page ends for sure (a chain may name several: ``§ Projector, § Zombies``).
CHAIN_END = re.compile(r"[)\n;`\"']")
#: Where a cited section's title may stop and prose begin (``§ Zombies, step 3``, ``§ Events: never guessed``).
TITLE_END = re.compile(r"[.]|,\s|:\s|\s+step\s+\d|\s+—")
#: typer's own options, not the app's.
TYPER_BUILTINS = frozenset({"--install-completion", "--show-completion", "--help"})


def _text_files(directory: Path) -> Iterator[Path]:
    for path in sorted(directory.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.stat().st_size < 2_000_000:
            yield path


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None  # binary (a fixture, an image): cites nothing


def _headings(path: Path) -> list[str]:
    """The page's heading titles, ``##`` and deeper included, outside fenced code."""
    out, fenced = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            out.append(line.lstrip("#").strip())
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in _headings(path):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def _section_matches(title: str, headings: list[str]) -> bool:
    """A cited title names a heading when it is the heading's start (a citation may stop early: ``§ Zombies``) or
    the heading, without a parenthetical, is the title's start (prose may follow it)."""
    for heading in headings:
        base = heading.split(" (")[0]
        if heading.startswith(title) and (len(heading) == len(title) or not heading[len(title)].isalnum()):
            return True
        if title.startswith(base) and (len(title) == len(base) or not title[len(base)].isalnum()):
            return True
    return False


def citations() -> Iterator[tuple[Path, str, str | None]]:
    """(citing file, page, section or None) for every ``docs/….md`` named in CITING_DIRS."""
    for directory in CITING_DIRS:
        for path in _text_files(ROOT / directory):
            text = _read(path)
            if text is None:
                continue
            for m in PAGE.finditer(text):
                chain = CHAIN_END.split(text[m.end():m.end() + 400], maxsplit=1)[0]
                head, *sections = chain.split("§")
                if head.strip() or not sections:  # no § right after the page: a citation of the page alone
                    yield path, m.group(1), None
                    continue
                for section in sections:
                    yield path, m.group(1), re.sub(r"[,\s]+(and)?\s*$", "", section.strip())


def test_the_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_the_protocol_has_every_section_the_code_cites() -> None:
    """docs/design/protocol.md carries the design's sections under exactly these ``##`` titles."""
    text = (ROOT / "docs" / "design" / "protocol.md").read_text()
    titles = [line[3:].strip() for line in text.splitlines() if line.startswith("## ")]
    assert [t for t in PROTOCOL_SECTIONS if t not in titles] == []


def test_every_docs_citation_names_a_page_and_a_section_that_exist() -> None:
    """``docs/design/protocol.md § The side-effect protocol`` in a comment, a docstring, a test or a bench page: the
    file exists, and a ``##``/``###`` heading of it starts with the section's words (case-sensitive; a citation
    may stop early, ``§ Zombies``, and prose may follow the title, ``§ Zombies, step 3``)."""
    bad, seen = [], 0
    for path, page, section in citations():
        seen += 1
        where = f"{path.relative_to(ROOT)}: {page}" + (f" § {section}" if section else "")
        target = ROOT / page
        if not target.is_file():
            bad.append(f"{where} (no such page)")
        elif section is not None and not (_section_matches(section, _headings(target))
                                          or _section_matches(TITLE_END.split(section)[0].strip(), _headings(target))):
            bad.append(f"{where} (no heading starting {section!r})")
    assert bad == []
    assert seen > 50, "the code cites the design document: the citation scan found nothing"


def test_no_code_cites_a_document_outside_the_repository() -> None:
    """``DESIGN.md`` (the brief the design grew from, outside the repository) is cited nowhere under runjournal/,
    bench/ or examples/: the code cites docs/design/protocol.md."""
    bare = re.compile(r"(?<![\w/])DESIGN\.md")
    offenders = [f"{p.relative_to(ROOT)}:{i}" for d in ("runjournal", "bench", "examples")
                 for p in _text_files(ROOT / d) if (text := _read(p)) is not None
                 for i, line in enumerate(text.splitlines(), 1) if bare.search(line)]
    assert offenders == []


@pytest.mark.parametrize("doc", LINKED, ids=[str(d.relative_to(ROOT)) for d in LINKED])
def test_every_relative_link_resolves(doc: Path) -> None:
    """A relative link names a file (or folder) of the repository, and its ``#anchor`` a heading of that page."""
    bad = []
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    for link, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
        if "://" in link or link.startswith("mailto:"):
            continue
        target = (doc.parent / link).resolve() if link else doc
        if not target.exists() or ROOT not in (target, *target.parents):
            bad.append(f"{link} (no such file in the repository)")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            bad.append(f"{link}#{anchor} (no such heading)")
    assert bad == []


@cache
def app_commands() -> dict[str, frozenset[str]]:
    """``runjournal`` command path → its options (``--name`` forms), from the typer app itself."""
    from typer.main import get_command

    from runjournal.cli._app import app

    out: dict[str, frozenset[str]] = {}

    def walk(command: object, path: str) -> None:
        subs = getattr(command, "commands", None)
        if subs is not None:
            if not path or getattr(command, "invoke_without_command", False):  # the root; a group that runs alone
                out[path] = frozenset(o for p in command.params  # type: ignore[attr-defined]
                                      for o in (*p.opts, *p.secondary_opts) if o.startswith("--")) - TYPER_BUILTINS
            for name, sub in subs.items():
                walk(sub, f"{path} {name}".strip())
            return
        out[path] = frozenset(o for p in command.params  # type: ignore[attr-defined]
                              for o in (*p.opts, *p.secondary_opts) if o.startswith("--")) - TYPER_BUILTINS

    walk(get_command(app), "")
    return out


def _command_of(words: list[str]) -> str | None:
    """The command path the words after ``runjournal`` start with (``stack up``, ``projector``), or None."""
    commands = app_commands()
    if len(words) > 1 and f"{words[0]} {words[1]}" in commands:
        return f"{words[0]} {words[1]}"
    return words[0] if words and words[0] in commands and words[0] else None


OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z-]*)")


def _invocations(doc: Path) -> Iterator[tuple[str, str, frozenset[str]]]:
    """(where, command path, options) for every ``runjournal …`` a page shows: inline code, a line of a code block
    (backslash continuations joined), and the option tables of the commands reference (under a heading that
    names the command). Global options (``runjournal --version``) come as the command path ``""``."""
    text = doc.read_text()
    spans = re.findall(r"(?<!`)`([^`\n]+)`(?!`)", re.sub(r"```.*?```", "", text, flags=re.S))
    for block in re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S):
        spans += [re.sub(r"\s#\s.*$", "", line) for line in block.replace("\\\n", " ").splitlines()]
    for part in (p for span in spans for p in re.split(r"\s(?:&&|\|\||;|\|)\s", span)):
        for m in re.finditer(r"(?:^|[\s(/\"'])runjournal((?:\s+\S+)+)", part):
            words = m.group(1).split()
            if words[0].startswith("-"):
                yield str(doc.relative_to(ROOT)), "", frozenset(w for w in words if OPTION.fullmatch(w))
                continue
            path = _command_of(words)
            if path is not None:
                yield str(doc.relative_to(ROOT)), path, frozenset(OPTION.findall(m.group(1)))
    if doc == COMMANDS_PAGE:
        heading = None
        for line in text.splitlines():
            if line.startswith("#"):
                title = line.lstrip("#").strip()
                heading = title if title in app_commands() else None
            elif heading and line.startswith("| `--"):
                yield str(doc.relative_to(ROOT)), heading, frozenset(OPTION.findall(line.split("|")[1]))


def documented_commands() -> dict[tuple[str, str | None], str]:
    """(command path, option or None for the command itself) → the first page that names it, for every command
    and option README.md and docs/**/*.md name."""
    out: dict[tuple[str, str | None], str] = {}
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for where, path, options in _invocations(doc):
            if path:
                out.setdefault((path, None), where)
            for option in options:
                out.setdefault((path, option), where)
    return out


def test_every_command_and_option_the_docs_name_exists() -> None:
    """Each ``runjournal …`` the docs show (inline, in a code block, in a reference table) names a real command,
    and each ``--option`` after it one that command takes (the slow test tests/cli/test_paths.py runs them)."""
    commands = app_commands()
    bad = []
    for doc in DOCS:
        for where, path, options in _invocations(doc):
            bad += [f"{where}: runjournal {path} {option}" for option in sorted(options)
                    if option not in commands[path] | commands[""] | TYPER_BUILTINS]
    assert bad == []


def test_the_commands_reference_names_every_command_and_option() -> None:
    """docs/reference/commands.md has a heading per command and, under it, a row per option: a new option is
    documented where the README promises "every option"."""
    named: dict[str, set[str]] = {}
    for _, path, options in _invocations(COMMANDS_PAGE):
        named.setdefault(path, set()).update(options)
    headings = set(_headings(COMMANDS_PAGE))
    missing = [f"{path} (no heading)" for path in app_commands() if path and path not in headings]
    missing += [f"{path} {option}" for path, options in app_commands().items() for option in sorted(options)
                if option not in named.get(path, set())]
    assert missing == []

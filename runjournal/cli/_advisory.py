"""Output shared by the ``memory`` and ``knowledge`` command groups: a named error exits non-zero with its message —
as JSON on stderr under ``--json``, as text otherwise; ``stats`` for people is one ``name: value`` line each, never a
Python repr."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, TypeVar

import typer
from rich.console import Console

from runjournal.core.errors import RunjournalError

__all__ = ["fail", "guarded", "human_lines"]

T = TypeVar("T")
console = Console(stderr=True)


def fail(exc: BaseException, *, as_json: bool, code: int = 1) -> NoReturn:
    """Print ``exc`` (JSON ``{"error", "message"}`` on stderr under ``--json``) and exit with ``code``."""
    if as_json:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), file=sys.stderr)
    else:
        console.print(f"[red]error:[/] {exc}", markup=True, highlight=False)
    raise typer.Exit(code=code) from exc


def guarded(fn: Callable[[], T], *, as_json: bool) -> T:
    """Call ``fn``; a :class:`RunjournalError` exits 1 (``ValueError``-kind contract errors exit 2)."""
    try:
        return fn()
    except RunjournalError as exc:
        fail(exc, as_json=as_json, code=2 if isinstance(exc, ValueError) else 1)


def human_lines(out: Mapping[str, Any], *, units: Mapping[str, str] | None = None) -> str:
    """``out`` for people: ``name: value`` per line; a mapping as its entries indented under ``name:`` (``name: none``
    when empty), each count followed by ``units[name]`` when given; a list or tuple comma-separated (issue 35: a
    dict was printed as its Python repr).

    Args:
        out: a JSON-able mapping (the command's ``--json`` document).
        units: name → what the counts of that mapping are (``{"corpora": "passages"}``).

    Returns:
        The lines, joined with newlines (no trailing newline).
    """
    lines: list[str] = []
    for name, value in out.items():
        if isinstance(value, Mapping):
            if not value:
                lines.append(f"{name}: none")
                continue
            unit = (units or {}).get(name)
            lines.append(f"{name}:")
            lines += [f"  {key}: {_plain(item)}{f' {unit}' if unit else ''}" for key, item in value.items()]
        else:
            lines.append(f"{name}: {_plain(value)}")
    return "\n".join(lines)


def _plain(value: Any) -> str:
    """One value as text: a list comma-separated, a nested mapping as ``k=v`` pairs, None as ``-``."""
    if value is None:
        return "-"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={_plain(v)}" for k, v in value.items()) or "none"
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(_plain(v) for v in value) or "none"
    return str(value)

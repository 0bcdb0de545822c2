"""Error output shared by the ``memory`` and ``knowledge`` command groups: a named error exits non-zero with
its message — as JSON on stderr under ``--json``, as text otherwise."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

import typer
from rich.console import Console

from runjournal.core.errors import RunjournalError

__all__ = ["fail", "guarded"]

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

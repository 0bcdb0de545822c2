"""``schemas`` commands (mounted as ``runjournal schemas …``): the compatibility gate for CI.

Run standalone: ``python -m typer runjournal.cli.schemas run check [--json] [--candidate PATH]``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from runjournal.schemas.compat import POLICY, Problem, check_all
from runjournal.schemas.versions import load_versions

__all__ = ["app"]

app = typer.Typer(help="Avro event schemas: versions, compatibility gate.", no_args_is_help=True)


@app.callback()
def _schemas() -> None:
    """Avro event schemas: versions and the compatibility gate."""


@app.command()
def check(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON report instead of a table.")] = False,
    candidate: Annotated[
        list[Path] | None,
        typer.Option(
            "--candidate", exists=True, dir_okay=False, help="Extra .avsc checked as the next version."
        ),
    ] = None,
    samples: Annotated[int, typer.Option(min=1, help="Generated records per payload branch per pair.")] = 20,
) -> None:
    """Check every published envelope version (and candidates) under the compatibility policy.

    Exits 0 when the gate passes, 1 when any problem is found.
    """
    candidates = list(candidate or [])
    problems = check_all(candidates=candidates, samples=samples)
    versions = [v.label for v in load_versions()] + [f"candidate:{p.name}" for p in candidates]
    if as_json:
        report = {
            "policy": POLICY,
            "versions": versions,
            "ok": not problems,
            "problems": [_as_dict(p) for p in problems],
        }
        typer.echo(json.dumps(report, indent=2))
    else:
        _print_table(problems, versions)
    if problems:
        raise typer.Exit(code=1)


def _as_dict(problem: Problem) -> dict[str, str]:
    return {
        "writer": problem.writer,
        "reader": problem.reader,
        "field": problem.field,
        "message": problem.message,
    }


def _print_table(problems: list[Problem], versions: list[str]) -> None:
    console = Console()
    console.print(f"policy [bold]{POLICY}[/] over {', '.join(versions)}")
    if not problems:
        console.print("[green]ok[/]: every reader resolves every older writer; unions and enums are safe")
        return
    table = Table(title=f"{len(problems)} problem(s)", show_lines=True)
    for column in ("writer", "reader", "field", "problem"):
        table.add_column(column, overflow="fold")
    for p in problems:
        table.add_row(p.writer, p.reader, p.field, p.message)
    console.print(table)

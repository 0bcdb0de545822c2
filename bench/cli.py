"""``python -m bench [--quick] [--json] [--only PAIR …]`` — light to import: heavy modules load in the command.

Runs from a checkout only: the bench is not part of the installed package (``make bench`` runs it).
"""

from __future__ import annotations

from typing import Annotated

import typer

from bench._model import PAIRS

__all__ = ["app", "bench_command"]

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)


@app.command()
def bench_command(
    quick: Annotated[bool, typer.Option("--quick", help="Smaller sizes and fewer rounds (about 3 minutes).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
    only: Annotated[list[str] | None, typer.Option("--only", help=f"Run only these pairs: {', '.join(PAIRS)}.")] = None,
    rounds: Annotated[int | None, typer.Option(help="Measured rounds per pair (default 5, --quick 2).")] = None,
) -> None:
    """Benchmarks, each figure next to an anchor measured in the same run (bench/README.md).

    Uses the running local stack (``runjournal stack up``) or starts a private one; every pair gets its own uuid
    topic prefix, deleted at the end with its Redis keys. Exit code 0 even when a goal is not met (the table says
    so); non-zero only when the bench itself failed.
    """
    from bench.report import as_json as to_json
    from bench.report import print_table
    from bench.runner import run_bench

    unknown = sorted(set(only or ()) - set(PAIRS))
    if unknown:
        raise typer.BadParameter(f"unknown pair(s) {unknown}; known: {', '.join(PAIRS)}", param_hint="--only")
    rows, header = run_bench(quick=quick, only=tuple(only or PAIRS), rounds=rounds)
    if as_json:
        print(to_json(rows, header))
    else:
        print_table(rows, header)
    if header.get("failed"):
        raise typer.Exit(code=1)

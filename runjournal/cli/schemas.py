"""``schemas`` commands (mounted as ``runjournal schemas …``): the compatibility gate and the publish tool.

``check`` is the gate CI runs (``--registry`` also asks the registry for its verdict on candidates);
``publish`` freezes new ``.avsc`` files in the ledger and registers the versions in the registry.
Run standalone: ``python -m typer runjournal.cli.schemas run check [--json] [--candidate PATH]``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from runjournal.cli._tables import folding_table

if TYPE_CHECKING:
    from runjournal.schemas.compat import Problem

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
    registry: Annotated[bool, typer.Option(
        "--registry", help="Also ask the schema registry (RUNJOURNAL_SCHEMA_REGISTRY_URL) about each candidate."),
    ] = False,
) -> None:
    """Check every published envelope version (and candidates) under the compatibility policy.

    Exits 0 when the gate passes, 1 when any problem is found (or the registry refuses a candidate).
    """
    from runjournal.schemas.compat import POLICY, check_all
    from runjournal.schemas.versions import load_versions

    candidates = list(candidate or [])
    problems = check_all(candidates=candidates, samples=samples)
    if registry:
        problems += _registry_problems(candidates)
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


def _registry_problems(candidates: list[Path]) -> list[Problem]:
    """A Problem per candidate the registry's own check refuses (subject ``{prefix}.events-value``)."""
    from runjournal.core.settings import Settings
    from runjournal.schemas.compat import POLICY, Problem
    from runjournal.schemas.errors import SchemaError
    from runjournal.schemas.registration import registry_accepts
    from runjournal.schemas.versions import load_version

    settings = Settings.load()
    if not settings.schema_registry_url:
        return [Problem("-", "registry", "-",
                        "--registry needs RUNJOURNAL_SCHEMA_REGISTRY_URL (or `runjournal stack up --registry`)")]
    subject = f"{settings.events_topic}-value"
    out = []
    for path in candidates:
        try:
            verdict = registry_accepts(settings.schema_registry_url, subject, load_version(path, 0))
        except SchemaError as exc:
            out.append(Problem(f"candidate:{path.name}", f"registry:{subject}", "-", str(exc)))
            continue
        if verdict is False:
            out.append(Problem(f"candidate:{path.name}", f"registry:{subject}", "-",
                               f"the registry's {POLICY} check refuses it as the next version"))
    return out


@app.command()
def publish(
    registry_url: Annotated[str | None, typer.Option(
        "--registry", help="Registry base URL (default RUNJOURNAL_SCHEMA_REGISTRY_URL; none: ledger only).")] = None,
    subject: Annotated[str | None, typer.Option(help="Registry subject (default {prefix}.events-value).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON report.")] = False,
) -> None:
    """Freeze new .avsc files in the ledger; register every version from v2 in the registry at FULL_TRANSITIVE.

    The only writer of registry versions (producers look ids up, never register).
    Exit 1 when the ledger or the registry refuses.
    """
    from runjournal.core.settings import Settings
    from runjournal.schemas.compat import POLICY
    from runjournal.schemas.errors import SchemaError
    from runjournal.schemas.published import publish as publish_ledger
    from runjournal.schemas.registration import register_versions

    settings = Settings.load()
    url = registry_url or settings.schema_registry_url
    subject = subject or f"{settings.events_topic}-value"
    report: dict[str, object] = {"policy": POLICY, "registry": url, "subject": subject if url else None}
    try:
        report["published"] = publish_ledger()
        rows = register_versions(url, subject) if url else []
    except SchemaError as exc:
        _fail(exc, as_json)
    report["registered"] = [r.as_dict() for r in rows]
    report["ok"] = not any(r.action == "refused" for r in rows)
    if as_json:
        typer.echo(json.dumps(report))
    else:
        console = Console()
        for rel in report["published"]:  # type: ignore[attr-defined]
            console.print(f"published {rel}")
        for r in rows:
            console.print(f"{subject}: {r.version} {r.action} (id {r.schema_id}) {r.detail}".rstrip())
        if not report["published"] and not rows:  # it did nothing: say so, and what would do something
            console.print("nothing new: every .avsc is in the ledger (published.sha256); no registry given "
                          "(--registry URL or RUNJOURNAL_SCHEMA_REGISTRY_URL registers the versions)")
        elif not report["published"]:
            console.print("ledger: nothing new (every .avsc is in published.sha256)")
    if not report["ok"]:
        raise typer.Exit(code=1)


def _fail(exc: Exception, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps({"ok": False, "error": type(exc).__name__, "message": str(exc)}), err=True)
    else:
        Console(stderr=True).print(f"[bold red]error:[/] {exc}")
    raise typer.Exit(code=1)


def _as_dict(problem: Problem) -> dict[str, str]:
    return {
        "writer": problem.writer,
        "reader": problem.reader,
        "field": problem.field,
        "message": problem.message,
    }


def _print_table(problems: list[Problem], versions: list[str]) -> None:
    from runjournal.schemas.compat import POLICY

    console = Console()
    console.print(f"policy [bold]{POLICY}[/] over {', '.join(versions)}")
    if not problems:
        console.print("[green]ok[/]: every reader resolves every older writer, and every reader from v2 every "
                      "newer one; unions and enums are safe")
        return
    table = folding_table(title=f"{len(problems)} problem(s)", show_lines=True)
    for column in ("writer", "reader", "field", "problem"):
        table.add_column(column, overflow="fold")
    for p in problems:
        table.add_row(p.writer, p.reader, p.field, p.message)
    console.print(table)

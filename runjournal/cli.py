"""The ``runjournal`` command line (typer). Each package contributes its own sub-app."""

from __future__ import annotations

import json

import typer

from bench.cli import bench_command
from consumers.approvals_cli import approve_command, deny_command
from consumers.erase_cli import erase_command
from consumers.memory.cli import memory_app, memory_extractor_command
from consumers.projector.cli import inspect_command, projector_command
from consumers.recovery.cli import recover_command
from consumers.replay_cli import replay_command
from deploy.cli import stack_app, topics_app
from runjournal.demo.cli import demo_command
from runjournal.errors import ConfigError
from runjournal.settings import Settings
from schemas.cli import app as schemas_app

__all__ = ["app", "main"]

app = typer.Typer(
    name="runjournal",
    help="Durable execution journal for AI agent runs, on Apache Kafka.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
app.add_typer(stack_app, name="stack")
app.add_typer(topics_app, name="topics")
app.add_typer(schemas_app, name="schemas")
app.add_typer(memory_app, name="memory")
app.command("projector")(projector_command)
app.command("inspect")(inspect_command)
app.command("memory-extractor")(memory_extractor_command)
app.command("recover")(recover_command)
app.command("replay")(replay_command)
app.command("approve")(approve_command)
app.command("deny")(deny_command)
app.command("erase")(erase_command)
app.command("demo")(demo_command)
app.command("bench")(bench_command)


@app.command("settings")
def show_settings() -> None:
    """Print the effective settings as JSON (secrets masked)."""
    print(json.dumps(Settings.load().masked(), indent=2))


def main() -> None:
    """Console-script entry point: runs the typer app; a ConfigError exits 2 with its message."""
    try:
        app()
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from exc

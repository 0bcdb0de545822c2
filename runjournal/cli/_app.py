"""The typer app behind ``runjournal``: the root options and every command group."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from runjournal import __version__
from runjournal.cli.acls import acls_app
from runjournal.cli.approvals import approve_command, deny_command
from runjournal.cli.console import console_command
from runjournal.cli.demo import demo_command
from runjournal.cli.erase import erase_command
from runjournal.cli.knowledge import knowledge_app
from runjournal.cli.memory import memory_app, memory_extractor_command
from runjournal.cli.projector import inspect_command, projector_command
from runjournal.cli.recovery import recover_command
from runjournal.cli.replay import replay_command
from runjournal.cli.schemas import app as schemas_app
from runjournal.cli.stack import stack_app, topics_app
from runjournal.core import logs
from runjournal.core.errors import ConfigError
from runjournal.core.settings import Settings

__all__ = ["app", "run"]

app = typer.Typer(
    name="runjournal",
    help="Durable execution journal for AI agent runs, on Apache Kafka.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


def _print_version(value: bool) -> None:
    if value:
        print(f"runjournal {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    log_level: Annotated[str | None, typer.Option(
        "--log-level", envvar="RUNJOURNAL_LOG_LEVEL", case_sensitive=False,
        help=f"Log level of every command ({', '.join(logs.LEVELS)}); logs are JSON lines on stderr. "
             "Default: INFO for services, WARNING otherwise.")] = None,
) -> None:
    """Durable execution journal for AI agent runs, on Apache Kafka."""
    try:
        logs.set_level_override(log_level)
    except ValueError as exc:
        raise typer.BadParameter(f"{exc} (from --log-level or RUNJOURNAL_LOG_LEVEL)",
                                 param_hint="--log-level") from exc
    logs.setup_logging("WARNING")


app.add_typer(stack_app, name="stack")
app.add_typer(topics_app, name="topics")
app.add_typer(schemas_app, name="schemas")
app.add_typer(memory_app, name="memory")
app.add_typer(knowledge_app, name="knowledge")
app.add_typer(acls_app, name="acls")
app.command("projector")(projector_command)
app.command("inspect")(inspect_command)
app.command("memory-extractor")(memory_extractor_command)
app.command("recover")(recover_command)
app.command("replay")(replay_command)
app.command("approve")(approve_command)
app.command("deny")(deny_command)
app.command("erase")(erase_command)
app.command("demo")(demo_command)
app.command("console")(console_command)


@app.command("settings")
def show_settings() -> None:
    """Print the effective settings as JSON (secrets masked)."""
    print(json.dumps(Settings.load().masked(), indent=2))


def run() -> None:
    """Run the typer app; a ConfigError exits 2 with its message."""
    try:
        app()
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from exc

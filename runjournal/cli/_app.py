"""The typer app behind ``runjournal``: the root options and every command group."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from runjournal.cli.acls import acls_app
from runjournal.cli.approvals import approve_command, deny_command, settle_command
from runjournal.cli.archive import archiver_command, query_command
from runjournal.cli.console import console_command
from runjournal.cli.control import cancel_command, fork_command, pause_command, resume_command, signal_command
from runjournal.cli.demo import demo_command
from runjournal.cli.erase import erase_command
from runjournal.cli.knowledge import knowledge_app
from runjournal.cli.memory import memory_app, memory_extractor_command
from runjournal.cli.projector import inspect_command, projector_command
from runjournal.cli.recovery import recover_command
from runjournal.cli.replay import replay_command
from runjournal.cli.schemas import app as schemas_app
from runjournal.cli.spend import spend_app
from runjournal.cli.stack import stack_app, topics_app
from runjournal.cli.stream import stream_command
from runjournal.core import logs
from runjournal.core.errors import ConfigError

__all__ = ["app", "run"]

app = typer.Typer(
    name="runjournal",
    help="Durable execution journal for AI agent runs, on Apache Kafka.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


def _print_version(value: bool) -> None:
    if value:
        from runjournal import __version__

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
app.add_typer(spend_app, name="spend")
app.command("projector")(projector_command)
app.command("archiver")(archiver_command)
app.command("query")(query_command)
app.command("inspect")(inspect_command)
app.command("memory-extractor")(memory_extractor_command)
app.command("recover")(recover_command)
app.command("replay")(replay_command)
app.command("stream")(stream_command)
app.command("approve")(approve_command)
app.command("deny")(deny_command)
app.command("settle")(settle_command)
app.command("cancel")(cancel_command)
app.command("pause")(pause_command)
app.command("resume")(resume_command)
app.command("fork")(fork_command)
app.command("signal")(signal_command)
app.command("erase")(erase_command)
app.command("demo")(demo_command)
app.command("console")(console_command)


@app.command("settings")
def show_settings() -> None:
    """Print the effective settings as JSON (secrets masked)."""
    from runjournal.core.settings import Settings

    print(json.dumps(Settings.load().masked(), indent=2))


def run() -> None:
    """Run the typer app. A ConfigError (how every command's ``Settings.load()`` fails) exits 2 with its message.

    Under ``--json`` (anywhere before a ``--``) every failure is one JSON document on stderr,
    ``{"error": <class>, "message": <text>}``, and stdout holds only a result: settings errors, usage errors
    (a bad option value: click's ``BadParameter`` …, exit 2) and any error no command named (exit 1) alike.
    """
    argv = sys.argv[1:]
    as_json = "--json" in (argv[:argv.index("--")] if "--" in argv else argv)
    if as_json:
        raise SystemExit(_run_json())
    try:
        app()
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from exc


def _run_json() -> int:
    """``app()`` with click's own error printing off (it prints usage text): each failure printed as JSON."""
    try:
        code = app(standalone_mode=False)
    except ConfigError as exc:
        return _json_error(type(exc).__name__, str(exc), 2)
    except typer.Abort:
        return _json_error("Aborted", "aborted", 1)
    except typer.TyperException as exc:  # click's usage errors (BadParameter, NoSuchOption …), as typer raises them
        return _json_error(type(exc).__name__, _usage_message(exc), int(getattr(exc, "exit_code", 2)))
    except Exception as exc:  # a failure no command turned into a named error: still JSON, with its class
        return _json_error(type(exc).__name__, str(exc), 1)
    return code if isinstance(code, int) else 0


def _usage_message(exc: Exception) -> str:
    """A usage error's message with the option it is about (``Invalid value for '--watch': …``)."""
    message = str(exc.format_message()) if hasattr(exc, "format_message") else str(exc)
    param = getattr(exc, "param", None)
    hint = getattr(exc, "param_hint", None) or (getattr(param, "opts", None) or [None])[0]
    if hint and "Invalid value" not in message:
        hints = hint if isinstance(hint, str) else " / ".join(hint)
        message = f"Invalid value for {hints}: {message}"
    return message


def _json_error(kind: str, message: str, code: int) -> int:
    print(json.dumps({"error": kind, "message": message}), file=sys.stderr)
    return code

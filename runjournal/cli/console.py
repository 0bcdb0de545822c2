"""``runjournal console``: serve the web console (``runjournal.console``) until SIGINT/SIGTERM."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Annotated

import typer

from runjournal.cli._values import PORT
from runjournal.core.errors import bind_error

if TYPE_CHECKING:
    import socket

__all__ = ["console_command"]


def console_command(
    port: Annotated[int, typer.Option("--port", **PORT, help="TCP port of the console (and its /metrics).")] = 8780,
    host: Annotated[str, typer.Option("--host", help="Bind address (default loopback: put a proxy with TLS in "
                                                     "front before exposing it).")] = "127.0.0.1",
    scrape: Annotated[list[str] | None, typer.Option(
        "--scrape", help="A service's /metrics URL to read lag from, besides those announced in Redis "
                         "(repeatable).")] = None,
    per_page: Annotated[int, typer.Option(min=1, max=1000, help="Rows per page of the runs list.")] = 100,
) -> None:
    """Serve the web console over the projection, the topic and memory.

    Approve, deny, cancel, pause and resume are possible only when RUNJOURNAL_CONSOLE_OPERATOR_TOKEN is set (then
    only for an operator who signs in with it, or sends it as a bearer token); without it the console is read-only.
    Exits 1 naming the fix when the stack or the prefix's events topic is missing; once serving, a page answers 503
    naming the cause while Redis or the broker is away.
    """
    import uvicorn

    from runjournal.cli._errors import cli_errors
    from runjournal.console import ConsoleConfig, build_app
    from runjournal.consumers.runtime.topic_identity import preflight
    from runjournal.core.logs import setup_logging
    from runjournal.core.settings import Settings

    setup_logging("INFO")
    settings = Settings.load()
    with cli_errors(as_json=False):  # a missing stack or topic: named within 5 s
        preflight(settings)
    token = settings.console_operator_token.get_secret_value() if settings.console_operator_token else None
    app = build_app(ConsoleConfig(settings=settings, operator_token=token, scrape_urls=tuple(scrape or ()),
                                  per_page=per_page))
    mode = "operator token set: approve/deny/cancel/pause/resume enabled" if token else "read-only (no operator token)"
    with cli_errors(as_json=False):  # the port taken: one line naming it and the fix, exit 1
        sock = _bind(host, port)
    typer.echo(f"runjournal console on http://{host}:{port}/runs (prefix {settings.topic_prefix}; {mode})", err=True)
    # uvicorn serves the bound socket and stops on SIGINT and SIGTERM alike, then raises the signal again once it
    # has shut down: ours takes it, so a stop asked for is a clean exit 0 (as every service; docs/operations/console.md)
    previous = {sig: signal.signal(sig, _stopped) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])
    except _Stopped:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _Stopped(Exception):
    """SIGINT or SIGTERM after uvicorn's graceful shutdown."""


def _stopped(_signum: int, _frame: object) -> None:
    raise _Stopped


def _bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``.

    Raises:
        PortInUseError: the port is taken or not allowed (names ``--port`` and the fix).
    """
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise bind_error(exc, port, host, "--port") from exc
    return sock

"""How every command reports a failure: one line on stderr (JSON under ``--json``) and a non-zero exit.

Under ``--json`` stdout carries only the result; an error is ``{"error": <class>, "message": <text>}`` on
stderr. The message of a runjournal error names the fix (``runjournal stack up``, ``runjournal topics
create``, ``runjournal projector --rebuild`` …).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import typer

from runjournal.core.errors import RunjournalError

__all__ = ["cli_errors", "fail", "printable"]


def printable(text: object) -> str:
    """``text`` for a terminal: control characters (a newline, ESC of a colour sequence, C1 codes) as Python escapes
    (``\\n``, ``\\x1b``) — ids are any text (``runjournal.core.ids``), so an error naming one stays one line and
    cannot drive the terminal. Everything else, unicode included, unchanged."""
    out = str(text)
    if not any(ord(c) < 32 or 127 <= ord(c) < 160 for c in out):
        return out
    return "".join(c.encode("unicode_escape").decode("ascii") if ord(c) < 32 or 127 <= ord(c) < 160 else c
                   for c in out)


def fail(error: BaseException | str, *, as_json: bool, code: int = 1, kind: str | None = None) -> typer.Exit:
    """Print ``error`` to stderr (JSON under ``as_json``) and return the ``typer.Exit`` to raise."""
    name = kind or (type(error).__name__ if isinstance(error, BaseException) else "Error")
    if as_json:
        print(json.dumps({"error": name, "message": str(error)}), file=sys.stderr)
    else:
        print(f"error: {printable(error)}", file=sys.stderr)
    return typer.Exit(code=code)


@contextmanager
def cli_errors(as_json: bool) -> Iterator[None]:
    """Turn runjournal, Kafka and Redis errors raised inside the block into :func:`fail` (exit 1) — a Redis
    Cluster client's own errors too (``SlotNotCoveredError`` …: not ``RedisError`` subclasses); any other
    exception passes through unchanged."""
    try:
        yield
    except Exception as exc:
        if not isinstance(exc, _client_errors()):
            raise
        raise fail(exc, as_json=as_json) from exc


def _client_errors() -> tuple[type[Exception], ...]:
    """The error classes :func:`cli_errors` reports, the Kafka and Redis ones imported only when an error is
    raised (``runjournal --help`` never loads either client)."""
    from confluent_kafka import KafkaException
    from redis import RedisError
    from redis.exceptions import RedisClusterException

    return (RunjournalError, KafkaException, RedisError, RedisClusterException)

"""Bounds of the command line's numeric options, checked by click before a command runs (a bad value is a usage
error, exit 2, naming the option — JSON under ``--json``): counts at least 1, intervals and timeouts above 0 s,
ports 1-65535. tests/cli/test_values.py checks that every int and float option of every command has one.
"""

from __future__ import annotations

import typer

__all__ = ["PORT", "positive_seconds"]

PORT = {"min": 1, "max": 65535}
"""``typer.Option(**PORT)``: a TCP port."""


def positive_seconds(value: float | None) -> float | None:
    """A click callback: an interval or timeout in seconds must be > 0 (0 or less would spin or never wait).

    Raises:
        typer.BadParameter: ``value`` is not > 0.
    """
    if value is not None and not value > 0:
        raise typer.BadParameter(f"must be > 0 seconds, got {value}")
    return value

"""The base error of every runjournal package; each package subclasses it by failure kind."""

from __future__ import annotations

__all__ = ["ConfigError", "RunjournalError"]


class RunjournalError(Exception):
    """Base of all errors raised by runjournal code (third-party errors are chained as ``__cause__``)."""


class ConfigError(RunjournalError):
    """A setting is missing or invalid; the message names the ``RUNJOURNAL_*`` variable."""

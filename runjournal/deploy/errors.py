"""Errors of the local stack launcher and topic setup."""

from __future__ import annotations

from runjournal.core.errors import RunjournalError

__all__ = ["MissingToolError", "StackError", "TopicConfigError"]


class StackError(RunjournalError):
    """A stack component could not be installed, started, stopped or reached."""


class MissingToolError(StackError):
    """A required executable (java, mvn, redis-server) is not installed; the message names the package."""


class TopicConfigError(RunjournalError):
    """A topic exists with settings runjournal cannot work with (partition count, cleanup policy)."""

"""Recovery job: fence, read end offsets, fold the tail, classify tool calls, resume under a new epoch.

Never imports ``runjournal.consumers.memory`` (import-linter contract in pyproject.toml): execution facts
come from the journal only.
"""

from runjournal.consumers.recovery.continuation import RunNotContinuableError, continue_run

__all__ = ["RunNotContinuableError", "continue_run"]

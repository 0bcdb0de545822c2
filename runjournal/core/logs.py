"""Structured logs: one JSON object per line on stderr, with the ``extra={...}`` fields of each call.

The level: ``runjournal --log-level LEVEL`` (or ``RUNJOURNAL_LOG_LEVEL``) wins over each command's
default (INFO for the long-running services, WARNING for one-shot commands). librdkafka's own lines
arrive through the ``runjournal.kafka`` logger (``runjournal.core.kafka``), so they are JSON lines too.
"""

from __future__ import annotations

import json
import logging
import sys
import time

__all__ = ["LEVELS", "JsonFormatter", "set_level_override", "setup_logging"]

#: Level names accepted by ``--log-level`` / ``RUNJOURNAL_LOG_LEVEL``.
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

_STD = set(vars(logging.LogRecord("x", 0, "", 0, "", None, None))) | {"message", "asctime"}
_override: str | None = None


class JsonFormatter(logging.Formatter):
    """Formats a record as ``{"ts_ms", "level", "logger", "msg", **extra}``."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts_ms": int(record.created * 1000), "level": record.levelname, "logger": record.name,
               "msg": record.getMessage()}
        out.update({k: v for k, v in vars(record).items() if k not in _STD})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def set_level_override(level: str | None) -> None:
    """Set the level every later :func:`setup_logging` uses instead of its default (None clears it).

    Raises:
        ValueError: ``level`` is not one of :data:`LEVELS` (case-insensitive).
    """
    global _override
    if level is not None and level.upper() not in LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    _override = level.upper() if level else None


def setup_logging(default: str = "WARNING") -> str:
    """Send every ``runjournal.*`` logger (librdkafka's included) to stderr as JSON lines.

    Args:
        default: the level when neither ``--log-level`` nor ``RUNJOURNAL_LOG_LEVEL`` set one.

    Returns:
        The level applied.
    """
    level = _override or default.upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    log = logging.getLogger("runjournal")
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False
    logging.Formatter.converter = time.gmtime
    return level

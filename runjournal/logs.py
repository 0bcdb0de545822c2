"""Structured logs: one JSON object per line on stderr, with the ``extra={...}`` fields of each call."""

from __future__ import annotations

import json
import logging
import sys
import time

__all__ = ["setup_logging"]

_STD = set(vars(logging.LogRecord("x", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """Formats a record as ``{"ts_ms", "level", "logger", "msg", **extra}``."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts_ms": int(record.created * 1000), "level": record.levelname, "logger": record.name,
               "msg": record.getMessage()}
        out.update({k: v for k, v in vars(record).items() if k not in _STD})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str = "INFO") -> None:
    """Send ``runjournal``, ``consumers``, ``producers`` and ``deploy`` logs to stderr as JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name in ("runjournal", "consumers", "producers", "deploy", "schemas"):
        log = logging.getLogger(name)
        log.handlers[:] = [handler]
        log.setLevel(level)
        log.propagate = False
    logging.Formatter.converter = time.gmtime

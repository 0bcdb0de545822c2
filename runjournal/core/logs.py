"""Structured logs: one JSON object per line on stderr, with the ``extra={...}`` fields of each call.

The level: ``runjournal --log-level LEVEL`` (or ``RUNJOURNAL_LOG_LEVEL``) wins over each command's
default (INFO for the long-running services, WARNING for one-shot commands). librdkafka's own lines
arrive through the ``runjournal.kafka`` logger (``runjournal.core.kafka``), so they are JSON lines too.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from collections import OrderedDict

__all__ = ["LEVELS", "JsonFormatter", "RepeatFilter", "set_level_override", "setup_logging"]

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


class RepeatFilter(logging.Filter):
    """Collapses a logger's repeated lines: the first of a kind passes, the same line again within ``window_s``
    seconds is counted and dropped, and the first one after the window passes with ``repeated`` (the count
    dropped) and ``repeated_over_s`` added — so a broker that stays away gives one line a minute, not one per
    reconnect (librdkafka's ``FAIL`` / ``ERROR`` lines on ``runjournal.kafka``; issue 35).

    Lines are the same kind when they differ only in librdkafka's counters and client names (``after 12ms``,
    ``, 5 identical error(s) suppressed``, ``rdkafka#producer-7``); a different broker, state or error is another
    kind. Thread-safe (librdkafka's lines arrive from the clients' threads). At most ``max_kinds`` kinds are
    remembered, the least recently seen forgotten first. A storm that ends within the window reports no count.

    Args:
        window_s: seconds a kind stays collapsed after it passed (> 0).
        max_kinds: kinds remembered at most.
    """

    _COUNTERS = re.compile(r",? ?\d+ identical error\(s\) suppressed|(?<=rdkafka#)([a-z]+)-\d+|\d+ms")

    def __init__(self, window_s: float = 60.0, max_kinds: int = 256) -> None:
        super().__init__()
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, not {window_s}")
        self.window_s = window_s
        self.max_kinds = max_kinds
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[int, str], list[float]] = OrderedDict()  # kind -> [passed at, dropped since]

    @classmethod
    def kind_of(cls, message: str) -> str:
        """``message`` without the parts that differ between repeats of one line."""
        return cls._COUNTERS.sub(lambda m: f"{m.group(1)}-#" if m.group(1) else ("#ms" if "ms" in m.group(0) else ""),
                                 message)

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.levelno, self.kind_of(record.getMessage()))
        now = time.monotonic()
        with self._lock:
            entry = self._seen.get(kind)
            if entry is not None:
                self._seen.move_to_end(kind)
                if now - entry[0] < self.window_s:
                    entry[1] += 1
                    return False
                if entry[1]:
                    record.repeated = int(entry[1])
                    record.repeated_over_s = round(now - entry[0], 1)
            elif len(self._seen) >= self.max_kinds:
                self._seen.popitem(last=False)
            self._seen[kind] = [now, 0]
        return True


def set_level_override(level: str | None) -> None:
    """Set the level every later :func:`setup_logging` uses instead of its default (None clears it).

    Raises:
        ValueError: ``level`` is not one of :data:`LEVELS` (case-insensitive).
    """
    global _override
    if level is not None and level.upper() not in LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    _override = level.upper() if level else None


def setup_logging(default: str = "WARNING", *, level: str | None = None) -> str:
    """Send every ``runjournal.*`` logger (librdkafka's included) to stderr as JSON lines.

    A program that embeds the journal and configures logging itself does not call this: librdkafka's lines reach
    its handlers through the ``runjournal.kafka`` logger (``runjournal.core.kafka``) like any other record.

    Args:
        default: the level when neither ``--log-level`` nor ``RUNJOURNAL_LOG_LEVEL`` set one.
        level: ``RUNJOURNAL_LOG_LEVEL`` as a process started without the command line reads it
            (``Settings.log_level``: the demo's agents and recovery service); ``--log-level`` wins over it.

    Returns:
        The level applied.

    Raises:
        ValueError: ``level`` is not one of :data:`LEVELS`.
    """
    if level is not None and level.upper() not in LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    level = _override or (level.upper() if level else None) or default.upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    log = logging.getLogger("runjournal")
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False
    logging.Formatter.converter = time.gmtime
    return level

"""Optional W3C trace context (``traceparent``) for journal events, without an OpenTelemetry dependency.

A run handle stamps each event with a traceparent — the one given explicitly to
``Journal.start_run`` / ``Journal.resume``, else the one active in :data:`current_traceparent`
when the event is emitted — into the envelope's ``traceparent`` field and a Kafka header of
the same name. A tracing integration sets the context variable (``with use_traceparent(tp):``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["current_traceparent", "use_traceparent", "valid_traceparent"]

#: The traceparent active in this context, or None.
current_traceparent: ContextVar[str | None] = ContextVar("runjournal_traceparent", default=None)

_TRACEPARENT = re.compile(r"[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def valid_traceparent(value: str) -> bool:
    """True when ``value`` is a W3C ``traceparent`` (``vv-<32 hex trace>-<16 hex span>-ff``, ids non-zero)."""
    return bool(_TRACEPARENT.fullmatch(value)) and not value.startswith("ff")


def check_traceparent(value: str | None) -> str | None:
    """``value`` unchanged when None or valid; raises ValueError otherwise."""
    if value is not None and not valid_traceparent(value):
        raise ValueError(f"not a W3C traceparent: {value!r}")
    return value


@contextmanager
def use_traceparent(value: str | None) -> Iterator[None]:
    """Make ``value`` the active traceparent inside the block. Raises ValueError when malformed."""
    token = current_traceparent.set(check_traceparent(value))
    try:
        yield
    finally:
        current_traceparent.reset(token)

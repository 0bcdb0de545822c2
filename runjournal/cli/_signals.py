"""How every long-running command stops: SIGINT (Ctrl-C) and SIGTERM (a supervisor, ``kill``) the same way.

Each service (``projector``, ``memory-extractor``, ``memory serve``, ``recover --watch``) takes a stop event
from :func:`stop_on_signals` and checks it between batches or passes; the process then leaves through its
``finally`` blocks — it commits what it did, closes its clients and withdraws its ``/metrics`` announcement
(``rj:{prefix}:metrics:endpoints``) — instead of dying at Python's default SIGTERM action, which runs no
``finally``. ``runjournal console`` is served by uvicorn, which already shuts down on both signals.
"""

from __future__ import annotations

import signal
import threading

__all__ = ["stop_on_signals"]


def stop_on_signals() -> threading.Event:
    """An event set by the first SIGINT or SIGTERM (handlers installed here, main thread only).

    Returns:
        The stop event; wait on it (``stop.wait(seconds)``) instead of ``time.sleep`` between passes.
    """
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop

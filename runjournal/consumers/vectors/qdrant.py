"""Qdrant plumbing shared by the memory and knowledge stores: error mapping, opening the embedded store,
and serialising one client between threads.

* :func:`mapped` translates qdrant-client / transport errors into the named store errors (cause chained).
* :func:`open_client` opens a server (``RUNJOURNAL_QDRANT_URL``) or the embedded directory. Embedded
  Qdrant allows one process per directory (a file lock); a process that finds it held waits up to
  ``wait_s`` for it (a reader holds it for one short operation) before raising :class:`StoreLockedError`.
* :class:`SerialClient` wraps a local-mode client so the extractor's writes and the read API's threads
  never run inside it at the same time (local mode is plain Python and not thread-safe).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdrant_client import QdrantClient
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from runjournal.consumers.vectors.errors import (
    MemoryPlaneError,
    StoreLockedError,
    StoreUnavailableError,
    StoreWriteError,
)
from runjournal.stores.errors import StoreContractError

_log = logging.getLogger("runjournal.consumers.vectors.qdrant")

if TYPE_CHECKING:
    from runjournal.core.settings import Settings

__all__ = ["SerialClient", "is_locked_error", "iso", "mapped", "open_client"]


def iso(moment: datetime) -> str:
    """A payload time (memory and knowledge points): ``2026-01-01T00:00:00.001Z`` — UTC, milliseconds, fixed
    width (so text order is time order)."""
    utc = moment.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


@contextlib.contextmanager
def mapped(what: str) -> Iterator[None]:
    """Translate qdrant-client / transport errors raised inside the block into our named errors.

    Raises:
        StoreUnavailableError: connection refused, timeout, HTTP 5xx or 429 (retryable).
        StoreWriteError: any other failure (HTTP 4xx, local-mode ValueError …).
    """
    try:
        yield
    except (MemoryPlaneError, StoreContractError):
        raise
    except UnexpectedResponse as exc:
        status = exc.status_code or 0
        cls = StoreUnavailableError if status >= 500 or status == 429 else StoreWriteError
        raise cls(f"qdrant {what}: HTTP {status}: {exc}") from exc
    except (ResponseHandlingException, ConnectionError, TimeoutError, OSError) as exc:
        raise StoreUnavailableError(f"qdrant {what}: unreachable: {exc}") from exc
    except Exception as exc:  # local mode raises ValueError/KeyError/etc.; grpc raises RpcError
        if type(exc).__module__.startswith(("httpx", "httpcore", "grpc")):
            raise StoreUnavailableError(f"qdrant {what}: unreachable: {exc}") from exc
        raise StoreWriteError(f"qdrant {what} failed: {type(exc).__name__}: {exc}") from exc


def is_locked_error(exc: BaseException) -> bool:
    """True when ``exc`` is qdrant-client's "folder already accessed by another instance" refusal."""
    return isinstance(exc, RuntimeError) and "already accessed" in str(exc)


def open_client(settings: Settings, *, timeout_s: int = 5, wait_s: float = 0.0) -> tuple[QdrantClient, str]:
    """Open the Qdrant ``settings`` name: ``(client, "server")`` or ``(client, "local")``.

    Args:
        timeout_s: server request timeout, seconds (default 5).
        wait_s: local mode: how long to wait for a directory held by another process (default 0: fail at once).

    Raises:
        StoreLockedError: local mode and the directory stayed held by another process for ``wait_s``.
        StoreWriteError: the directory cannot be opened for another reason.
    """
    if settings.qdrant_url:
        key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key else None
        return QdrantClient(url=settings.qdrant_url, api_key=key, timeout=timeout_s, check_compatibility=False), \
            "server"
    path = Path(settings.effective_qdrant_path)
    path.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    deadline = started + wait_s
    delay = 0.05
    said = None  # when the wait was last reported: a long wait says what it waits for, every 10 s
    while True:
        try:
            client = QdrantClient(path=str(path)), "local"
            if said is not None:
                _log.warning("opened the local Qdrant directory after waiting %.1f s", time.monotonic() - started,
                             extra={"path": str(path)})
            return client
        except RuntimeError as exc:
            if not is_locked_error(exc):
                raise StoreWriteError(f"cannot open local Qdrant at {path}: {exc}") from exc
            now = time.monotonic()
            if now < deadline and (said is None and now - started >= 1.0 or said is not None and now - said >= 10):
                said = now
                _log.warning("waiting for the local Qdrant directory (held by another process: a running "
                             "memory-extractor, memory serve or demo) — %.0f s of %.0f s", now - started, wait_s,
                             extra={"path": str(path), "waited_s": round(now - started, 1)})
            if time.monotonic() >= deadline:
                raise StoreLockedError(
                    f"the local Qdrant directory {path} is in use by another process (a running "
                    "`runjournal memory-extractor` serves reads to other processes once it has started; "
                    "otherwise stop the process holding it), or run a Qdrant server and set "
                    "RUNJOURNAL_QDRANT_URL") from exc
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


class SerialClient:
    """A proxy of a ``QdrantClient`` whose every method call holds one lock (see module docstring).

    Args:
        client: the client to wrap (owned: ``close`` closes it).
        lock: the lock to hold (default: a new ``threading.RLock``); share it between proxies of one client.
    """

    def __init__(self, client: QdrantClient, lock: threading.RLock | None = None) -> None:
        self._client = client
        self._lock = lock or threading.RLock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr
        lock = self._lock

        def locked(*args: Any, **kwargs: Any) -> Any:
            with lock:
                return attr(*args, **kwargs)

        return locked

    @property
    def lock(self) -> threading.RLock:
        """The lock every call holds."""
        return self._lock


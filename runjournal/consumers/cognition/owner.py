"""The owner of the embedded Qdrant directory: opens it once, serves every other process's reads.

Embedded Qdrant (the default) takes an exclusive lock on its directory. The process that writes — the
memory extractor, or ``runjournal knowledge serve`` — opens it through :class:`CognitionOwner`, which

1. opens the directory (waiting up to ``wait_s`` for a reader that holds it for one short operation),
2. wraps the client so its own writes and the API's reader threads never overlap (:class:`SerialClient`),
3. starts the read API (:mod:`~runjournal.consumers.cognition.api`) on ``127.0.0.1`` and an ephemeral port,
   uvicorn in a daemon thread,
4. publishes ``{url, token, pid}`` in ``<directory>/runjournal-serve.json`` (mode 0600, written atomically).

Readers find the file and talk HTTP (:mod:`~runjournal.consumers.cognition.readers`). On close the file is
removed first, then the server stops and the directory is released. With ``RUNJOURNAL_QDRANT_URL`` there is no
lock and no API: every process talks to the Qdrant server directly.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runjournal.consumers.knowledge.store import QdrantKnowledgeBase
from runjournal.consumers.memory.store import QdrantMemoryStore
from runjournal.consumers.vectors.embed import Embedder
from runjournal.consumers.vectors.qdrant import SerialClient, open_client

if TYPE_CHECKING:
    from runjournal.core.settings import Settings

__all__ = ["DISCOVERY_FILE", "CognitionOwner", "read_discovery"]

#: The owner's discovery file, inside the Qdrant directory it owns.
DISCOVERY_FILE = "runjournal-serve.json"


def read_discovery(directory: Path) -> dict[str, Any] | None:
    """The owner's ``{url, token, pid, path, started_at}`` in ``directory``, or None when nobody serves it."""
    try:
        data = json.loads((directory / DISCOVERY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "url" in data and "token" in data else None


class CognitionOwner:
    """Memory and knowledge stores on one Qdrant client, and (local mode) the read API serving them.

    Use :meth:`open`; close with :meth:`close` or a ``with`` block.

    Attributes:
        memory: the :class:`QdrantMemoryStore` (the extractor writes through it).
        knowledge: the :class:`QdrantKnowledgeBase` (``ingest`` writes through it).
        url: the read API's base URL (None in server mode).
    """

    def __init__(self, memory: QdrantMemoryStore, knowledge: QdrantKnowledgeBase, *, directory: Path | None) -> None:
        self.memory = memory
        self.knowledge = knowledge
        self.directory = directory
        self.url: str | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @classmethod
    def open(cls, settings: Settings, embedder: Embedder, *, wait_s: float = 30.0, serve: bool = True,
             timeout_s: int = 5) -> CognitionOwner:
        """Open the stores ``settings`` name and, in local mode with ``serve``, start the read API.

        Args:
            embedder: the vector space of both collections (the default MiniLM in production).
            wait_s: how long to wait for a directory held by a short-lived reader (default 30 s).
            serve: start the read API (default True; local mode only).
            timeout_s: Qdrant server request timeout, seconds.

        Raises:
            StoreLockedError: the directory stayed held by another process (another owner) for ``wait_s``.
        """
        client, mode = open_client(settings, timeout_s=timeout_s, wait_s=wait_s)
        shared: Any = SerialClient(client) if mode == "local" else client
        memory = QdrantMemoryStore(shared, embedder, prefix=settings.topic_prefix, mode=mode)
        knowledge = QdrantKnowledgeBase(shared, embedder, prefix=settings.topic_prefix, mode=mode)
        owner = cls(memory, knowledge, directory=Path(settings.effective_qdrant_path) if mode == "local" else None)
        if serve and owner.directory is not None:
            try:
                owner._serve()
            except BaseException:
                owner.close()
                raise
        return owner

    def _serve(self) -> None:
        import uvicorn

        from runjournal.consumers.cognition.api import build_app

        assert self.directory is not None
        token = secrets.token_urlsafe(24)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        app = build_app(self.memory, self.knowledge, token=token, path=str(self.directory))
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="cognition-api", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the cognition read API did not start")
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{port}"
        self._publish({"url": self.url, "token": token, "pid": os.getpid(), "path": str(self.directory),
                       "started_at": time.time()})

    def _publish(self, data: dict[str, Any]) -> None:
        assert self.directory is not None
        tmp = self.directory / f".{DISCOVERY_FILE}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self.directory / DISCOVERY_FILE)

    def close(self) -> None:
        """Unpublish, stop the API, release the directory. Harmless twice."""
        if self.directory is not None:
            found = read_discovery(self.directory)
            if found is not None and found.get("pid") == os.getpid():
                with contextlib.suppress(OSError):
                    (self.directory / DISCOVERY_FILE).unlink()
        if self._server is not None:
            self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(10)
            self._server = None
        self.memory.close()

    def __enter__(self) -> CognitionOwner:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

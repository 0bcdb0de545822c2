"""The cognition plane's serving layer: one owner per embedded Qdrant directory, readers in any process.

* :class:`CognitionOwner` — opens the directory (memory and knowledge on one client) and serves reads over
  a small HTTP API (Starlette + uvicorn, the ``[memory]`` extra); the memory extractor and
  ``runjournal memory serve`` are owners.
* :func:`open_memory_reader`, :func:`open_retriever` — a :class:`~runjournal.stores.MemoryReader` and a
  :class:`~runjournal.stores.Retriever` for any process (agents' ContextManagers, the CLI): through the
  owner's API, the Qdrant server (``RUNJOURNAL_QDRANT_URL``), or the directory itself when nobody owns it.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["DISCOVERY_FILE", "CognitionOwner", "read_discovery"], "runjournal.consumers.cognition.owner"),
    **dict.fromkeys(["KnowledgeReader", "MemoryReaderClient", "RemoteOwner", "open_memory_reader", "open_retriever"],
                    "runjournal.consumers.cognition.readers"),
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'runjournal.consumers.cognition' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["DISCOVERY_FILE", "CognitionOwner", "KnowledgeReader", "MemoryReaderClient", "RemoteOwner",
           "open_memory_reader", "open_retriever", "read_discovery"]

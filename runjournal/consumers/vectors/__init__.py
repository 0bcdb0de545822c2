"""The cognition plane's ground, shared by memory and knowledge: the embedder and its shipped model data, the
Qdrant client (opening the embedded directory, error mapping, one client serialised between threads), and the
plane's named errors. Nothing here knows what a memory item or a knowledge passage is.

* :class:`Embedder` (port), :class:`MiniLMEmbedder` (default: all-MiniLM-L6-v2 int8 ONNX, 384-d, offline),
  :func:`default_embedder`.
* :func:`open_client`, :class:`SerialClient`, :func:`mapped` (Qdrant errors → ours), :func:`iso` (payload times).
* :class:`MemoryPlaneError` and its subclasses (:mod:`~runjournal.consumers.vectors.errors`).
"""

from runjournal.core.lazy import lazy_exports

_HOMES = {
    **dict.fromkeys(["MODEL_SHA256", "TOKENIZER_SHA256", "Embedder", "MiniLMEmbedder", "default_embedder"],
                    "runjournal.consumers.vectors.embed"),
    **dict.fromkeys(["SerialClient", "iso", "mapped", "open_client"], "runjournal.consumers.vectors.qdrant"),
    **dict.fromkeys(["EmbedderError", "EmbedderUnavailableError", "IsolationError", "MemoryPlaneError",
                     "ModelIntegrityError", "OwnerDroppedError", "ScopeError", "StoreError", "StoreLockedError",
                     "StoreUnavailableError", "StoreWriteError", "VectorSpaceError"],
                    "runjournal.consumers.vectors.errors"),
}
__all__ = sorted(_HOMES)
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

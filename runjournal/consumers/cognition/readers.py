"""Memory and knowledge readers for any process: through the owner's read API, the Qdrant server, or the
embedded directory itself when nobody owns it.

:func:`open_memory_reader` and :func:`open_retriever` return a :class:`~runjournal.stores.MemoryReader` and a
:class:`~runjournal.stores.Retriever`. Each call resolves where to read, in this order:

1. ``RUNJOURNAL_QDRANT_URL`` set → the Qdrant server directly (the query is embedded here);
2. an owner publishes ``runjournal-serve.json`` in the directory → its HTTP API (the owner embeds the query;
   this process loads no model);
3. nobody owns the directory → open it for this one call and release it (waiting, with backoff, while
   someone else holds it — re-checking step 2 between tries, since an owner that is starting holds the lock
   before it publishes), up to ``wait_s``.

An owner that died leaves a stale file: its API is unreachable, so the call falls through to step 3.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from runjournal.consumers.cognition.owner import read_discovery
from runjournal.consumers.knowledge.errors import DocumentError
from runjournal.consumers.memory.sealing import reveal_hits
from runjournal.consumers.vectors.errors import StoreLockedError, StoreUnavailableError, StoreWriteError
from runjournal.producers.encryption import ContentCrypto
from runjournal.stores import (
    Authority,
    Evidence,
    KnowledgeScope,
    MemoryHit,
    Plane,
    PlaneError,
    ProvenanceError,
    Scope,
    ScopeError,
)

if TYPE_CHECKING:
    from runjournal.consumers.knowledge.store import QdrantKnowledgeBase
    from runjournal.consumers.memory.store import QdrantMemoryStore
    from runjournal.consumers.vectors.embed import Embedder
    from runjournal.core.settings import Settings

__all__ = ["KnowledgeReader", "MemoryReaderClient", "RemoteOwner", "open_memory_reader", "open_retriever"]

T = TypeVar("T")
_ERRORS: dict[str, type[Exception]] = {"ScopeError": ScopeError, "PlaneError": PlaneError,
                                       "ProvenanceError": ProvenanceError, "DocumentError": DocumentError}


class RemoteOwner:
    """HTTP client of one owner's read API (``url`` and ``token`` from its discovery file).

    Args:
        url: the API's base URL.
        token: its bearer token.
        timeout_s: per-request timeout, seconds (default 30: a search may wait behind a batch write).
    """

    def __init__(self, url: str, token: str, *, timeout_s: float = 30.0) -> None:
        self.url = url
        self._http = httpx.Client(base_url=url, timeout=timeout_s, headers={"Authorization": f"Bearer {token}"})

    def call(self, method: str, route: str, body: Mapping[str, Any] | None = None) -> Any:
        """One request; returns the decoded JSON.

        Raises:
            StoreUnavailableError: the owner is unreachable (gone) or overloaded.
            ScopeError / PlaneError / ProvenanceError / DocumentError: the contract error the owner named.
            StoreWriteError: any other refusal.
        """
        try:
            res = self._http.request(method, route, json=dict(body) if body is not None else None)
        except httpx.HTTPError as exc:
            raise StoreUnavailableError(f"the Qdrant owner at {self.url} is unreachable: {exc}") from exc
        if res.status_code == 200:
            return res.json()
        try:
            err = res.json()
        except ValueError:
            err = {"error": "HTTP", "message": res.text[:500]}
        cls = _ERRORS.get(str(err.get("error")))
        if cls is not None:
            raise cls(str(err.get("message")))
        if res.status_code == 503:
            raise StoreUnavailableError(f"owner at {self.url}: {err.get('message')}")
        raise StoreWriteError(f"owner at {self.url}: HTTP {res.status_code} {err.get('error')}: {err.get('message')}")

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._http.close()


class _Resolver:
    """Finds where to read for each call (steps of the module docstring)."""

    def __init__(self, settings: Settings, embedder_factory: Callable[[], Embedder] | None, wait_s: float) -> None:
        self.settings = settings
        self.wait_s = wait_s
        self._factory = embedder_factory
        self._embedder: Embedder | None = None
        self._remote: RemoteOwner | None = None
        self._remote_key: tuple[str, str] | None = None
        self._server: tuple[QdrantMemoryStore, QdrantKnowledgeBase] | None = None

    def embedder(self) -> Embedder:
        if self._embedder is None:
            from runjournal.consumers.vectors.embed import default_embedder
            self._embedder = (self._factory or default_embedder)()
        return self._embedder

    def owner(self) -> RemoteOwner | None:
        found = read_discovery(Path(self.settings.effective_qdrant_path))
        if found is None:
            return None
        key = (str(found["url"]), str(found["token"]))
        if key != self._remote_key:
            if self._remote is not None:
                self._remote.close()
            self._remote, self._remote_key = RemoteOwner(*key), key
        return self._remote

    def run(self, remote: Callable[[RemoteOwner], T],
            local: Callable[[QdrantMemoryStore, QdrantKnowledgeBase], T]) -> T:
        if self.settings.qdrant_url:
            return local(*self._server_stores())
        deadline = time.monotonic() + self.wait_s
        delay = 0.05
        while True:
            owner = self.owner()
            if owner is not None:
                try:
                    return remote(owner)
                except StoreUnavailableError:
                    if time.monotonic() >= deadline:
                        raise
            try:
                return self._local_once(local)
            except StoreLockedError:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _local_once(self, fn: Callable[[QdrantMemoryStore, QdrantKnowledgeBase], T]) -> T:
        from runjournal.consumers.knowledge.store import QdrantKnowledgeBase
        from runjournal.consumers.memory.store import QdrantMemoryStore
        from runjournal.consumers.vectors.qdrant import open_client

        embedder = self.embedder()
        client, mode = open_client(self.settings, wait_s=0.0)
        try:
            prefix = self.settings.topic_prefix
            return fn(QdrantMemoryStore(client, embedder, prefix=prefix, mode=mode),
                      QdrantKnowledgeBase(client, embedder, prefix=prefix, mode=mode))
        finally:
            client.close()

    def _server_stores(self) -> tuple[QdrantMemoryStore, QdrantKnowledgeBase]:
        if self._server is None:
            from runjournal.consumers.knowledge.store import QdrantKnowledgeBase
            from runjournal.consumers.memory.store import QdrantMemoryStore
            from runjournal.consumers.vectors.qdrant import open_client

            client, mode = open_client(self.settings)
            prefix, embedder = self.settings.topic_prefix, self.embedder()
            self._server = (QdrantMemoryStore(client, embedder, prefix=prefix, mode=mode),
                            QdrantKnowledgeBase(client, embedder, prefix=prefix, mode=mode))
        return self._server

    def close(self) -> None:
        if self._remote is not None:
            self._remote.close()
        if self._server is not None:
            self._server[0].close()


class MemoryReaderClient:
    """A :class:`~runjournal.stores.MemoryReader` usable from any process (see the module docstring).

    Sealed items (decision 0059, ``runjournal.consumers.memory.sealing``) are opened with this process's key service
    (``content``); one it cannot open reads ``encrypted``, its :attr:`MemoryHit.encrypted` naming why.
    """

    plane = Plane.COGNITION
    authority = Authority.ADVISORY

    def __init__(self, resolver: _Resolver, content: ContentCrypto | None = None) -> None:
        self._r = resolver
        self._content = content

    def search(self, scope: Scope, query: str, *, limit: int = 10, all_statuses: bool = False,
               where: Mapping[str, str] | None = None) -> list[MemoryHit]:
        """See :meth:`runjournal.stores.MemoryReader.search`.

        Raises:
            ScopeError: ``scope`` is not a memory Scope. StoreLockedError: nobody serves the directory and it
                stayed held for ``wait_s``. StoreUnavailableError: Qdrant or the owner is unreachable.
        """
        if not isinstance(scope, Scope):
            raise ScopeError(f"memory is searched with a memory Scope (tenant required), not {type(scope).__name__}")
        body = {**scope.as_payload(), "query": query, "limit": limit, "all_statuses": all_statuses,
                "where": dict(where) if where else None}
        return reveal_hits(self._r.run(
            lambda o: [MemoryHit.from_dict(h) for h in o.call("POST", "/v1/memory/search", body)["hits"]],
            lambda m, _k: m.search(scope, query, limit=limit, all_statuses=all_statuses, where=where)),
            self._content)

    def run_items(self, scope: Scope, run_id: str, *, limit: int = 200) -> list[MemoryHit]:
        """The items of ``scope``'s tenant extracted from ``run_id`` (any status), in offset order.

        Raises:
            ScopeError: ``scope`` is not a memory Scope. StoreUnavailableError / StoreLockedError: as :meth:`search`.
        """
        if not isinstance(scope, Scope):
            raise ScopeError(f"memory is read with a memory Scope (tenant required), not {type(scope).__name__}")
        body = {**scope.as_payload(), "run_id": run_id, "limit": limit}
        return reveal_hits(self._r.run(
            lambda o: [MemoryHit.from_dict(h) for h in o.call("POST", "/v1/memory/run", body)["hits"]],
            lambda m, _k: m.run_items(scope, run_id, limit=limit)), self._content)

    def forget(self, tenant_id: str, user_id: str | None = None) -> int:
        """Delete every item of ``user_id`` of ``tenant_id`` (None: of the whole tenant) through whoever holds the
        store — the directory's owner (the running memory extractor), the directory itself, or the server: what
        ``runjournal erase --tenant T [--subject U]`` does beside destroying the keys (decision 0059).

        Returns:
            The number of points deleted.

        Raises:
            ScopeError: ``tenant_id`` is empty. StoreUnavailableError / StoreLockedError: as :meth:`search`.
        """
        tenant = Scope(tenant_id).tenant_id
        body = {"tenant_id": tenant, "user_id": user_id}
        return int(self._r.run(lambda o: o.call("POST", "/v1/memory/forget", body)["deleted"],
                               lambda m, _k: m.delete_by_owner(tenant, user_id)))

    def stats(self, scope: Scope | None = None) -> dict[str, Any]:
        """Counts by status (one tenant, or all when None)."""
        body = {"tenant_id": scope.tenant_id if scope else None}
        return self._r.run(lambda o: o.call("POST", "/v1/memory/stats", body), lambda m, _k: m.stats(scope))

    def close(self) -> None:
        """Release connections (and the server client, in server mode)."""
        self._r.close()


class KnowledgeReader:
    """A :class:`~runjournal.stores.Retriever` usable from any process, plus the corpus's ingest (which goes
    through the owner when one serves the directory)."""

    plane = Plane.COGNITION
    authority = Authority.ADVISORY

    def __init__(self, resolver: _Resolver) -> None:
        self._r = resolver

    def retrieve(self, query: str, scope: KnowledgeScope | None = None, *, limit: int = 5) -> list[Evidence]:
        """See :meth:`runjournal.stores.Retriever.retrieve`.

        Raises:
            ScopeError: ``scope`` is not a KnowledgeScope (a memory Scope is a cross-use).
        """
        if scope is not None and not isinstance(scope, KnowledgeScope):
            raise ScopeError(f"knowledge is searched with a KnowledgeScope, not {type(scope).__name__}")
        body = {"query": query, "limit": limit, "corpus": scope.corpus if scope else None,
                "document": scope.document if scope else None}
        return self._r.run(
            lambda o: [Evidence.from_dict(e) for e in o.call("POST", "/v1/knowledge/retrieve", body)["evidence"]],
            lambda _m, k: k.retrieve(query, scope, limit=limit))

    def stats(self) -> dict[str, Any]:
        """The knowledge base's stats."""
        return self._r.run(lambda o: o.call("GET", "/v1/knowledge/stats"), lambda _m, k: k.stats())

    def ingest(self, path: str | Path, *, corpus: str = "default") -> dict[str, Any]:
        """Ingest a document (an admin write, never a query) — through the owner when one serves.

        Returns:
            The :class:`~runjournal.consumers.knowledge.store.IngestReport` as a dict.
        """
        doc = str(Path(path).resolve())
        if not Path(doc).is_file():
            raise DocumentError(f"{doc}: no such file")
        return self._r.run(lambda o: o.call("POST", "/v1/knowledge/ingest", {"path": doc, "corpus": corpus}),
                           lambda _m, k: k.ingest(doc, corpus=corpus).as_dict())

    def close(self) -> None:
        """Release connections."""
        self._r.close()


def open_memory_reader(settings: Settings, *, embedder_factory: Callable[[], Embedder] | None = None,
                       wait_s: float = 30.0, keys: bool = True) -> MemoryReaderClient:
    """A memory reader for this process (nothing is opened until the first call).

    Args:
        embedder_factory: builds the query embedder when this process reads Qdrant itself (default MiniLM).
        wait_s: how long one call may wait for a held directory (default 30 s).
        keys: open sealed items with ``settings``' key service (``RUNJOURNAL_KMS``, ``RUNJOURNAL_KEYS_DIR``;
            default True); False: a reader that holds no key (the console) — sealed items read ``encrypted``.
    """
    return MemoryReaderClient(_Resolver(settings, embedder_factory, wait_s),
                              ContentCrypto(settings, encrypt=False) if keys else None)


def open_retriever(settings: Settings, *, embedder_factory: Callable[[], Embedder] | None = None,
                   wait_s: float = 30.0) -> KnowledgeReader:
    """A knowledge retriever for this process (see :func:`open_memory_reader`)."""
    return KnowledgeReader(_Resolver(settings, embedder_factory, wait_s))

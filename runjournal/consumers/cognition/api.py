"""The read API of the process that owns the embedded Qdrant directory (Starlette, served by uvicorn).

Embedded Qdrant lets one process open its directory; that process (the memory extractor, or
``runjournal knowledge serve``) serves every other process's reads here. Routes (JSON in, JSON out; every
request carries ``Authorization: Bearer <token>`` from the discovery file):

* ``GET  /v1/health`` → ``{"ok": true, "pid", "path"}``
* ``POST /v1/memory/search`` ``{tenant_id, user_id?, agent_id?, query, limit?, all_statuses?, where?}``
  → ``{"hits": [...]}``
* ``POST /v1/memory/run`` ``{tenant_id, run_id, limit?}`` → ``{"hits": [...]}``: the items extracted from one run
* ``POST /v1/memory/stats`` ``{tenant_id?}`` → the store's stats
* ``POST /v1/memory/forget`` ``{tenant_id, user_id?}`` → ``{"deleted": n}``: every item of that user of the tenant
  (without ``user_id``: of the tenant) — memory's one delete route, for ``runjournal erase --tenant T [--subject U]``
  while the owner runs (decision 0059: the items' vectors are embeddings of the shredded text)
* ``POST /v1/knowledge/retrieve`` ``{query, corpus?, document?, limit?}`` → ``{"evidence": [...]}``
* ``GET  /v1/knowledge/stats`` → the knowledge base's stats
* ``POST /v1/knowledge/ingest`` ``{path, corpus?}`` → the ingest report — the corpus's one write route,
  for ``runjournal knowledge ingest`` while the owner runs; no query route ever writes.

Errors: ``{"error": <error class name>, "message"}`` with 400 (scope or bad request), 409 (plane or
provenance contract), 503 (Qdrant unavailable), 500 (other store failure), 401 (token).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from runjournal.consumers.knowledge.errors import KnowledgeError
from runjournal.consumers.vectors.errors import MemoryPlaneError
from runjournal.core.ids import USER_ID
from runjournal.stores import KnowledgeScope, Scope, StoreContractError
from runjournal.stores.errors import PlaneError, ProvenanceError

if TYPE_CHECKING:
    from runjournal.consumers.knowledge.store import QdrantKnowledgeBase
    from runjournal.consumers.memory.store import QdrantMemoryStore

__all__ = ["build_app"]

Handler = Callable[[dict[str, Any]], Any]


def _status(exc: Exception) -> int:
    if isinstance(exc, PlaneError | ProvenanceError):
        return 409
    if isinstance(exc, StoreContractError | KnowledgeError | KeyError | TypeError | ValueError):
        return 400
    if getattr(exc, "retryable", False):
        return 503
    return 500


def _route(fn: Handler, token: str, *, method: str) -> Callable[[Request], Awaitable[JSONResponse]]:
    async def endpoint(request: Request) -> JSONResponse:
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given, f"Bearer {token}"):
            return JSONResponse({"error": "Unauthorized", "message": "bad or missing bearer token"}, status_code=401)
        try:
            body = await request.json() if method == "POST" else {}
            if not isinstance(body, dict):
                raise TypeError("the request body must be a JSON object")
            return JSONResponse(await run_in_threadpool(fn, body))
        except (StoreContractError, KnowledgeError, MemoryPlaneError, KeyError, TypeError, ValueError) as exc:
            return JSONResponse({"error": type(exc).__name__, "message": str(exc)}, status_code=_status(exc))
    return endpoint


def build_app(memory: QdrantMemoryStore, knowledge: QdrantKnowledgeBase, *, token: str, path: str) -> Starlette:
    """The Starlette app serving ``memory`` and ``knowledge`` (see the module docstring).

    Args:
        memory, knowledge: the owner's stores (their client serialised between threads).
        token: the bearer token every request must carry.
        path: the Qdrant directory served (reported by ``/v1/health``).
    """
    def health(_: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "pid": os.getpid(), "path": path}

    def memory_search(b: dict[str, Any]) -> dict[str, Any]:
        scope = Scope(b["tenant_id"], user_id=b.get("user_id"), agent_id=b.get("agent_id"))
        hits = memory.search(scope, str(b["query"]), limit=int(b.get("limit", 10)),
                             all_statuses=bool(b.get("all_statuses", False)), where=b.get("where"))
        return {"hits": [h.as_dict() for h in hits]}

    def memory_run(b: dict[str, Any]) -> dict[str, Any]:
        scope = Scope(b["tenant_id"], user_id=b.get("user_id"), agent_id=b.get("agent_id"))
        return {"hits": [h.as_dict() for h in memory.run_items(scope, str(b["run_id"]),
                                                                 limit=int(b.get("limit", 200)))]}

    def memory_stats(b: dict[str, Any]) -> dict[str, Any]:
        tenant = b.get("tenant_id")
        return memory.stats(Scope(tenant) if tenant is not None else None)

    def memory_forget(b: dict[str, Any]) -> dict[str, Any]:
        tenant, user = Scope(b["tenant_id"]).tenant_id, b.get("user_id")
        return {"deleted": memory.delete_by_owner(tenant, USER_ID.check_optional(user))}

    def knowledge_retrieve(b: dict[str, Any]) -> dict[str, Any]:
        scope = KnowledgeScope(corpus=b.get("corpus"), document=b.get("document"))
        found = knowledge.retrieve(str(b["query"]), scope, limit=int(b.get("limit", 5)))
        return {"evidence": [e.as_dict() for e in found]}

    def knowledge_ingest(b: dict[str, Any]) -> dict[str, Any]:
        return knowledge.ingest(str(b["path"]), corpus=str(b.get("corpus") or "default")).as_dict()

    routes = [
        Route("/v1/health", _route(health, token, method="GET"), methods=["GET"]),
        Route("/v1/memory/search", _route(memory_search, token, method="POST"), methods=["POST"]),
        Route("/v1/memory/run", _route(memory_run, token, method="POST"), methods=["POST"]),
        Route("/v1/memory/stats", _route(memory_stats, token, method="POST"), methods=["POST"]),
        Route("/v1/memory/forget", _route(memory_forget, token, method="POST"), methods=["POST"]),
        Route("/v1/knowledge/retrieve", _route(knowledge_retrieve, token, method="POST"), methods=["POST"]),
        Route("/v1/knowledge/stats", _route(lambda _: knowledge.stats(), token, method="GET"), methods=["GET"]),
        Route("/v1/knowledge/ingest", _route(knowledge_ingest, token, method="POST"), methods=["POST"]),
    ]
    return Starlette(routes=routes)

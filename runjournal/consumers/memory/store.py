"""``QdrantMemoryStore``: the :class:`~runjournal.consumers.memory.ports.MemoryStore` on Qdrant.

Embedded local mode by default (``QdrantClient(path=settings.effective_qdrant_path)``: one process
at a time may open the directory), a server when ``RUNJOURNAL_QDRANT_URL`` is set.

One collection per vector space, ``{prefix}_memory__{embedder_id}_{dimension}`` (cosine), with
keyword payload indexes on ``scope.tenant_id``, ``scope.user_id``, ``status``, ``subject``,
``provenance.run_id`` (local mode ignores indexes). Payload of every point::

    text, kind, subject, authority="advisory", store="memory", status ("active" | "superseded"), superseded_by,
    scope      {tenant_id, user_id, agent_id}
    provenance {run_id, event_id, event_key, event_type, topic, partition, offset, schema,
                extractor, item_index, embedder_id, dimension}
    freshness  {created_at, valid_until}        (ISO-8601 UTC, ms)
    metadata   {str: str}                       (free; cannot override any key above)

Point ids are ``uuid5(event_id#item_index)``: a redelivered event rewrites the same points.
Supersession: items with the same ``(tenant_id, user_id, subject)`` form a group; on every write
to a group its members' status fields are recomputed from the whole group (newest active, each
older one superseded by its successor), so redelivery never flips a state. With several extractor
instances writing the same group at once (server mode only) two items may both stay active until
the group's next write; a single instance has no such race.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import UnexpectedResponse

from runjournal.consumers.memory.filters import TENANT_KEY, group_filter, scope_filter
from runjournal.consumers.memory.items import MemoryHit, MemoryItem, Scope, Status
from runjournal.consumers.memory.payload import (
    STORE,
    GroupKey,
    build_payload,
    collection_name,
    group_key,
    hit_from,
    point_id,
    resolve,
)
from runjournal.consumers.vectors.embed import Embedder
from runjournal.consumers.vectors.errors import IsolationError, OwnerDroppedError, VectorSpaceError
from runjournal.consumers.vectors.qdrant import mapped, open_client
from runjournal.stores import Authority, Plane, PlaneError

if TYPE_CHECKING:
    from runjournal.core.settings import Settings

__all__ = ["INDEXED_KEYS", "QdrantMemoryStore"]

#: Payload keys with a keyword index (server mode).
INDEXED_KEYS = (TENANT_KEY, "scope.user_id", "status", "subject", "provenance.run_id")
_PAGE = 256


class QdrantMemoryStore:
    """The :class:`~runjournal.stores.MemoryStore`: advisory memory in one Qdrant collection (see module
    docstring). Not thread-safe (the owner process serialises its client, :mod:`runjournal.consumers.cognition`).

    Args:
        client: a connected ``QdrantClient`` (owned: :meth:`close` closes it).
        embedder: names the vector space and embeds queries (and items given without vectors).
        prefix: topic prefix; first part of the collection name.
        mode: ``"local"`` or ``"server"`` (for :meth:`stats` and messages).
    """

    plane = Plane.COGNITION
    authority = Authority.ADVISORY

    def __init__(self, client: QdrantClient, embedder: Embedder, *, prefix: str, mode: str = "server") -> None:
        self.client = client
        self.embedder = embedder
        self.mode = mode
        self.collection = collection_name(prefix, embedder.embedder_id, embedder.dimension)
        self._ready = False

    @classmethod
    def open(cls, settings: Settings, embedder: Embedder, *, timeout_s: int = 5,
             wait_s: float = 0.0) -> QdrantMemoryStore:
        """Open the store ``settings`` name: a server at ``RUNJOURNAL_QDRANT_URL`` (lazily: nothing is
        sent until the first call) or else the local directory ``settings.effective_qdrant_path``.

        In-process access only: readers in other processes than the directory's owner use
        :func:`runjournal.consumers.cognition.open_memory_reader`.

        Args:
            timeout_s: server request timeout, seconds (default 5).
            wait_s: local mode: how long to wait for a directory another process holds (default 0).

        Raises:
            StoreLockedError: local mode and another process (usually the running memory extractor)
                holds the directory.
        """
        client, mode = open_client(settings, timeout_s=timeout_s, wait_s=wait_s)
        return cls(client, embedder, prefix=settings.topic_prefix, mode=mode)

    def close(self) -> None:
        """Close the client (releases the local directory's lock)."""
        with contextlib.suppress(Exception):
            self.client.close()

    def __enter__(self) -> QdrantMemoryStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- collection -------------------------------------------------------------------------
    def ensure_collection(self) -> None:
        """Create the collection and its payload indexes if missing; check its vector space.

        Raises:
            VectorSpaceError: an existing collection of this name has another size or distance.
            StoreUnavailableError / StoreWriteError: Qdrant failed.
        """
        if self._ready:
            return
        dim = self.embedder.dimension
        with mapped("create collection"):
            if not self.client.collection_exists(self.collection):
                try:
                    self.client.create_collection(self.collection, vectors_config=models.VectorParams(
                        size=dim, distance=models.Distance.COSINE))
                except UnexpectedResponse as exc:  # created concurrently by another instance
                    if exc.status_code != 409:
                        raise
            params = self.client.get_collection(self.collection).config.params.vectors
            if not isinstance(params, models.VectorParams) or params.size != dim or \
                    params.distance != models.Distance.COSINE:
                raise VectorSpaceError(f"collection {self.collection} holds vectors {params}, "
                                       f"not {dim}-d cosine of {self.embedder.embedder_id}")
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Payload indexes have no effect")
                for key in INDEXED_KEYS:
                    self.client.create_payload_index(self.collection, key, models.PayloadSchemaType.KEYWORD)
        self._ready = True

    # -- writes -------------------------------------------------------------------------------
    def upsert(self, items: Sequence[MemoryItem], vectors: np.ndarray | None = None) -> int:
        """See :meth:`runjournal.consumers.memory.ports.MemoryStore.upsert`; waits for Qdrant to apply."""
        if not items:
            return 0
        dim = self.embedder.dimension
        built = [build_payload(i, embedder_id=self.embedder.embedder_id, dimension=dim) for i in items]
        if vectors is None:
            vectors = self.embedder.embed([i.text for i in items])
        if vectors.shape != (len(items), dim):
            raise VectorSpaceError(f"got vectors of shape {vectors.shape} for {len(items)} items of dimension {dim}")
        self.ensure_collection()
        payloads: dict[str, dict[str, Any]] = {}
        by_id: dict[str, np.ndarray] = {}
        for item, payload, vector in zip(items, built, vectors, strict=True):  # a duplicate record: last wins
            pid = point_id(item.provenance.event_id, item.provenance.item_index)
            payloads[pid], by_id[pid] = payload, vector
        self._refuse_owner_drop(payloads)
        changed_existing: dict[str, dict[str, Any]] = {}
        groups = self._groups({k for k in (group_key(p) for p in payloads.values()) if k is not None})
        for key, stored in groups.items():
            members = {**stored, **{pid: p for pid, p in payloads.items() if group_key(p) == key}}
            for pid, fields in resolve(members).items():
                if pid in payloads:
                    payloads[pid].update(fields)
                elif any(members[pid].get(k) != v for k, v in fields.items()):
                    changed_existing[pid] = fields
        points = [models.PointStruct(id=pid, vector=by_id[pid].tolist(), payload=payloads[pid]) for pid in payloads]
        with mapped("upsert"):
            self.client.upsert(self.collection, points=points, wait=True)
            for pid, fields in changed_existing.items():
                self.client.set_payload(self.collection, payload=fields, points=[pid], wait=True)
        return len(points)

    def _refuse_owner_drop(self, payloads: Mapping[str, Mapping[str, Any]]) -> None:
        """Raise :class:`OwnerDroppedError` when a stored point has a ``user_id`` its rewrite would drop."""
        ownerless = [pid for pid, p in payloads.items() if not p["scope"].get("user_id")]
        if not ownerless:
            return
        with mapped("retrieve"):
            stored = self.client.retrieve(self.collection, ids=ownerless, with_payload=True, with_vectors=False)
        dropped = [str(pt.id) for pt in stored if ((pt.payload or {}).get("scope") or {}).get("user_id")]
        if dropped:
            raise OwnerDroppedError(f"refused: rewriting point(s) {dropped} without their stored user_id")

    def delete_by_run(self, run_id: str) -> int:
        """See :meth:`runjournal.consumers.memory.ports.MemoryStore.delete_by_run`; groups that lose a member are
        re-resolved (an older item becomes active again if its successor was erased)."""
        return self._delete_where(models.Filter(must=[_eq("provenance.run_id", run_id)]))

    def delete_by_owner(self, tenant_id: str, user_id: str | None = None) -> int:
        """Erase every item of ``user_id`` of ``tenant_id`` (None: every item of the tenant) — what ``runjournal erase
        --tenant T [--subject U]`` does beside destroying the keys: a sealed item's text is unreadable once its key is
        gone, and deleting the point takes its vector (an embedding of that text) too (decision 0059).

        Returns:
            The number of points deleted.
        """
        must = [_eq(TENANT_KEY, tenant_id)]
        if user_id is not None:
            must.append(_eq("scope.user_id", user_id))
        return self._delete_where(models.Filter(must=must))

    def delete_by_event_key(self, event_key: str) -> int:
        """Erase the items extracted from the record with key ``{run_id}:{epoch}:{seq}`` (a tombstone).

        Returns:
            The number of points deleted.
        """
        return self._delete_where(models.Filter(must=[_eq("provenance.event_key", event_key)]))

    def _delete_where(self, selector: models.Filter) -> int:
        self.ensure_collection()
        doomed = dict(self._scroll(selector))
        if not doomed:
            return 0
        keys = {k for k in (group_key(p) for p in doomed.values()) if k is not None}
        with mapped("delete"):
            self.client.delete(self.collection, points_selector=list(doomed), wait=True)
            for members in self._groups(keys).values():
                for pid, fields in resolve(members).items():
                    if any(members[pid].get(k) != v for k, v in fields.items()):
                        self.client.set_payload(self.collection, payload=fields, points=[pid], wait=True)
        return len(doomed)

    # -- reads --------------------------------------------------------------------------------
    def search(self, scope: Scope, query: str, *, limit: int = 10, all_statuses: bool = False,
               where: Mapping[str, str] | None = None) -> list[MemoryHit]:
        """See :meth:`runjournal.consumers.memory.ports.MemoryStore.search`. Scores are cosine similarities.

        Raises:
            IsolationError: a hit of another tenant came back (never expected; nothing is returned).
            PlaneError: a hit is not a memory point (e.g. a knowledge point; nothing is returned).
        """
        flt = scope_filter(scope, statuses=None if all_statuses else (Status.ACTIVE,), where=where)
        vector = self.embedder.embed([query])[0]
        self.ensure_collection()
        with mapped("search"):
            res = self.client.query_points(self.collection, query=vector.tolist(), query_filter=flt, limit=limit,
                                           with_payload=True)
        if any((p.payload or {}).get("store", STORE) != STORE for p in res.points):
            raise PlaneError(f"collection {self.collection} returned a point that is not memory: a cross-use")
        hits = [hit_from(p.id, p.score, p.payload or {}) for p in res.points]
        if any(h.scope.get("tenant_id") != scope.tenant_id for h in hits):
            raise IsolationError(f"a search in tenant {scope.tenant_id!r} matched another tenant's item")
        return hits

    def history(self, scope: Scope, subject: str) -> list[MemoryHit]:
        """Every item of ``scope`` on ``subject``, any status, oldest first (score 0)."""
        self.ensure_collection()
        found = self._scroll(scope_filter(scope, statuses=None, where={"subject": subject}))
        hits = [hit_from(pid, 0.0, p) for pid, p in found]
        return sorted(hits, key=lambda h: (h.freshness["created_at"], h.id))

    def run_items(self, scope: Scope, run_id: str, *, limit: int = 200) -> list[MemoryHit]:
        """The items of ``scope``'s tenant extracted from ``run_id`` (any status), in offset order (score 0):
        what the console shows beside a run, each with its provenance back to the event's offset.

        Raises:
            ScopeError: ``scope`` is not a memory Scope (the tenant filter comes first, as for every read).
        """
        self.ensure_collection()
        flt = scope_filter(scope, statuses=None)
        flt.must.append(_eq("provenance.run_id", run_id))
        hits = [hit_from(pid, 0.0, p) for pid, p in self._scroll(flt)]
        if any(h.scope.get("tenant_id") != scope.tenant_id for h in hits):
            raise IsolationError(f"a read in tenant {scope.tenant_id!r} matched another tenant's item")
        hits.sort(key=lambda h: (h.provenance.get("partition", 0), h.provenance.get("offset", 0),
                                 h.provenance.get("item_index", 0)))
        return hits[:limit]

    def stats(self, scope: Scope | None = None) -> dict[str, Any]:
        """Counts by status (of ``scope``'s tenant, or of the whole collection when None — an admin view)."""
        self.ensure_collection()
        out: dict[str, Any] = {"collection": self.collection, "mode": self.mode,
                               "embedder_id": self.embedder.embedder_id, "dimension": self.embedder.dimension}
        with mapped("count"):
            for status in Status:
                flt = (scope_filter(scope, statuses=(status,)) if scope is not None
                       else models.Filter(must=[_eq("status", status.value)]))
                out[status.value] = self.client.count(self.collection, count_filter=flt, exact=True).count
        return out

    def _groups(self, keys: set[GroupKey]) -> dict[GroupKey, dict[str, dict[str, Any]]]:
        """The stored members of each group in ``keys``: one scroll per (tenant, with/without user)."""
        out: dict[GroupKey, dict[str, dict[str, Any]]] = {k: {} for k in keys}
        buckets: dict[tuple[str, bool], set[GroupKey]] = {}
        for key in keys:
            buckets.setdefault((key[0], key[1] is not None), set()).add(key)
        for (tenant, with_user), bucket in sorted(buckets.items()):
            users = {k[1] for k in bucket if k[1] is not None} if with_user else None
            flt = group_filter(Scope(tenant), users=users, subjects={k[2] for k in bucket})
            for pid, payload in self._scroll(flt):
                key = group_key(payload)
                if key in out:  # the filter is a cross product of users and subjects: keep exact groups
                    out[key][pid] = payload
        return out

    def _scroll(self, flt: models.Filter) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        offset = None
        with mapped("scroll"):
            while True:
                points, offset = self.client.scroll(self.collection, scroll_filter=flt, limit=_PAGE, offset=offset,
                                                    with_payload=True, with_vectors=False)
                out.extend((str(p.id), dict(p.payload or {})) for p in points)
                if offset is None:
                    return out


def _eq(key: str, value: str) -> models.FieldCondition:
    return models.FieldCondition(key=key, match=models.MatchValue(value=value))

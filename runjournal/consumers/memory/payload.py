"""Pure helpers of the Qdrant store: point ids, collection names, payloads, supersession order."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import Any

from runjournal.consumers.memory.items import AUTHORITY, MemoryHit, MemoryItem, Scope, Status
from runjournal.consumers.vectors.errors import ScopeError
from runjournal.consumers.vectors.qdrant import iso

__all__ = ["STORE", "GroupKey", "build_payload", "collection_name", "group_key", "hit_from", "iso", "point_id",
           "resolve"]

#: Namespace of point ids. Never change it (or the id format): redelivered events must map to the same ids.
POINT_NAMESPACE = uuid.UUID("6f1c1d2e-5b0a-5c8e-9a57-0c0a3d4e7b21")

#: Every memory point's ``store``: a memory search that meets another value (a knowledge point) is a cross-use.
STORE = "memory"

#: ``(tenant_id, user_id, subject)``: items of one group supersede each other in journal order (:func:`resolve`).
GroupKey = tuple[str, str | None, str]


def point_id(event_id: str, item_index: int) -> str:
    """``uuid5(POINT_NAMESPACE, f"{event_id}#{item_index}")`` as text: stable across redeliveries."""
    return str(uuid.uuid5(POINT_NAMESPACE, f"{event_id}#{item_index}"))


def _sanitise(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def collection_name(prefix: str, embedder_id: str, dimension: int) -> str:
    """``{prefix}_memory__{embedder_id}_{dimension}`` with every run of non ``[a-z0-9]`` turned into ``_``.

    One collection per vector space: ``runjournal_memory__minilm_l6_v2_int8_8199be6f_384``.
    """
    return f"{_sanitise(prefix)}_memory__{_sanitise(embedder_id)}_{dimension}"


def build_payload(item: MemoryItem, *, embedder_id: str, dimension: int) -> dict[str, Any]:
    """The stored payload of ``item`` (status active until :func:`resolve` says otherwise).

    Raises:
        ScopeError: ``item.scope`` is not a :class:`Scope` (items without a tenant are refused at write).
    """
    if not isinstance(item.scope, Scope):
        raise ScopeError(f"item from event {item.provenance.event_id} has no Scope; refused")
    p = item.provenance
    metadata = {str(k): str(v) for k, v in item.metadata.items()}
    return {
        "text": item.text,
        "kind": item.kind.value,
        "subject": item.subject,
        "scope": item.scope.as_payload(),
        "provenance": {"run_id": p.run_id, "event_id": p.event_id, "event_key": p.event_key,
                       "event_type": p.event_type, "topic": p.topic, "partition": p.partition, "offset": p.offset,
                       "schema": p.schema, "extractor": p.extractor, "item_index": p.item_index,
                       "embedder_id": embedder_id, "dimension": dimension},
        "freshness": {"created_at": iso(item.created_at), "valid_until": None},
        "status": Status.ACTIVE.value,
        "superseded_by": None,
        "authority": AUTHORITY,
        "store": STORE,
        "metadata": metadata,
    }


def group_key(payload: Mapping[str, Any]) -> GroupKey | None:
    """The supersession group of a payload, or None when it has no subject."""
    subject = payload.get("subject")
    if not subject:
        return None
    scope = payload["scope"]
    return scope["tenant_id"], scope.get("user_id"), subject


def resolve(members: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Status fields of every member of one group, as a pure function of the set (so the result does
    not depend on delivery order or on how often an event was processed).

    One clock per decision (docs/design/protocol.md § Memory): within one partition the journal's order decides —
    of two items of one partition the one at the later offset is newer, whatever the ``created_at`` their writers'
    clocks gave them (a host whose clock runs behind never keeps a stale preference active). The journal has no
    order across partitions; there each item's **effective time** decides: the latest ``created_at`` at or before
    its offset in its partition, so a partition's items keep their journal order in the merge too. Members are
    sorted by ``(effective time, partition, offset, item_index, point id)`` (a total order: no two clocks are ever
    compared for two items of one partition). The last is active, each other is superseded by the next one
    (``superseded_by`` = its id, ``valid_until`` = its effective time, never before the item's own ``created_at``).

    Returns:
        ``{point_id: {"status", "superseded_by", "freshness": {"created_at", "valid_until"}}}``.
    """
    def position(pid: str) -> tuple[int, int, int, str]:
        prov = members[pid]["provenance"]
        return int(prov.get("partition", -1)), int(prov.get("offset", -1)), int(prov["item_index"]), pid

    effective: dict[str, str] = {}
    latest: dict[int, str] = {}
    for pid in sorted(members, key=position):  # per partition, in journal order
        part = position(pid)[0]
        created = str(members[pid]["freshness"]["created_at"])
        latest[part] = effective[pid] = max(latest.get(part, created), created)
    ids = sorted(members, key=lambda pid: (effective[pid], *position(pid)))
    out: dict[str, dict[str, Any]] = {}
    for i, pid in enumerate(ids):
        created = members[pid]["freshness"]["created_at"]
        nxt = ids[i + 1] if i + 1 < len(ids) else None
        out[pid] = {
            "status": (Status.SUPERSEDED if nxt else Status.ACTIVE).value,
            "superseded_by": nxt,
            "freshness": {"created_at": created, "valid_until": effective[nxt] if nxt else None},
        }
    return out


def hit_from(point_id_: str, score: float, payload: Mapping[str, Any]) -> MemoryHit:
    """A :class:`MemoryHit` from a stored point's id, score and payload."""
    return MemoryHit(id=str(point_id_), score=float(score), text=payload["text"], kind=payload["kind"],
                     subject=payload.get("subject"), status=payload["status"], scope=dict(payload["scope"]),
                     provenance=dict(payload["provenance"]), freshness=dict(payload["freshness"]),
                     superseded_by=payload.get("superseded_by"), authority=payload.get("authority", AUTHORITY))

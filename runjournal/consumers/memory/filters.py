"""The one place where scoped Qdrant filters are built. Every search and every supersession lookup goes
through :func:`scope_filter`, which cannot be called without a :class:`~runjournal.consumers.memory.items.Scope`
(and a Scope cannot exist without a tenant): no search path exists without a tenant filter. The one
unscoped selection is the admin erase, ``MemoryStore.delete_by_run``, which returns only a count.

Payload keys used (nested; see :mod:`runjournal.consumers.memory.store` for the whole payload):
``scope.tenant_id``, ``scope.user_id``, ``scope.agent_id``, ``status``, ``subject``, ``kind``,
``provenance.run_id``, ``provenance.event_key``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from qdrant_client import models

from runjournal.consumers.memory.items import Scope, Status
from runjournal.consumers.vectors.errors import ScopeError

__all__ = ["FILTERABLE_KEYS", "IDENTITY_KEYS", "TENANT_KEY", "group_filter", "scope_filter"]

#: Payload key of the tenant (the isolation boundary).
TENANT_KEY = "scope.tenant_id"
#: Keys that only a Scope may set in a filter; a caller's ``where`` naming one is refused.
IDENTITY_KEYS = frozenset({"tenant_id", "user_id", "agent_id", "scope", "scope.tenant_id", "scope.user_id",
                           "scope.agent_id"})
#: Keys a caller may add as exact-match conditions through ``where``.
FILTERABLE_KEYS = frozenset({"kind", "subject"})


def scope_filter(scope: Scope, *, statuses: Iterable[Status] | None = (Status.ACTIVE,),
                 where: Mapping[str, str] | None = None, user_exact: bool = False) -> models.Filter:
    """The filter for ``scope``: tenant always; user and agent when the scope names them.

    Args:
        scope: whose memory. ``tenant_id`` is always a ``must`` condition.
        statuses: statuses to include (default: active only); None means every status (history).
        where: extra exact matches on :data:`FILTERABLE_KEYS` (``{"subject": "seat_preference"}``).
        user_exact: when True a scope with ``user_id=None`` matches only items *without* a user
            (supersession groups); when False (searches) ``user_id=None`` means "any user of the tenant".

    Returns:
        A ``qdrant_client.models.Filter`` whose ``must`` list starts with the tenant condition.

    Raises:
        ScopeError: ``scope`` is not a :class:`Scope`, or ``where`` names an identity or unknown key.
    """
    if not isinstance(scope, Scope):
        raise ScopeError(f"a memory filter needs a Scope, got {type(scope).__name__}")
    must: list[models.Condition] = [_eq(TENANT_KEY, scope.tenant_id)]
    if scope.user_id is not None:
        must.append(_eq("scope.user_id", scope.user_id))
    elif user_exact:
        must.append(models.IsEmptyCondition(is_empty=models.PayloadField(key="scope.user_id")))
    if scope.agent_id is not None:
        must.append(_eq("scope.agent_id", scope.agent_id))
    if statuses is not None:
        values = sorted({Status(s).value for s in statuses})
        must.append(models.FieldCondition(key="status", match=models.MatchAny(any=values)))
    for key, value in (where or {}).items():
        if key in IDENTITY_KEYS or key.split(".")[0] in IDENTITY_KEYS:
            raise ScopeError(f"{key!r} is an identity key: pass it in the Scope, not as a filter")
        if key not in FILTERABLE_KEYS:
            raise ScopeError(f"cannot filter on {key!r}; allowed: {sorted(FILTERABLE_KEYS)}")
        must.append(_eq(key, value))
    return models.Filter(must=must)


def group_filter(scope: Scope, *, users: Collection[str] | None, subjects: Collection[str]) -> models.Filter:
    """Every item (any status) of ``scope``'s tenant whose user is one of ``users`` (None: items
    without a user) and whose subject is one of ``subjects``: the supersession groups touched by a batch.

    Built on :func:`scope_filter` (so the tenant condition comes first); ``scope.user_id`` is ignored.

    Raises:
        ScopeError: ``scope`` is not a :class:`Scope`.
    """
    flt = scope_filter(Scope(scope.tenant_id) if isinstance(scope, Scope) else scope, statuses=None,
                       user_exact=users is None)
    if users is not None:
        flt.must.append(models.FieldCondition(key="scope.user_id", match=models.MatchAny(any=sorted(users))))
    flt.must.append(models.FieldCondition(key="subject", match=models.MatchAny(any=sorted(subjects))))
    return flt


def _eq(key: str, value: str) -> models.FieldCondition:
    return models.FieldCondition(key=key, match=models.MatchValue(value=value))

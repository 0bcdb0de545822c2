"""Upcasters: semantic changes between envelope versions, applied in order on read.

Avro schema resolution handles *structure* (renamed fields via aliases, added fields via
defaults, int → long promotion). What it cannot see is a change of *meaning* under the same
bytes; that is what an upcaster fixes.

The record an upcaster gets has already been resolved by fastavro to the **current** reader
schema (field names of today), with ``type`` as the enum symbol (``str``) and ``payload`` as a
plain dict. ``upcast_vN_to_vN1`` turns the *meaning* of a version-N record into version N+1's.
If a later version renames a field an older upcaster touches, update that upcaster's field
name (the golden v1 fixture test fails until you do).

Every step ``N → N+1`` must have an entry in :data:`UPCASTERS`, even when nothing changed
in meaning (use :func:`no_semantic_change`); a test enforces it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runjournal.schemas.errors import UnsupportedSchemaError

__all__ = ["UPCASTERS", "Upcaster", "no_semantic_change", "upcast", "upcast_v1_to_v2"]

#: A record in the current reader shape → the same record with the next version's meaning.
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

_ZERO_BASED_ATTEMPT_V1 = frozenset({"NODE_STARTED", "TOOL_CALL_INTENDED"})


def upcast_v1_to_v2(record: dict[str, Any]) -> dict[str, Any]:
    """Envelope v1 → v2 meaning.

    * ``attempt`` (NODE_STARTED, TOOL_CALL_INTENDED) was 0-based in v1; v2 counts from 1.
    * TOOL_CALL_INTENDED ``timeout_s`` (whole seconds, v1) arrives as ``timeout_ms`` through
      the Avro alias but still holds seconds; v2 holds milliseconds, so × 1000.

    The v1 ``instance_id`` → v2 ``producer_id`` rename and the new ``traceparent`` (null) are
    structural and already done by Avro resolution.

    Args:
        record: envelope dict resolved to the current schema (``type`` a symbol, ``payload`` a dict).

    Returns:
        The same dict, mutated in place.
    """
    symbol = record["type"]
    payload = record["payload"]
    if symbol in _ZERO_BASED_ATTEMPT_V1:
        payload["attempt"] += 1
    if symbol == "TOOL_CALL_INTENDED":
        payload["timeout_ms"] *= 1000
    return record


def no_semantic_change(record: dict[str, Any]) -> dict[str, Any]:
    """The upcaster of a version step that changed structure only: returns ``record`` unchanged."""
    return record


#: ``from_version → upcaster to from_version + 1``.
UPCASTERS: dict[int, Upcaster] = {
    1: upcast_v1_to_v2,
    2: no_semantic_change,  # v3 adds APPROVAL_REQUESTED scope_call_id / scope_attempt (null for older writers)
    3: no_semantic_change,  # v4 adds APPROVAL_REQUESTED args_json (null for older writers)
    4: no_semantic_change,  # v5 adds RUN_RESUMED requested_by / request_reason / request_id / paused, RUN_CANCELLED
    #                         requested_by / request_id (null / false for older writers: no operator asked)
}


def upcast(record: dict[str, Any], from_version: int, to_version: int) -> dict[str, Any]:
    """Apply ``UPCASTERS[from_version] … UPCASTERS[to_version - 1]`` in order.

    Args:
        record: envelope dict already resolved to the ``to_version`` schema.
        from_version: the writer's envelope version.
        to_version: the reader's (current) envelope version.

    Returns:
        The record with the current meaning.

    Raises:
        UnsupportedSchemaError: a step has no upcaster (a version added without one).
    """
    for version in range(from_version, to_version):
        step = UPCASTERS.get(version)
        if step is None:
            raise UnsupportedSchemaError(f"no upcaster from envelope v{version} to v{version + 1}")
        record = step(record)
    return record

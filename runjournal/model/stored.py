"""A run's state as the fields of one Redis hash: a scalar field, then one field per entry of its growing maps.

The projection keeps each run in a hash ``rj:{P.p}:run:<run_id>`` (docs/design/protocol.md § Projector,
docs/design/decisions/0051-a-hash-per-run.md) so a batch writes only what it changed, not the whole run:

* ``s`` — the run's scalar summary: every field of :class:`~runjournal.model.reducer.RunState` but the growing maps
  and the large values, as a JSON object with the format version ``v`` (the same names and values as
  :meth:`RunState.to_json`);
* ``x:<name>`` — one large value that rarely changes (:data:`LARGE_FIELDS`: the run's input, output, plan nodes and
  the plan a RUN_RESUMED handed over, which lists every call of the run), as JSON; written only when it changed;
* ``r:<call_id>`` — one execution record, ``n:<node_path>`` — one node, ``a:<call_id>`` — one approval decision,
  ``p:<call_id>`` — one pending approval: each the JSON object of the entry (the one :meth:`RunState.to_json` nests).

A field name is a one-letter prefix, ``:`` and the raw id (UTF-8): ids may hold any character
(docs/reference/identifiers.md), but the name splits at its first ``:``, so one name is never two fields.

This module converts only (no I/O): :func:`state_fields` (every field), :func:`field_diff` (the fields a state's
successor changed, in O(changes) for states the reducer derived one from the other) and :func:`state_from_fields`.
The canonical JSON and digest (:meth:`RunState.to_json`, :func:`state_digest`) are not affected by the layout.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import orjson

from runjournal.model.pmap import PMap
from runjournal.model.reducer import (
    STATE_FORMAT_VERSION,
    RunState,
    StateFormatError,
    state_from_dict,
)

__all__ = ["LARGE_FIELDS", "MAP_PREFIXES", "SCALAR_FIELD", "field_diff", "scalar_json", "state_fields",
           "state_from_fields"]

SCALAR_FIELD = b"s"
"""The hash field holding the run's scalar summary (JSON)."""

MAP_PREFIXES: dict[str, bytes] = {"records": b"r:", "nodes": b"n:", "approvals": b"a:", "pending_approvals": b"p:"}
"""Mapping field of :class:`RunState` -> the prefix of its entries' hash field names."""
_BY_PREFIX = {prefix[:1]: name for name, prefix in MAP_PREFIXES.items()}

LARGE_FIELDS: dict[str, bytes] = {name: b"x:" + name.encode() for name in
                                  ("input_json", "output_json", "plan_json", "plan_nodes")}
"""Fields of :class:`RunState` kept out of ``s`` (each may be large and rarely changes) -> their hash field name."""
_LARGE_BY_FIELD = {field: name for name, field in LARGE_FIELDS.items()}


def _dumps(value: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:  # an int beyond 64 bits (the Avro decoder gives none): the json module's form
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def scalar_json(state: RunState) -> bytes:
    """The ``s`` field of ``state``: its fields but the growing maps, with ``v``, as sorted compact JSON (UTF-8).

    Raises:
        UnicodeEncodeError: a string holds a lone surrogate (never so for decoded events).
    """
    out = dict(state.__dict__)
    for name in MAP_PREFIXES:
        del out[name]
    for name in LARGE_FIELDS:
        del out[name]
    out["v"] = STATE_FORMAT_VERSION
    return _dumps(out)


def _large(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False).encode("utf-8")


def state_fields(state: RunState) -> dict[bytes, bytes]:
    """Every hash field of ``state``: ``s`` and one field per map entry (O(size of the run)).

    Raises:
        UnicodeEncodeError: a string holds a lone surrogate.
    """
    out = {SCALAR_FIELD: scalar_json(state)}
    for name, field in LARGE_FIELDS.items():
        out[field] = _large(getattr(state, name))
    for name, prefix in MAP_PREFIXES.items():
        for key, value in getattr(state, name).items():
            out[prefix + key.encode("utf-8")] = _dumps(value.__dict__)
    return out


def field_diff(before: RunState, after: RunState) -> tuple[dict[bytes, bytes], list[bytes]]:
    """The hash fields to set and to remove to turn ``before``'s hash into ``after``'s.

    ``s`` is always set; a large value (:data:`LARGE_FIELDS`) when it is not the same object. Map entries are
    found by :meth:`PMap.changed_since`: O(changes) when the reducer derived
    ``after`` from ``before`` (the projector's batches), else a scan of the maps by identity (never wrong).

    Returns:
        ``(field -> value to set, fields to delete)``.

    Raises:
        UnicodeEncodeError: a string holds a lone surrogate.
    """
    sets = {SCALAR_FIELD: scalar_json(after)}
    dels: list[bytes] = []
    for name, field in LARGE_FIELDS.items():
        value = getattr(after, name)
        if value is not getattr(before, name):
            sets[field] = _large(value)
    for name, prefix in MAP_PREFIXES.items():
        new, old = getattr(after, name), getattr(before, name)
        if new is old:
            continue
        changed = new.changed_since(old) if isinstance(new, PMap) else set(new) | set(old)
        for key in changed:
            field = prefix + key.encode("utf-8")
            value = new.get(key)
            if value is None:
                dels.append(field)
            else:
                sets[field] = _dumps(value.__dict__)
    return sets, dels


def state_from_fields(fields: Mapping[bytes, bytes]) -> RunState:
    """The state a hash holds (as HGETALL returns it: field -> value, bytes).

    Raises:
        StateFormatError: no ``s`` field, a large value missing, an unknown field, not JSON, another format version, or
            unknown/missing/ill-typed fields.
    """
    try:
        scalar = fields.get(SCALAR_FIELD)
        if scalar is None:
            raise StateFormatError(f"run state hash has no {SCALAR_FIELD.decode()!r} field")
        data = orjson.loads(scalar)
        if not isinstance(data, dict):
            raise StateFormatError("run state hash field 's' is not a JSON object")
        maps: dict[str, dict[str, Any]] = {name: {} for name in MAP_PREFIXES}
        for field, value in fields.items():
            if field == SCALAR_FIELD:
                continue
            large = _LARGE_BY_FIELD.get(field)
            if large is not None:
                data[large] = orjson.loads(value)
                continue
            name = _BY_PREFIX.get(field[:1]) if field[1:2] == b":" else None
            if name is None:
                raise StateFormatError(f"run state hash has an unknown field {field[:40]!r}")
            maps[name][field[2:].decode("utf-8")] = orjson.loads(value)
        missing = [name for name in LARGE_FIELDS if name not in data]
        if missing:
            raise StateFormatError(f"run state hash lacks the fields of {missing}")
        data.update(maps)
        return state_from_dict(data)
    except StateFormatError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise StateFormatError(f"cannot read run state hash: {exc}") from exc

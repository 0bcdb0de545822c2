"""A run's state (:class:`RunState`), its canonical JSON and the state digest.

Everything here is a frozen dataclass treated as immutable. Mapping fields are plain
``dict`` objects for speed and JSON, typed :class:`~collections.abc.Mapping`: they are never
mutated after construction; the reducer copies-on-write only the one mapping an event changes
(no deep copies per event). Public names are re-exported by :mod:`runjournal.model.reducer`.

Times are integers in **milliseconds since the Unix epoch, UTC** (``*_ms``); offsets are Kafka
partition offsets of ``runjournal.events`` (DESIGN.md § Topic layout).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, TypeVar

import orjson

from runjournal.model._records import (
    ApprovalDecision,
    CallStatus,
    Decision,
    ExecutionRecord,
    NodeState,
    NodeStatus,
    PendingApproval,
    ReconciledOutcome,
    RunStatus,
    StateFormatError,
)

__all__ = ["STATE_FORMAT_VERSION", "RunState", "state_digest"]

#: Version of the JSON produced by :meth:`RunState.to_json`; :meth:`RunState.from_json` refuses others.
STATE_FORMAT_VERSION = 1

_T = TypeVar("_T")


@dataclass(frozen=True)
class RunState:
    """One run's state, folded from its events by :func:`runjournal.model.reducer.apply`.

    Serialise with :meth:`to_json` (canonical: compact, sorted keys) and compare with
    :func:`state_digest`. Mapping fields are read-only by convention (see module docstring).
    """

    run_id: str
    """The run."""
    tenant_id: str | None
    """Owning tenant (None only for a run known solely from a quarantined, undecodable record)."""
    status: RunStatus
    """Where the run stands."""
    epoch: int = 0
    """Ownership epoch: 1 at RUN_STARTED, raised by each accepted RUN_RESUMED; 0 = none established."""
    last_seq: int = 0
    """Seq of the last event that consumed a seq (0 = none); the next must be ``last_seq + 1``."""
    applied_partition: int = -1
    """Partition of the last event processed for this run (-1 = none)."""
    applied_offset: int = -1
    """Offset of that event; anything at or below it in the same partition is skipped (-1 = none)."""
    owner: str | None = None
    """``producer_id`` of the current epoch's writer (RUN_STARTED writer, or RUN_RESUMED ``assigned_to``)."""
    agent: str | None = None
    """RUN_STARTED ``agent``."""
    user_id: str | None = None
    """RUN_STARTED ``user_id``, when given."""
    input_json: str | None = None
    """RUN_STARTED ``input_json`` (the run's input as JSON text)."""
    plan_hash: str | None = None
    """PLAN_COMPILED ``plan_hash``."""
    code_version: str | None = None
    """PLAN_COMPILED ``code_version``."""
    plan_nodes: tuple[str, ...] = ()
    """PLAN_COMPILED ``nodes``: node paths in plan order."""
    plan_json: str | None = None
    """The plan handed over by the last RUN_RESUMED (``plan_json``)."""
    nodes: Mapping[str, NodeState] = field(default_factory=dict)
    """node_path -> latest node state."""
    pending_approvals: Mapping[str, PendingApproval] = field(default_factory=dict)
    """call_id -> approval requested and not decided."""
    approvals: Mapping[str, ApprovalDecision] = field(default_factory=dict)
    """call_id -> latest approval decision."""
    records: Mapping[str, ExecutionRecord] = field(default_factory=dict)
    """call_id -> execution record."""
    rejected_stale_epoch: int = 0
    """Control-flow events from a lower epoch rejected by epoch fencing (count)."""
    rejected_after_terminal: int = 0
    """Control-flow events of the run's epoch that arrived after a terminal event and were ignored."""
    duplicates_ignored: int = 0
    """Redelivered events (same event_id, new offset) ignored (count)."""
    skipped_while_parked: int = 0
    """Events skipped because the run was parked (GAP/BLOCKED) (count)."""
    unknown_events: Mapping[str, int] = field(default_factory=dict)
    """Events of a type this reader does not know (decoded as UNKNOWN), recorded and passed over:
    the writer's type symbol -> count. A newer writer's event; never acted on (DESIGN.md § Schema
    evolution). Absent from states written before it existed (read as empty)."""
    gap_expected_seq: int | None = None
    """GAP: the seq the run was waiting for."""
    gap_seen_seq: int | None = None
    """GAP: the seq that arrived instead."""
    gap_reason: str | None = None
    """GAP: a sentence saying what was seen (gap, reorder/conflict, epoch ahead, no RUN_STARTED)."""
    blocked_reason: str | None = None
    """BLOCKED: why the run's event could not be interpreted (with its offset)."""
    started_at_ms: int | None = None
    """RUN_STARTED ``occurred_at``, ms since epoch UTC."""
    updated_at_ms: int | None = None
    """``occurred_at`` of the last in-sequence event that changed execution state, ms since epoch UTC."""
    finished_at_ms: int | None = None
    """``occurred_at`` of the terminal event, ms since epoch UTC."""
    output_json: str | None = None
    """RUN_SUCCEEDED ``output_json``."""
    error: str | None = None
    """RUN_FAILED ``error`` or RUN_CANCELLED ``reason``."""
    recent_event_ids: tuple[str, ...] = ()
    """event_ids of the last processed events, oldest first, bounded (duplicate detection window)."""

    @property
    def parked(self) -> bool:
        """True when the run is GAP or BLOCKED."""
        return self.status is RunStatus.GAP or self.status is RunStatus.BLOCKED

    @property
    def terminal(self) -> bool:
        """True when the run is SUCCEEDED, FAILED or CANCELLED."""
        return self.status in _TERMINAL

    def to_json(self) -> str:
        """The canonical JSON text of this state: compact, keys sorted, enums as their names.

        Returns:
            ``str``; equal states give equal text, so a hash over it is deterministic.
        """
        data = _state_to_dict(self)
        try:
            return orjson.dumps(data, option=orjson.OPT_SORT_KEYS).decode("utf-8")
        except orjson.JSONEncodeError:
            return _canonical_json(data)

    def to_json_bytes(self) -> bytes:
        """:meth:`to_json` encoded UTF-8, as stored in Redis (no str round trip).

        Written by orjson with sorted keys: byte for byte what ``json.dumps(sort_keys=True,
        separators=(",", ":"), ensure_ascii=False)`` writes (``tests/test_state_json.py``), ~3x faster.
        A value orjson refuses (an int beyond 64 bits; the Avro decoder gives none) goes through
        :mod:`json` with the same options.

        Raises:
            UnicodeEncodeError: a string holds a lone surrogate (never so for decoded events).
        """
        data = _state_to_dict(self)
        try:
            return orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:
            return _canonical_json(data).encode("utf-8")

    @classmethod
    def from_json(cls, text: str | bytes) -> RunState:
        """Read a state written by :meth:`to_json`.

        Args:
            text: the JSON text (or UTF-8 bytes, as read from Redis).

        Returns:
            The :class:`RunState`; ``from_json(s.to_json()) == s``.

        Raises:
            StateFormatError: not JSON, another format version, or unknown/missing/ill-typed fields.
        """
        try:
            data = orjson.loads(text)
            return _state_from_dict(data)
        except StateFormatError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise StateFormatError(f"cannot read run state JSON: {exc}") from exc


_TERMINAL = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED})


def _canonical_json(data: dict[str, Any]) -> str:
    """The reference form :meth:`RunState.to_json` matches byte for byte (and falls back to)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def state_digest(state: RunState) -> str:
    """sha256 (hex, 64 chars) of ``state.to_json()`` encoded UTF-8: equal states, equal digests."""
    return hashlib.sha256(state.to_json_bytes()).hexdigest()


# --------------------------------------------------------------------------- JSON codec

_VALUE_TYPES: tuple[type, ...] = (NodeState, PendingApproval, ApprovalDecision, ExecutionRecord)
_FIELD_NAMES: dict[type, frozenset[str]] = {
    cls: frozenset(f.name for f in fields(cls)) for cls in (*_VALUE_TYPES, RunState)
}
_ENUM_FIELDS: dict[type, dict[str, type[StrEnum]]] = {
    NodeState: {"status": NodeStatus},
    PendingApproval: {},
    ApprovalDecision: {"decision": Decision},
    ExecutionRecord: {"status": CallStatus, "reconciled_outcome": ReconciledOutcome},
    RunState: {"status": RunStatus},
}
_ENUM_LOOKUP: dict[type, dict[str, dict[str, StrEnum]]] = {
    cls: {name: {member.value: member for member in enum} for name, enum in enums.items()}
    for cls, enums in _ENUM_FIELDS.items()
}
_MAPPING_FIELDS: dict[str, type] = {
    "nodes": NodeState,
    "pending_approvals": PendingApproval,
    "approvals": ApprovalDecision,
    "records": ExecutionRecord,
}
_TUPLE_FIELDS = ("plan_nodes", "recent_event_ids")


#: Fields added to RunState after format 1 with their default: a state JSON written before has none.
_ADDED_FIELDS: dict[str, Any] = {"unknown_events": dict}


def _check_keys(cls: type, data: Mapping[str, Any]) -> None:
    expected = _FIELD_NAMES[cls]
    if data.keys() != expected:
        missing, unknown = sorted(expected - data.keys()), sorted(data.keys() - expected)
        raise StateFormatError(f"{cls.__name__} JSON: missing fields {missing}, unknown fields {unknown}")


def _build(cls: type[_T], data: dict[str, Any]) -> _T:
    """An instance of frozen dataclass ``cls`` from a fresh JSON object (enum names looked up; a
    bad name raises KeyError). Skips ``__init__``: this is the projector's per-batch hot path."""
    _check_keys(cls, data)
    for name, by_value in _ENUM_LOOKUP[cls].items():
        value = data[name]
        if value is not None:
            data[name] = by_value[value]
    obj = object.__new__(cls)
    object.__setattr__(obj, "__dict__", data)  # the fresh dict itself (see _records.with_changes)
    return obj


def _state_to_dict(state: RunState) -> dict[str, Any]:
    out: dict[str, Any] = dict(state.__dict__)
    for name in _MAPPING_FIELDS:
        out[name] = {key: value.__dict__ for key, value in out[name].items()}
    out["v"] = STATE_FORMAT_VERSION
    return out


def _state_from_dict(data: Any) -> RunState:
    if not isinstance(data, dict):
        raise StateFormatError(f"run state JSON must be an object, got {type(data).__name__}")
    version = data.pop("v", None)
    if version != STATE_FORMAT_VERSION:
        raise StateFormatError(f"run state format version {version!r} is not {STATE_FORMAT_VERSION}")
    for name, factory in _ADDED_FIELDS.items():
        if name not in data:
            data[name] = factory()
    _check_keys(RunState, data)
    for name, cls in _MAPPING_FIELDS.items():
        data[name] = {key: _build(cls, value) for key, value in data[name].items()}
    for name in _TUPLE_FIELDS:
        data[name] = tuple(data[name])
    return _build(RunState, data)

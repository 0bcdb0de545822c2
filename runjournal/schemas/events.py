"""The decoded shape of a journal event: the contract between codec, producers and consumers.

Every service works on :class:`Event` (the *current* shape, after upcasting). The Avro
schemas under ``schemas/avro/`` are the wire form of the same thing; ``runjournal.schemas.codec``
converts between the two. Nothing here does I/O (bar reading ``os.urandom`` for event ids).

Rules (docs/design/protocol.md § Events):

* ``event_id`` is fixed before the first send attempt, so a retried send is the same event.
* ``seq`` is per run, starts at 1, strictly increasing, and continues across resumes.
* ``epoch`` is the run's ownership epoch: 1 at RUN_STARTED, bumped by every RUN_RESUMED.
* ``occurred_at`` is timezone-aware; a naive datetime is refused (:class:`NaiveDatetimeError`).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from runjournal.schemas.errors import SchemaError
from runjournal.schemas.keys import event_key

__all__ = [
    "CONTROL_FLOW_TYPES",
    "DURABLE_TYPES",
    "KNOWN_TYPES",
    "PAYLOAD_FIELDS",
    "Event",
    "EventType",
    "NaiveDatetimeError",
    "new_event_id",
    "utcnow",
]


class EventType(StrEnum):
    """Past-tense facts a run can publish. Order is the Avro enum's symbol order (append only).

    ``UNKNOWN`` is read-only: the wire enum's ``default`` symbol, which an older reader maps a
    newer writer's type symbol to. The codec decodes such a record as an ``UNKNOWN`` event whose
    payload is ``{"type": <the writer's symbol>, "fields": {<the writer's payload>}}``; the reducer
    records it without acting on it (unless declared critical). ``encode`` refuses it: a writer
    never writes ``UNKNOWN``. :data:`KNOWN_TYPES` is every other member.
    """

    RUN_STARTED = "RUN_STARTED"
    PLAN_COMPILED = "PLAN_COMPILED"
    NODE_STARTED = "NODE_STARTED"
    NODE_SUCCEEDED = "NODE_SUCCEEDED"
    NODE_FAILED = "NODE_FAILED"
    TOOL_CALL_INTENDED = "TOOL_CALL_INTENDED"
    TOOL_CALL_COMMITTED = "TOOL_CALL_COMMITTED"
    TOOL_CALL_FAILED = "TOOL_CALL_FAILED"
    TOOL_CALL_RECONCILED = "TOOL_CALL_RECONCILED"
    APPROVAL_REQUESTED = "APPROVAL_REQUESTED"
    APPROVAL_GRANTED = "APPROVAL_GRANTED"
    APPROVAL_DENIED = "APPROVAL_DENIED"
    RUN_RESUMED = "RUN_RESUMED"
    RUN_SUCCEEDED = "RUN_SUCCEEDED"
    RUN_FAILED = "RUN_FAILED"
    RUN_CANCELLED = "RUN_CANCELLED"
    USER_CORRECTION = "USER_CORRECTION"
    MESSAGE = "MESSAGE"
    UNKNOWN = "UNKNOWN"


#: Every type a writer may publish (all but the read-only ``UNKNOWN``), in the wire enum's order.
KNOWN_TYPES: tuple[EventType, ...] = tuple(t for t in EventType if t is not EventType.UNKNOWN)


#: Events whose publish is always awaited (broker ack) before the program moves on:
#: the two around a side effect (docs/design/protocol.md § The side-effect protocol) plus approval
#: decisions and the run's terminal events.
DURABLE_TYPES: frozenset[EventType] = frozenset(
    {
        EventType.TOOL_CALL_INTENDED,
        EventType.TOOL_CALL_COMMITTED,
        EventType.TOOL_CALL_FAILED,
        EventType.TOOL_CALL_RECONCILED,
        EventType.APPROVAL_REQUESTED,
        EventType.APPROVAL_GRANTED,
        EventType.APPROVAL_DENIED,
        EventType.RUN_RESUMED,
        EventType.RUN_SUCCEEDED,
        EventType.RUN_FAILED,
        EventType.RUN_CANCELLED,
    }
)

#: Events that steer a run. After RUN_RESUMED(epoch n) these are rejected from a lower
#: epoch (a zombie). TOOL_CALL_COMMITTED / TOOL_CALL_FAILED / TOOL_CALL_RECONCILED are
#: *not* control flow: they report an effect that happened and are always recorded; nor is
#: UNKNOWN (this reader cannot tell what it steers; the reducer records it, see runjournal.model).
CONTROL_FLOW_TYPES: frozenset[EventType] = frozenset(
    set(KNOWN_TYPES)
    - {
        EventType.TOOL_CALL_COMMITTED,
        EventType.TOOL_CALL_FAILED,
        EventType.TOOL_CALL_RECONCILED,
        EventType.MESSAGE,
        EventType.USER_CORRECTION,
    }
)

# Payload fields of the current schema version, per type: name -> (python type, required).
# Optional fields default to None. JSON-bearing fields are strings holding JSON text.
_S, _I, _B = str, int, bool
_TOOL = {"call_id": (_S, True), "tool": (_S, True), "idempotency_key": (_S, True), "args_digest": (_S, True)}
PAYLOAD_FIELDS: dict[EventType, dict[str, tuple[type, bool]]] = {
    EventType.RUN_STARTED: {"agent": (_S, True), "input_json": (_S, True), "user_id": (_S, False),
                            "forked_from": (_S, False), "forked_at_seq": (_I, False), "fork_lineage": (list, False),
                            "requested_by": (_S, False), "request_reason": (_S, False)},  # fork: v5
    EventType.PLAN_COMPILED: {"plan_hash": (_S, True), "code_version": (_S, True), "nodes": (list, True)},
    EventType.NODE_STARTED: {"node_path": (_S, True), "attempt": (_I, True)},
    EventType.NODE_SUCCEEDED: {"node_path": (_S, True), "output_digest": (_S, False)},
    EventType.NODE_FAILED: {"node_path": (_S, True), "error": (_S, True), "retryable": (_B, True)},
    EventType.TOOL_CALL_INTENDED: {
        **_TOOL,
        "side_effect": (_B, True),
        "attempt": (_I, True),
        "timeout_ms": (_I, True),
        "args_json": (_S, False),
    },
    EventType.TOOL_CALL_COMMITTED: {
        **_TOOL,
        "result_json": (_S, False),
        "result_ref": (_S, False),
        "result_digest": (_S, True),
    },
    EventType.TOOL_CALL_FAILED: {**_TOOL, "error": (_S, True), "retryable": (_B, True)},
    EventType.TOOL_CALL_RECONCILED: {
        **_TOOL,
        "outcome": (_S, True),  # "COMMITTED" | "NOT_EXECUTED" | "FAILED"
        "result_json": (_S, False),
        "result_ref": (_S, False),
        "result_digest": (_S, False),
    },
    EventType.APPROVAL_REQUESTED: {"call_id": (_S, True), "reason": (_S, True), "tool": (_S, False),
                                   "scope_call_id": (_S, False), "scope_attempt": (_I, False),  # scope: v3
                                   "args_json": (_S, False)},  # the call's arguments: v4
    EventType.APPROVAL_GRANTED: {"call_id": (_S, True), "approver": (_S, True), "comment": (_S, False)},
    EventType.APPROVAL_DENIED: {"call_id": (_S, True), "approver": (_S, True), "reason": (_S, False)},
    EventType.RUN_RESUMED: {
        "previous_epoch": (_I, True),
        "recovered_by": (_S, True),
        "plan_json": (_S, True),
        "assigned_to": (_S, False),
        "requested_by": (_S, False),  # v5: an operator's resume or pause (docs/design/decisions/0047)
        "request_reason": (_S, False),
        "request_id": (_S, False),
        "paused": (_B, False),  # v5: held by nobody until resumed (None: not paused)
        "resume_at_ms": (_I, False),  # v5: a held run's wake-up time (Redis's clock), ms since the epoch
        "waiting_for": (_S, False),  # v5: the signal a held run waits for
    },
    EventType.RUN_SUCCEEDED: {"output_json": (_S, False)},
    EventType.RUN_FAILED: {"error": (_S, True)},
    EventType.RUN_CANCELLED: {"reason": (_S, True), "requested_by": (_S, False), "request_id": (_S, False)},  # v5
    EventType.USER_CORRECTION: {"subject": (_S, True), "text": (_S, True), "user_id": (_S, False)},
    EventType.MESSAGE: {"role": (_S, True), "content": (_S, True), "user_id": (_S, False)},
}


class NaiveDatetimeError(SchemaError, ValueError):
    """``occurred_at`` had no tzinfo; it would be read in the host's zone. Pass an aware datetime.

    A :class:`~runjournal.schemas.errors.SchemaError` (so a codec caller catches one base) and still a ValueError.
    """


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_now: tuple[int, datetime] = (0, _EPOCH)
"""The last millisecond :func:`utcnow` saw and its datetime (swapped as one tuple: safe across threads)."""


def utcnow() -> datetime:
    """Now, timezone-aware UTC (``tzinfo`` is ``datetime.UTC``), truncated to milliseconds (Avro timestamp-millis).

    Read from ``time.time_ns()`` (the clock ``datetime.now`` reads). Calls within one millisecond return the same
    datetime object (immutable): ~0.1 µs instead of ~1.4 µs for ``datetime.now(UTC)`` and truncation, and the
    codec writes a timestamp it has just written from its cache.
    """
    global _now
    ms = time.time_ns() // 1_000_000
    last = _now
    if last[0] == ms:
        return last[1]
    at = _EPOCH + timedelta(milliseconds=ms)
    _now = (ms, at)
    return at


_IDS_PER_DRAW = 256
_ID_TEXT = b"00000000-0000-4000-8000-000000000000,"  # a canonical uuid4 and a separator, per id
_ID_HEX_AT = tuple(i for i, c in enumerate(_ID_TEXT[:36]) if c != ord("-") and i != 14)  # 31: all but the version
_ID_VARIANT_AT = 19
_VARIANT = bytes.maketrans(b"0123456789abcdef", b"89ab89ab89ab89ab")  # a random hex digit's low 2 bits -> 10xx
_EXHAUSTED: tuple[list[str], Iterator[int]] = ([], itertools.count(_IDS_PER_DRAW))


def _draw_ids() -> tuple[list[str], Iterator[int]]:
    """256 fresh uuid4 texts from one ``os.urandom`` read, and a counter handing out their indexes.

    Every id gets 31 random hex digits at the 31 positions of the text other than the version digit ``4``
    (bytewise column assignment, no per-id Python work); the one at the variant position is mapped to 8/9/a/b.
    That is 30 x 4 + 2 = 122 random bits, the bits a uuid4 has.
    """
    hexed = os.urandom(16 * _IDS_PER_DRAW).hex().encode("ascii")
    text = bytearray(_ID_TEXT * _IDS_PER_DRAW)
    stride = len(_ID_TEXT)
    for digit, at in enumerate(_ID_HEX_AT):
        column = hexed[digit::32]
        text[at::stride] = column.translate(_VARIANT) if at == _ID_VARIANT_AT else column
    return text[:-1].decode("ascii").split(","), itertools.count()


_ids = _EXHAUSTED
"""The current draw: ``(ids, counter)``. ``next(counter)`` is atomic, so no index is handed out twice, from any
thread; a thread finding the draw used up installs a new one (a race only discards unused ids)."""


def _forget_ids() -> None:
    global _ids
    _ids = _EXHAUSTED  # a forked child must never hand out the ids its parent still holds


os.register_at_fork(after_in_child=_forget_ids)


def new_event_id() -> str:
    """A fresh event id: a uuid4 in canonical text form (36 chars, lower-case hex, version 4, RFC 4122 variant).

    From ``os.urandom`` (the source ``uuid.uuid4`` reads), 256 ids per read: ~0.3 µs instead of ~3 µs for
    ``str(uuid.uuid4())``. A forked child starts a draw of its own.
    """
    global _ids
    while True:
        ids, taken = _ids
        index = next(taken)
        if index < _IDS_PER_DRAW:
            return ids[index]
        _ids = _draw_ids()


_NO_PAYLOAD: Any = object()  # "payload not given" (an explicit None is kept, as a default_factory field keeps it)


@dataclass(frozen=True, slots=True, init=False)
class Event:
    """One immutable journal fact, in the current schema's shape.

    Construct it by keyword or position (the fields' order); ``payload`` defaults to a new empty dict,
    ``node_id`` and ``traceparent`` to None; a ``type`` given as its symbol text becomes the EventType.

    Raises:
        NaiveDatetimeError: ``occurred_at`` has no timezone.
        ValueError: ``type`` is no EventType symbol.
    """

    event_id: str
    """uuid4 text; fixed before the first send attempt (a retry is the same event)."""
    run_id: str
    """The run this fact belongs to; also the partitioning key."""
    tenant_id: str
    """Owning tenant; memory and every search are scoped by it."""
    seq: int
    """Per-run sequence number, 1-based, strictly increasing across resumes."""
    epoch: int
    """Run ownership epoch: 1 at start, +1 per RUN_RESUMED."""
    producer_id: str
    """The agent instance that wrote it (also the base of its transactional.id)."""
    type: EventType
    """What happened."""
    occurred_at: datetime
    """When, timezone-aware (stored as timestamp-millis UTC)."""
    payload: dict[str, Any] = field(default_factory=dict)
    """Typed fields for ``type``; see :data:`PAYLOAD_FIELDS`. Absent optional fields are None.
    For ``UNKNOWN``: ``{"type": <writer's symbol>, "fields": <writer's payload dict>}``."""
    node_id: str | None = None
    """Node path within the run's plan, when the event belongs to a node."""
    traceparent: str | None = None
    """W3C trace context of the writer, when one was active (envelope v2+)."""

    def __init__(
        self,
        event_id: str,
        run_id: str,
        tenant_id: str,
        seq: int,
        epoch: int,
        producer_id: str,
        type: EventType,
        occurred_at: datetime,
        payload: dict[str, Any] = _NO_PAYLOAD,
        node_id: str | None = None,
        traceparent: str | None = None,
    ) -> None:
        # What the generated frozen __init__ + __post_init__ did, at ~half the cost (every event is built on the
        # publish path and again on every decode): the slots are set through their descriptors directly, as
        # object.__setattr__ would after looking them up.
        zone = occurred_at.tzinfo
        if zone is not UTC and (zone is None or occurred_at.utcoffset() is None):
            raise NaiveDatetimeError(
                f"occurred_at must be timezone-aware (got naive {occurred_at!r}) for event {event_id}"
            )
        _set_event_id(self, event_id)
        _set_run_id(self, run_id)
        _set_tenant_id(self, tenant_id)
        _set_seq(self, seq)
        _set_epoch(self, epoch)
        _set_producer_id(self, producer_id)
        _set_type(self, type if type.__class__ is EventType else EventType(type))
        _set_occurred_at(self, occurred_at)
        _set_payload(self, {} if payload is _NO_PAYLOAD else payload)
        _set_node_id(self, node_id)
        _set_traceparent(self, traceparent)

    @property
    def key(self) -> str:
        """The Kafka record key: ``{run_id}:{epoch}:{seq}`` (unique per event; :mod:`runjournal.schemas.keys`)."""
        return event_key(self.run_id, self.epoch, self.seq)


(_set_event_id, _set_run_id, _set_tenant_id, _set_seq, _set_epoch, _set_producer_id, _set_type, _set_occurred_at,
 _set_payload, _set_node_id, _set_traceparent) = (Event.__dict__[f.name].__set__ for f in fields(Event))

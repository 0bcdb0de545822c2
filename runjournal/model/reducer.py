"""The pure run reducer: ``apply(state, event) -> state``. No I/O, no Kafka, no Redis.

Used by the projector (folds batches into Redis), the recovery job (folds the partition tail
onto a Redis snapshot, then classifies tool calls), ``replay`` (fold up to a seq) and ``inspect``.
docs/design/protocol.md § Projector, § Zombies, § Recovery job, § The side-effect protocol.

Rules, checked in this order for each event (``state`` of the event's run, ``(partition, offset)``
of the event's record):

1. **Position.** An event at or below ``state.applied_offset`` in ``state.applied_partition``
   is a no-op and returns ``state`` itself: a redelivered batch changes nothing. Every other
   event advances the run's ``(applied_partition, applied_offset)``, even when ignored.
2. **First event.** With no state, only RUN_STARTED at seq 1 starts a run (epoch must be 1).
   Anything else gives a GAP state expecting seq 1: history is never invented.
3. **Parked.** A GAP or BLOCKED run takes nothing more (``skipped_while_parked += 1``). The
   skipped facts stay in the topic; the run is repaired by rebuilding it from the topic after the
   cause is fixed. Recovery must not classify a parked run's calls from its snapshot.
4. **Duplicate.** An ``event_id`` among the last :data:`DUPLICATE_WINDOW` processed ids is a
   redelivery (retried send at a new offset): ``duplicates_ignored += 1``, nothing else. A copy
   arriving more than that many events after its original is indistinguishable from a second
   event claiming a used seq and parks the run (rule 6): visible, never silently wrong.
5. **Epoch fencing, before seq** (§ Zombies). ``event.epoch < state.epoch``: the writer is a
   zombie. Control-flow types (``CONTROL_FLOW_TYPES``) are rejected (``rejected_stale_epoch +=
   1``); TOOL_CALL_COMMITTED / FAILED / RECONCILED are recorded on the call's execution record
   with ``zombie=True`` (the effect happened); a stale TOOL_CALL_INTENDED is both rejected *and*
   recorded, as OUTCOME_UNKNOWN (an effect may be in flight; never lose an execution fact).
   MESSAGE / USER_CORRECTION are ignored. None of these touches ``last_seq``.
   ``event.epoch > state.epoch`` is only accepted on RUN_RESUMED; any other type parks the run
   in GAP ("epoch ahead"): a higher epoch exists only after a RUN_RESUMED, so one we have not
   applied is missing (or an unfenced writer invented an epoch) and applying would invent history.
6. **Seq.** Otherwise ``event.seq`` must be ``last_seq + 1``. A higher seq (gap) or a lower one
   that is not a known duplicate (reorder, or a second event claiming a used seq) parks the run:
   GAP with ``gap_expected_seq`` / ``gap_seen_seq`` / ``gap_reason``. Includes RUN_RESUMED: a
   resume whose seq collides with events the recovery job did not see parks the run.
7. **Apply by type** (consumes the seq): RUN_STARTED again -> BLOCKED; PLAN_COMPILED -> plan
   fields; NODE_* -> ``nodes``; TOOL_CALL_* -> ``records`` (merge rules in *Execution-record transitions*, below:
   a commit is sticky, a re-intent opens a new attempt, an older attempt's failure never
   overwrites a newer attempt); APPROVAL_REQUESTED -> pending,
   WAITING_APPROVAL; APPROVAL_GRANTED / DENIED -> decided, RUNNING when none is pending;
   RUN_RESUMED (epoch must rise) -> epoch, owner (``assigned_to`` or ``producer_id``), RUNNING
   unless approvals pending, and every INTENDED record of a lower epoch becomes OUTCOME_UNKNOWN; one with
   ``paused`` (an operator's pause, v5) -> PAUSED with no owner, the operator and reason recorded;
   RUN_SUCCEEDED / FAILED / CANCELLED -> terminal, and every INTENDED record becomes
   OUTCOME_UNKNOWN (an ended run reports no more outcomes: the call is to be reconciled, never
   "not done"). MESSAGE / USER_CORRECTION only consume the seq: transcripts never change execution
   state (docs/design/protocol.md, the one rule). UNKNOWN (a newer writer's type this reader does not know)
   consumes the seq and is counted per writer symbol in ``unknown_events`` — recorded, never acted
   on, the run goes on — unless the caller declared that symbol (or ``*``) critical: then the run is
   BLOCKED with the reason (upgrade, then rebuild).
8. **After terminal** (same epoch, in sequence): tool outcomes are still recorded (facts);
   TOOL_CALL_INTENDED is recorded (as OUTCOME_UNKNOWN) and counted in ``rejected_after_terminal``;
   a RUN_RESUMED raising the epoch of a FAILED run reopens it (continuing a failed run: status
   RUNNING, error cleared, records kept); every other control-flow event (RUN_RESUMED on a
   SUCCEEDED or CANCELLED run included) is ignored and counted. All consume the seq.
9. **Contract violations** (a required payload field missing, RUN_STARTED twice, RUN_RESUMED not
   raising the epoch, unknown reconcile outcome) park the run as BLOCKED with the reason and
   offset; :func:`block` does the same for a record the projector could not decode.

The module, top to bottom: the value types of a run's state (errors, enums, nodes, approvals, execution
records); the state (:class:`RunState`), its canonical JSON and digest; the execution-record transitions; the
per-type handlers; the reducer.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar

import orjson

from runjournal.core.errors import RunjournalError
from runjournal.model.pmap import PMap, RecordMap, as_pmap
from runjournal.schemas.events import CONTROL_FLOW_TYPES, Event, EventType

__all__ = [
    "ApprovalDecision",
    "CallStatus",
    "DUPLICATE_WINDOW",
    "Decision",
    "ExecutionRecord",
    "NodeState",
    "NodeStatus",
    "PendingApproval",
    "ReconciledOutcome",
    "ReducerError",
    "RunState",
    "RunStatus",
    "STATE_FORMAT_VERSION",
    "StateFormatError",
    "UnknownCallError",
    "WrongRunError",
    "apply",
    "block",
    "fold",
    "mark_outcome_unknown",
    "state_digest",
    "state_from_dict",
    "unsettled_calls",
]


# == Value types of a run's state ==================================================================================
# Value types of a run's state: errors, enums, nodes, approvals and execution records.
#
# Frozen dataclasses treated as immutable (see *The run state*, below). Times are integers in
# **milliseconds since the Unix epoch, UTC** (``*_ms``); offsets are Kafka partition offsets of
# ``runjournal.events`` (docs/design/protocol.md § Topic layout).


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)


def ms(when: datetime) -> int:
    """``when`` (timezone-aware) as integer milliseconds since the Unix epoch, floored (exact, no float)."""
    return (when - _EPOCH) // _ONE_MS


# --------------------------------------------------------------------------- errors


class ReducerError(RunjournalError):
    """Base of the reducer's errors (a programming or storage error, never a journal content problem:
    bad journal content parks or blocks the run instead of raising)."""


class WrongRunError(ReducerError, ValueError):
    """An event of one run was applied to the state of another run."""


class StateFormatError(ReducerError, ValueError):
    """A stored state JSON cannot be read: not JSON, unknown format version, or unknown/missing fields."""


class UnknownCallError(ReducerError, LookupError):
    """A call_id given to a helper has no execution record in the state."""


# --------------------------------------------------------------------------- enums


class RunStatus(StrEnum):
    """Where a run stands. GAP and BLOCKED are *parked*: the run takes no further events until rebuilt."""

    RUNNING = "RUNNING"
    WAITING_APPROVAL = "WAITING_APPROVAL"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    PAUSED = "PAUSED"
    """Held by nobody after an operator's pause (a RUN_RESUMED with ``paused``): no instance writes it until an
    operator resumes it (docs/design/decisions/0047-operator-controls.md). Not ended, not parked."""
    GAP = "GAP"
    """Parked: a seq gap, reordering, seq conflict or an epoch ahead of any RUN_RESUMED was seen."""
    BLOCKED = "BLOCKED"
    """Parked: an event of the run could not be interpreted (quarantined undecodable record, or a
    decoded event violating the contract); see ``RunState.blocked_reason``."""


class CallStatus(StrEnum):
    """Side-effect status of one tool call (docs/design/protocol.md § The side-effect protocol, § Recovery job)."""

    INTENDED = "INTENDED"
    """TOOL_CALL_INTENDED is durable, no outcome seen yet, and its writer is the run's current epoch."""
    COMMITTED = "COMMITTED"
    """The effect happened (TOOL_CALL_COMMITTED). Sticky: never downgraded, never re-run."""
    FAILED = "FAILED"
    """The attempt failed (TOOL_CALL_FAILED); ``retryable`` says whether retry policy may run it again."""
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
    """Intended, no outcome, and its writer has been superseded: reconcile by idempotency key or hold
    for approval, never blind-retry."""
    RECONCILED = "RECONCILED"
    """Settled through the provider by idempotency key; ``reconciled_outcome`` says how."""


class ReconciledOutcome(StrEnum):
    """What the provider said about a call when reconciled (TOOL_CALL_RECONCILED ``outcome``)."""

    COMMITTED = "COMMITTED"
    """The effect happened; never run again."""
    NOT_EXECUTED = "NOT_EXECUTED"
    """The effect never happened; the call may run again (same idempotency key)."""
    FAILED = "FAILED"
    """The provider executed and failed it; retry policy applies."""


class NodeStatus(StrEnum):
    """Status of one plan node."""

    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


class Decision(StrEnum):
    """An approval decision."""

    GRANTED = "GRANTED"
    DENIED = "DENIED"


# --------------------------------------------------------------------------- value types


@dataclass(frozen=True)
class NodeState:
    """The latest known state of one node of the run's plan (NODE_* events)."""

    status: NodeStatus
    """RUNNING after NODE_STARTED, then SUCCEEDED or FAILED."""
    attempt: int
    """The node attempt number from the last NODE_STARTED (1-based; 0 if no NODE_STARTED was seen)."""
    error: str | None = None
    """NODE_FAILED ``error``; None otherwise."""
    retryable: bool | None = None
    """NODE_FAILED ``retryable``; None otherwise."""
    output_digest: str | None = None
    """NODE_SUCCEEDED ``output_digest``, when given."""


@dataclass(frozen=True)
class PendingApproval:
    """An APPROVAL_REQUESTED not yet decided."""

    reason: str
    """Why approval is needed (APPROVAL_REQUESTED ``reason``)."""
    tool: str | None
    """The tool awaiting approval, when given."""
    requested_at_ms: int
    """``occurred_at`` of the request, ms since epoch UTC."""
    scope_call_id: str | None = None
    """The call (idempotency key) the approval is bound to (APPROVAL_REQUESTED ``scope_call_id``, envelope v3)."""
    scope_attempt: int | None = None
    """The attempt of ``scope_call_id`` a grant authorises (``scope_attempt``, v3); None: not bound to one."""
    args_json: str | None = None
    """The arguments of the call awaiting approval as canonical JSON (``args_json``, envelope v4), when the asker
    gave them; None: not given, or an older writer."""


@dataclass(frozen=True)
class ApprovalDecision:
    """The latest decision on an approval (APPROVAL_GRANTED / APPROVAL_DENIED)."""

    decision: Decision
    """GRANTED or DENIED."""
    approver: str
    """Who decided."""
    note: str | None
    """APPROVAL_GRANTED ``comment`` or APPROVAL_DENIED ``reason``, when given."""
    decided_at_ms: int
    """``occurred_at`` of the decision, ms since epoch UTC."""
    consumed_offset: int | None = None
    """Offset of the TOOL_CALL_INTENDED that used this grant (an approval keyed by a call's idempotency key
    authorises one re-run: the next intent of that key, by journal position); None while unused. A consumed grant
    authorises nothing more: the recovery plan leaves it out (docs/design/protocol.md § The side-effect protocol)."""
    scope_call_id: str | None = None
    """The request's ``scope_call_id`` (v3), carried into its decision."""
    scope_attempt: int | None = None
    """The request's ``scope_attempt`` (v3): the one attempt a grant authorises."""


@dataclass(frozen=True)
class ExecutionRecord:
    """What the journal says about one tool call (docs/design/protocol.md ``ExecutionRecordStore``).

    Describes the call's latest attempt; ``attempts`` counts every TOOL_CALL_INTENDED seen.
    """

    call_id: str
    """The call's id, unique within the run."""
    tool: str
    """Tool name."""
    idempotency_key: str
    """Deterministic key from (run_id, node path, call index); passed to the provider."""
    args_digest: str
    """Digest of the call's arguments."""
    side_effect: bool | None
    """Whether the tool has side effects (from the intent; None if no intent was seen)."""
    status: CallStatus
    """Side-effect status, see :class:`CallStatus`."""
    attempts: int
    """Number of TOOL_CALL_INTENDED events seen for this call (0 if only an outcome was seen)."""
    epoch: int
    """Epoch of the latest intent (of the outcome, if no intent was seen)."""
    node_id: str | None = None
    """Envelope ``node_id`` of the latest intent, when set."""
    timeout_ms: int | None = None
    """The tool's own timeout from the intent, ms (recovery waits it out before reconciling)."""
    intended_at_ms: int | None = None
    """``occurred_at`` of the latest intent, ms since epoch UTC."""
    intended_offset: int | None = None
    """Partition offset of the latest intent (the run's partition)."""
    outcome_offset: int | None = None
    """Partition offset of the outcome that set ``status`` (COMMITTED/FAILED/RECONCILED)."""
    outcome_at_ms: int | None = None
    """``occurred_at`` of that outcome, ms since epoch UTC."""
    result_digest: str | None = None
    """Digest of the recorded result (COMMITTED, or RECONCILED as COMMITTED when given)."""
    result_json: str | None = None
    """The recorded result as JSON text, when inlined; replay and resume return it instead of calling."""
    result_ref: str | None = None
    """A reference to the recorded result stored elsewhere, when not inlined."""
    error: str | None = None
    """TOOL_CALL_FAILED ``error``."""
    retryable: bool | None = None
    """TOOL_CALL_FAILED ``retryable``."""
    reconciled_outcome: ReconciledOutcome | None = None
    """The provider's answer from TOOL_CALL_RECONCILED, when reconciled."""
    committed_by_epoch: int | None = None
    """Epoch of the TOOL_CALL_COMMITTED that committed the call (may be a zombie's lower epoch)."""
    zombie: bool = False
    """True when ``status`` was set by a lower-epoch writer after the run's epoch had moved past it
    (a zombie's outcome, or a zombie's intent: then status is OUTCOME_UNKNOWN)."""

    @property
    def effect_committed(self) -> bool:
        """True if the effect is known to have happened: COMMITTED, or RECONCILED as COMMITTED."""
        return self.status is CallStatus.COMMITTED or (
            self.status is CallStatus.RECONCILED and self.reconciled_outcome is ReconciledOutcome.COMMITTED
        )


_T = TypeVar("_T")


def evolve(obj: _T, **changes: Any) -> _T:
    """A copy of frozen dataclass ``obj`` with ``changes``: a shallow ``__dict__`` copy (no __init__).

    Several times faster than :func:`dataclasses.replace` on wide states; the reducer's hot path.
    Field names are not checked here (that cost a fifth of ``apply``): a misspelt name would become
    an extra attribute, which :meth:`RunState.from_json` refuses, so the JSON round-trip tests catch it.
    """
    return with_changes(obj, changes)


_new = object.__new__
_set = object.__setattr__


def with_changes(obj: _T, changes: dict[str, Any]) -> _T:
    """:func:`evolve` with the changes as a dict the caller built (no keyword packing); ``changes`` is not kept.

    The new instance gets a ``dict.copy`` of ``obj.__dict__`` (one allocation at the right size, where
    ``update`` into an empty ``__dict__`` resized it 3 times for a 37-field state: half the cost).
    """
    attrs = obj.__dict__.copy()
    attrs.update(changes)
    new = _new(type(obj))
    _set(new, "__dict__", attrs)
    return new


# == The run state =================================================================================================
# A run's state (:class:`RunState`), its canonical JSON and the state digest.
#
# Everything here is a frozen dataclass treated as immutable. The mapping fields that grow with the run
# (``records``, ``nodes``, ``pending_approvals``, ``approvals``) are persistent maps
# (:class:`runjournal.model.pmap.PMap`; ``records`` a :class:`~runjournal.model.pmap.RecordMap`), typed
# :class:`~collections.abc.Mapping`: an event sets one entry in O(log n) and the old state keeps its map (issue 29,
# docs/design/decisions/0051-a-hash-per-run.md). A state built with plain dicts gets them converted at construction;
# they compare equal to dicts. ``unknown_events`` (one entry per unknown writer type) stays a dict.
#
# Times are integers in **milliseconds since the Unix epoch, UTC** (``*_ms``); offsets are Kafka
# partition offsets of ``runjournal.events`` (docs/design/protocol.md § Topic layout).


#: Version of the JSON produced by :meth:`RunState.to_json`; :meth:`RunState.from_json` refuses others.
STATE_FORMAT_VERSION = 1



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
    the writer's type symbol -> count. A newer writer's event; never acted on (docs/design/protocol.md § Schema
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
    requested_by: str | None = None
    """The operator whose request the last RUN_CANCELLED or RUN_RESUMED carried out (cancel, pause, resume); None
    when the last of them was nobody's request (a recovery, the agent's own cancel). Envelope v5."""
    request_reason: str | None = None
    """Why that operator asked (RUN_RESUMED ``request_reason``; a cancel's reason is :attr:`error`)."""
    paused_at_ms: int | None = None
    """PAUSED: ``occurred_at`` of the RUN_RESUMED that paused it, ms since epoch UTC."""
    resume_at_ms: int | None = None
    """PAUSED by a durable wait (``run.sleep``, a signal wait's timeout): when the recovery service resumes it, ms
    since the Unix epoch by Redis's clock (RUN_RESUMED ``resume_at_ms``)."""
    waiting_for: str | None = None
    """PAUSED waiting for a signal (``run.wait_signal``): its name; ``runjournal signal`` resumes the run."""
    forked_from: str | None = None
    """RUN_STARTED ``forked_from``: the run this one was forked from (``runjournal fork``; envelope v5)."""
    forked_at_seq: int | None = None
    """RUN_STARTED ``forked_at_seq``: the source's seq the fork point is at."""
    fork_lineage: tuple[str, ...] = ()
    """RUN_STARTED ``fork_lineage``: the source, its source … — the runs whose keys its copied calls keep."""
    recent_event_ids: tuple[str, ...] = ()
    """event_ids of the last processed events, oldest first, bounded (duplicate detection window)."""

    def __post_init__(self) -> None:
        """Plain mappings given to the constructor become persistent maps (module comment on *The run state*)."""
        for name, cls in _MAP_CLASSES.items():
            value = self.__dict__[name]
            if type(value) is not cls:
                object.__setattr__(self, name, cls(value))

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
        separators=(",", ":"), ensure_ascii=False)`` writes (``tests/model/test_state_json.py``), ~3x faster.
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
            return state_from_dict(data)
        except StateFormatError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise StateFormatError(f"cannot read run state JSON: {exc}") from exc


_TERMINAL = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED})
#: The persistent-map class of each growing mapping field of :class:`RunState`.
_MAP_CLASSES: dict[str, type[PMap[Any, Any]]] = {"nodes": PMap, "pending_approvals": PMap, "approvals": PMap,
                                                 "records": RecordMap}


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
_TUPLE_FIELDS = ("plan_nodes", "recent_event_ids", "fork_lineage")


#: Fields added to RunState after format 1 with their default: a state JSON written before has none.
_ADDED_FIELDS: dict[str, Any] = {"unknown_events": dict, "requested_by": lambda: None,
                                 "request_reason": lambda: None, "paused_at_ms": lambda: None,
                                 "forked_from": lambda: None, "forked_at_seq": lambda: None, "fork_lineage": list,
                                 "resume_at_ms": lambda: None, "waiting_for": lambda: None}
#: The same for the value types inside a state (by mapping field): name -> default.
_ADDED_VALUE_FIELDS: dict[str, dict[str, Any]] = {
    "approvals": {"consumed_offset": None, "scope_call_id": None, "scope_attempt": None},
    "pending_approvals": {"scope_call_id": None, "scope_attempt": None, "args_json": None},
}


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
    object.__setattr__(obj, "__dict__", data)  # the fresh dict itself (see with_changes)
    return obj


def _state_to_dict(state: RunState) -> dict[str, Any]:
    out: dict[str, Any] = dict(state.__dict__)
    for name in _MAPPING_FIELDS:
        out[name] = {key: value.__dict__ for key, value in out[name].items()}
    out["v"] = STATE_FORMAT_VERSION
    return out


def state_from_dict(data: Any) -> RunState:
    """A :class:`RunState` from the dict of its canonical JSON (``RunState.from_json`` parsed; ``data`` is consumed:
    its ``v`` is popped). Used by :meth:`RunState.from_json` and the hash layout (``runjournal.model.stored``).

    Raises:
        StateFormatError: not an object, another format version, or a field that cannot be read.
    """
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
        added = _ADDED_VALUE_FIELDS.get(name)
        if added:
            for value in data[name].values():
                for field_name, default in added.items():
                    value.setdefault(field_name, default)
        data[name] = _MAP_CLASSES[name]((key, _build(cls, value)) for key, value in data[name].items())
    for name in _TUPLE_FIELDS:
        data[name] = tuple(data[name])
    return _build(RunState, data)


# == Execution-record transitions ==================================================================================
# Execution-record transitions: how TOOL_CALL_* facts fold into a run's ``records`` mapping.
#
# Pure functions over ``Mapping[str, ExecutionRecord]``; each returns the *same* mapping object
# when nothing changes, else a new persistent map (:class:`~runjournal.model.pmap.RecordMap`) with the one record
# set (O(log n); the old map is unchanged).
#
# Merge rules (they hold whichever epoch wrote the fact; docs/design/protocol.md § The side-effect protocol,
# § Zombies, § Recovery job):
#
# * A committed effect is sticky: once a record is COMMITTED (or RECONCILED as COMMITTED) no later
#   intent, failure or reconcile changes its status or its recorded result. The first commit wins.
# * An intent opens a new attempt (``attempts += 1``) and clears the previous attempt's outcome.
#   From the run's current epoch it is INTENDED; from a lower epoch (a zombie writing after the
#   run was resumed) it is OUTCOME_UNKNOWN at once, ``zombie=True``: its writer is superseded, so
#   nobody will report its outcome in this epoch, but an effect may be in flight.
# * An outcome (COMMITTED / FAILED / RECONCILED) for an unknown call creates the record from the
#   outcome's own fields (``attempts=0``, no intent offset): an execution fact is never dropped.
# * An outcome that is not a commit (FAILED, RECONCILED as NOT_EXECUTED / FAILED) from an epoch
#   below the record's latest intent concerns a superseded attempt: it does not overwrite the
#   newer attempt's status (the journal keeps it). A commit from any epoch always applies.
# * ``zombie`` is True when the status was set by a lower epoch than the run's.


Records = Mapping[str, ExecutionRecord]


class Violation(Exception):
    """A decoded event breaks the event contract (e.g. a required payload field is missing)."""


def required(event: Event, name: str) -> Any:
    """``event.payload[name]``, or raise :class:`Violation` naming the type, field and event_id."""
    value = event.payload.get(name)
    if value is None:
        raise Violation(f"{event.type} {event.event_id} lacks required payload field {name!r}")
    return value


def _replace(records: Records, record: ExecutionRecord) -> Records:
    return as_pmap(records, RecordMap).set(record.call_id, record)  # type: ignore[no-any-return]


#: ExecutionRecord's optional fields with their defaults, in field order.
_OPTIONAL: dict[str, Any] = {f.name: f.default for f in fields(ExecutionRecord) if f.default is not MISSING}


def _new_from(event: Event, status: CallStatus, fields: dict[str, Any] | None = None) -> ExecutionRecord:
    """The first record of a call, from the event's own fields (then ``fields``, when given). Built like ``evolve``
    does (no ``__init__``: a frozen dataclass's sets each of its 22 fields through ``object.__setattr__``); the
    reducer's hot path."""
    attrs: dict[str, Any] = {
        "call_id": required(event, "call_id"),
        "tool": required(event, "tool"),
        "idempotency_key": required(event, "idempotency_key"),
        "args_digest": required(event, "args_digest"),
        "side_effect": None,
        "status": status,
        "attempts": 0,
        "epoch": event.epoch,
        **_OPTIONAL,
    }
    attrs["node_id"] = event.node_id
    if fields:
        attrs.update(fields)
    record = object.__new__(ExecutionRecord)
    object.__setattr__(record, "__dict__", attrs)
    return record


def call_intended(records: Records, event: Event, offset: int, *, run_epoch: int) -> Records:
    """Fold a TOOL_CALL_INTENDED at ``offset``; ``run_epoch`` is the run's epoch before this event."""
    stale = event.epoch < run_epoch
    side_effect, timeout_ms = required(event, "side_effect"), required(event, "timeout_ms")
    previous = records.get(required(event, "call_id"))
    status = CallStatus.OUTCOME_UNKNOWN if stale else CallStatus.INTENDED
    if previous is None:  # the call's first fact: built at once with the intent's fields (no outcome to clear)
        return _replace(records, _new_from(event, status, {
            "side_effect": side_effect, "attempts": 1, "timeout_ms": timeout_ms,
            "intended_at_ms": ms(event.occurred_at), "intended_offset": offset, "zombie": stale}))
    if previous.effect_committed:
        return _replace(records, evolve(previous, attempts=previous.attempts + 1))
    record = evolve(
        previous,
        status=status,
        attempts=previous.attempts + 1,
        epoch=event.epoch,
        side_effect=side_effect,
        node_id=event.node_id,
        timeout_ms=timeout_ms,
        intended_at_ms=ms(event.occurred_at),
        intended_offset=offset,
        outcome_offset=None,
        outcome_at_ms=None,
        result_digest=None,
        result_json=None,
        result_ref=None,
        error=None,
        retryable=None,
        reconciled_outcome=None,
        zombie=stale,
    )
    return _replace(records, record)


def call_committed(records: Records, event: Event, offset: int, *, run_epoch: int) -> Records:
    """Fold a TOOL_CALL_COMMITTED at ``offset``; a committed record stays as it is (first commit wins)."""
    digest = required(event, "result_digest")
    previous = records.get(required(event, "call_id"))
    if previous is None:
        previous = _new_from(event, CallStatus.COMMITTED)
    elif previous.effect_committed:
        return records
    payload = event.payload
    record = evolve(
        previous,
        status=CallStatus.COMMITTED,
        result_digest=digest,
        result_json=payload.get("result_json"),
        result_ref=payload.get("result_ref"),
        outcome_offset=offset,
        outcome_at_ms=ms(event.occurred_at),
        committed_by_epoch=event.epoch,
        error=None,
        retryable=None,
        zombie=event.epoch < run_epoch,
    )
    return _replace(records, record)


def call_failed(records: Records, event: Event, offset: int, *, run_epoch: int) -> Records:
    """Fold a TOOL_CALL_FAILED at ``offset``; ignored for a committed record or a newer attempt."""
    error, retryable = required(event, "error"), required(event, "retryable")
    previous = records.get(required(event, "call_id"))
    if previous is None:
        previous = _new_from(event, CallStatus.FAILED)
    elif previous.effect_committed or event.epoch < previous.epoch:
        return records
    record = evolve(
        previous,
        status=CallStatus.FAILED,
        error=error,
        retryable=retryable,
        outcome_offset=offset,
        outcome_at_ms=ms(event.occurred_at),
        zombie=event.epoch < run_epoch,
    )
    return _replace(records, record)


def call_reconciled(records: Records, event: Event, offset: int, *, run_epoch: int) -> Records:
    """Fold a TOOL_CALL_RECONCILED at ``offset``.

    A committed record keeps its status and result and only notes ``reconciled_outcome`` (a
    provider answer that contradicts a recorded commit is kept, never allowed to undo it).

    Raises:
        Violation: ``outcome`` is not COMMITTED, NOT_EXECUTED or FAILED.
    """
    raw = required(event, "outcome")
    try:
        outcome = ReconciledOutcome(raw)
    except ValueError:
        raise Violation(f"TOOL_CALL_RECONCILED {event.event_id} has unknown outcome {raw!r}") from None
    previous = records.get(required(event, "call_id"))
    if previous is None:
        previous = _new_from(event, CallStatus.RECONCILED)
    elif previous.effect_committed:
        if previous.reconciled_outcome is outcome:
            return records
        return _replace(records, evolve(previous, reconciled_outcome=outcome))
    committed = outcome is ReconciledOutcome.COMMITTED
    if not committed and event.epoch < previous.epoch:
        return records
    payload = event.payload
    record = evolve(
        previous,
        status=CallStatus.RECONCILED,
        reconciled_outcome=outcome,
        result_digest=payload.get("result_digest") if committed else None,
        result_json=payload.get("result_json") if committed else None,
        result_ref=payload.get("result_ref") if committed else None,
        outcome_offset=offset,
        outcome_at_ms=ms(event.occurred_at),
        zombie=event.epoch < run_epoch,
    )
    return _replace(records, record)


def mark_unsettled_at_end(records: Records) -> Records:
    """Every INTENDED record becomes OUTCOME_UNKNOWN (same mapping if none): applied when the run ends.

    A run that ends while a call has an intent and no outcome (its tool's outcome was unknown, or the
    outcome event could not be made durable) leaves nobody to report that outcome: the call is
    durably *unknown* — to reconcile (continue the run, or ask the provider) — never "not done".
    """
    changed = {
        call_id: evolve(record, status=CallStatus.OUTCOME_UNKNOWN)
        for call_id, record in records.items()
        if record.status is CallStatus.INTENDED
    }
    return as_pmap(records, RecordMap).update(changed) if changed else records


def mark_superseded_intents(records: Records, epoch: int) -> Records:
    """INTENDED records of an epoch below ``epoch`` become OUTCOME_UNKNOWN (same mapping if none).

    Applied when RUN_RESUMED raises the run's epoch: the writer of those intents is superseded
    (fenced, docs/design/protocol.md § Zombies), so their outcome is unknown, not "not done" and not "done".
    """
    changed = {
        call_id: evolve(record, status=CallStatus.OUTCOME_UNKNOWN)
        for call_id, record in records.items()
        if record.status is CallStatus.INTENDED and record.epoch < epoch
    }
    return as_pmap(records, RecordMap).update(changed) if changed else records


# == Per-type handlers =============================================================================================
# Per-type handlers of the reducer (rule 7 of :mod:`runjournal.model.reducer`) for a running run.
#
# Each takes ``(state, event, offset)`` for an in-sequence event of a run that is neither parked
# nor terminal and returns the field changes (a dict) the reducer applies with the new seq and
# position; it may raise :class:`Violation`, which blocks the run.


Changes = dict[str, Any]

#: Record transitions for the outcome types, which are recorded whatever the epoch or run status.
OUTCOMES = {
    EventType.TOOL_CALL_COMMITTED: call_committed,
    EventType.TOOL_CALL_FAILED: call_failed,
    EventType.TOOL_CALL_RECONCILED: call_reconciled,
}


def _run_started(state: RunState, event: Event, offset: int) -> Changes:
    raise Violation(f"RUN_STARTED {event.event_id} at seq {event.seq}: a run starts once, at seq 1")


def _plan_compiled(state: RunState, event: Event, offset: int) -> Changes:
    return {
        "plan_hash": required(event, "plan_hash"),
        "code_version": required(event, "code_version"),
        "plan_nodes": tuple(required(event, "nodes")),
    }


def _node_started(state: RunState, event: Event, offset: int) -> Changes:
    node = NodeState(status=NodeStatus.RUNNING, attempt=required(event, "attempt"))
    return {"nodes": as_pmap(state.nodes).set(required(event, "node_path"), node)}


def _node_succeeded(state: RunState, event: Event, offset: int) -> Changes:
    path = required(event, "node_path")
    previous = state.nodes.get(path)
    node = NodeState(
        status=NodeStatus.SUCCEEDED,
        attempt=previous.attempt if previous else 0,
        output_digest=event.payload.get("output_digest"),
    )
    return {"nodes": as_pmap(state.nodes).set(path, node)}


def _node_failed(state: RunState, event: Event, offset: int) -> Changes:
    path = required(event, "node_path")
    previous = state.nodes.get(path)
    node = NodeState(
        status=NodeStatus.FAILED,
        attempt=previous.attempt if previous else 0,
        error=required(event, "error"),
        retryable=required(event, "retryable"),
    )
    return {"nodes": as_pmap(state.nodes).set(path, node)}


def _tool_call_intended(state: RunState, event: Event, offset: int) -> Changes:
    changes: Changes = {"records": call_intended(state.records, event, offset, run_epoch=state.epoch)}
    return _consume_grant(state, event, offset, changes)


def _consume_grant(state: RunState, event: Event, offset: int, changes: Changes) -> Changes:
    """A GRANTED approval keyed by this intent's call id is used by it: one approval, one attempt."""
    call_id = event.payload.get("call_id") or ""
    if not state.approvals:
        return changes
    record = state.records.get(call_id)
    attempts = record.attempts if record is not None else 0
    for asked in (f"{call_id}@{attempts}", call_id):  # the attempt's scoped approval, or one under the bare key
        granted = state.approvals.get(asked)
        if granted is not None and granted.decision is Decision.GRANTED and granted.consumed_offset is None:
            changes["approvals"] = as_pmap(state.approvals).set(asked, evolve(granted, consumed_offset=offset))
            break
    return changes


def _tool_call_outcome(state: RunState, event: Event, offset: int) -> Changes:
    return {"records": OUTCOMES[event.type](state.records, event, offset, run_epoch=state.epoch)}


def _approval_requested(state: RunState, event: Event, offset: int) -> Changes:
    call_id = required(event, "call_id")
    pending = PendingApproval(
        reason=required(event, "reason"),
        tool=event.payload.get("tool"),
        requested_at_ms=ms(event.occurred_at),
        scope_call_id=event.payload.get("scope_call_id"),
        scope_attempt=event.payload.get("scope_attempt"),
        args_json=event.payload.get("args_json"),
    )
    changes: Changes = {
        "pending_approvals": as_pmap(state.pending_approvals).set(call_id, pending),
        "status": RunStatus.WAITING_APPROVAL,
    }
    if call_id in state.approvals:  # a new request supersedes the earlier decision
        changes["approvals"] = as_pmap(state.approvals).delete(call_id)
    return changes


def _approval_decided(state: RunState, event: Event, offset: int) -> Changes:
    call_id = required(event, "call_id")
    granted = event.type is EventType.APPROVAL_GRANTED
    asked = state.pending_approvals.get(call_id)
    decision = ApprovalDecision(
        decision=Decision.GRANTED if granted else Decision.DENIED,
        approver=required(event, "approver"),
        note=event.payload.get("comment" if granted else "reason"),
        decided_at_ms=ms(event.occurred_at),
        scope_call_id=asked.scope_call_id if asked is not None else None,
        scope_attempt=asked.scope_attempt if asked is not None else None,
    )
    pending: Mapping[str, PendingApproval] = as_pmap(state.pending_approvals).delete(call_id)
    return {
        "pending_approvals": pending,
        "approvals": as_pmap(state.approvals).set(call_id, decision),
        "status": RunStatus.WAITING_APPROVAL if pending else RunStatus.RUNNING,
    }


def _run_resumed(state: RunState, event: Event, offset: int) -> Changes:
    """RUN_RESUMED raises the epoch; on a FAILED run it also reopens it (a continued run: its error and
    end time are cleared, its records and approvals kept)."""
    if event.epoch <= state.epoch:
        raise Violation(
            f"RUN_RESUMED {event.event_id} does not raise the epoch (run epoch {state.epoch}, "
            f"event epoch {event.epoch})"
        )
    required(event, "previous_epoch")
    required(event, "recovered_by")
    payload = event.payload
    paused = bool(payload.get("paused"))
    changes: Changes = {
        "epoch": event.epoch,
        "owner": None if paused else payload.get("assigned_to") or event.producer_id,
        "plan_json": required(event, "plan_json"),
        "status": RunStatus.PAUSED if paused else (
            RunStatus.WAITING_APPROVAL if state.pending_approvals else RunStatus.RUNNING),
        "records": mark_superseded_intents(state.records, event.epoch),
        "requested_by": payload.get("requested_by"),
        "request_reason": payload.get("request_reason"),
        "paused_at_ms": ms(event.occurred_at) if paused else None,
        "resume_at_ms": payload.get("resume_at_ms") if paused else None,
        "waiting_for": payload.get("waiting_for") if paused else None,
    }
    if state.status is RunStatus.FAILED:
        changes.update(error=None, finished_at_ms=None)
    return changes


def _run_succeeded(state: RunState, event: Event, offset: int) -> Changes:
    return {
        "status": RunStatus.SUCCEEDED,
        "output_json": event.payload.get("output_json"),
        "finished_at_ms": ms(event.occurred_at),
        "records": mark_unsettled_at_end(state.records),
    }


def _run_failed(state: RunState, event: Event, offset: int) -> Changes:
    return {
        "status": RunStatus.FAILED,
        "error": required(event, "error"),
        "finished_at_ms": ms(event.occurred_at),
        "records": mark_unsettled_at_end(state.records),
    }


def _run_cancelled(state: RunState, event: Event, offset: int) -> Changes:
    return {
        "status": RunStatus.CANCELLED,
        "error": required(event, "reason"),
        "requested_by": event.payload.get("requested_by"),
        "request_reason": None,
        "paused_at_ms": None,
        "resume_at_ms": None,
        "waiting_for": None,
        "finished_at_ms": ms(event.occurred_at),
        "records": mark_unsettled_at_end(state.records),
    }


def unknown_event(state: RunState, event: Event, critical: frozenset[str]) -> Changes:
    """An UNKNOWN event (a newer writer's type this reader does not know), in sequence.

    Returns:
        ``unknown_events`` with the writer's symbol counted; nothing else changes (it is never acted on).

    Raises:
        Violation: the symbol (or ``*``) is in ``critical``: the run is BLOCKED with the reason.
    """
    symbol = str(event.payload.get("type") or "UNKNOWN")
    if symbol in critical or "*" in critical:
        raise Violation(
            f"event {event.event_id} at seq {event.seq} has type {symbol}, which this reader does not know and "
            f"declares critical (RUNJOURNAL_CRITICAL_EVENT_TYPES): upgrade the readers to a version that knows "
            f"{symbol}, then rebuild (runjournal projector --rebuild)"
        )
    return {"unknown_events": {**state.unknown_events, symbol: state.unknown_events.get(symbol, 0) + 1}}


HANDLERS: dict[EventType, Callable[[RunState, Event, int], Changes]] = {
    EventType.RUN_STARTED: _run_started,
    EventType.PLAN_COMPILED: _plan_compiled,
    EventType.NODE_STARTED: _node_started,
    EventType.NODE_SUCCEEDED: _node_succeeded,
    EventType.NODE_FAILED: _node_failed,
    EventType.TOOL_CALL_INTENDED: _tool_call_intended,
    EventType.TOOL_CALL_COMMITTED: _tool_call_outcome,
    EventType.TOOL_CALL_FAILED: _tool_call_outcome,
    EventType.TOOL_CALL_RECONCILED: _tool_call_outcome,
    EventType.APPROVAL_REQUESTED: _approval_requested,
    EventType.APPROVAL_GRANTED: _approval_decided,
    EventType.APPROVAL_DENIED: _approval_decided,
    EventType.RUN_RESUMED: _run_resumed,
    EventType.RUN_SUCCEEDED: _run_succeeded,
    EventType.RUN_FAILED: _run_failed,
    EventType.RUN_CANCELLED: _run_cancelled,
}


# == The reducer ===================================================================================================

#: How many recent event_ids a state keeps to recognise a redelivered event at a new offset.
DUPLICATE_WINDOW = 64

_TRANSCRIPT = frozenset({EventType.MESSAGE, EventType.USER_CORRECTION})
_PARKED = frozenset({RunStatus.GAP, RunStatus.BLOCKED})


def apply(state: RunState | None, event: Event, *, partition: int, offset: int,
          critical: frozenset[str] = frozenset()) -> RunState:
    """Fold one event of a run into its state. Pure; ``state`` is never modified.

    Args:
        state: the run's state so far, or None when nothing of the run has been applied.
        event: the decoded (upcast) event.
        partition: partition of ``runjournal.events`` the event was read from.
        offset: its offset in that partition.
        critical: writer type symbols this reader does not know but declares critical (``*``: all);
            an UNKNOWN event of such a type blocks the run instead of being recorded
            (``Settings.critical_types``, env ``RUNJOURNAL_CRITICAL_EVENT_TYPES``). Default: none.

    Returns:
        The new state; ``state`` itself (identity) when the event is at or below the applied
        position. Journal problems never raise: they park the run (GAP / BLOCKED), see the
        module docstring for the rules (docs/design/protocol.md § Projector, § Zombies).

    Raises:
        WrongRunError: ``event.run_id`` is not ``state.run_id``.
    """
    if state is None:
        return _first(event, partition, offset)
    if event.run_id != state.run_id:
        raise WrongRunError(f"event {event.event_id} of run {event.run_id} applied to run {state.run_id}")
    if partition == state.applied_partition and offset <= state.applied_offset:
        return state
    if state.status in _PARKED:
        return evolve(
            state,
            applied_partition=partition,
            applied_offset=offset,
            skipped_while_parked=state.skipped_while_parked + 1,
        )
    seen = state.recent_event_ids
    if event.event_id in seen:
        return evolve(
            state,
            applied_partition=partition,
            applied_offset=offset,
            duplicates_ignored=state.duplicates_ignored + 1,
        )
    try:
        if event.epoch < state.epoch:
            changes = _stale(state, event, offset)
        elif event.epoch > state.epoch and event.type is not EventType.RUN_RESUMED:
            reason = (
                f"epoch ahead: {event.type} seq {event.seq} of epoch {event.epoch} while the run is at "
                f"epoch {state.epoch} and no RUN_RESUMED raised it"
            )
            return _park(state, event, partition, offset, reason)
        elif event.seq != state.last_seq + 1:
            return _park(state, event, partition, offset, _seq_reason(state, event))
        else:
            changes = _in_sequence(state, event, offset, critical)
    except Violation as exc:
        return evolve(
            state,
            status=RunStatus.BLOCKED,
            blocked_reason=f"{exc} (partition {partition} offset {offset})",
            applied_partition=partition,
            applied_offset=offset,
        )
    if len(seen) >= DUPLICATE_WINDOW:
        seen = seen[len(seen) - DUPLICATE_WINDOW + 1 :]
    changes["applied_partition"] = partition
    changes["applied_offset"] = offset
    changes["recent_event_ids"] = (*seen, event.event_id)
    return with_changes(state, changes)


def fold(
    events: Iterable[tuple[Event, int, int]],
    state: RunState | None = None,
    *,
    until_seq: int | None = None,
    critical: frozenset[str] = frozenset(),
) -> RunState | None:
    """Apply ``(event, partition, offset)`` triples of one run in order.

    Args:
        events: the run's events with their positions, in partition order.
        state: a state to continue from (e.g. a Redis snapshot), or None to fold from scratch.
        until_seq: replay: stop as soon as ``last_seq`` reaches this seq (events after that point,
            zombie facts included, had not happened yet); default None folds everything.
        critical: unknown writer types that block the run (see :func:`apply`).

    Returns:
        The folded state; None only when ``state`` is None and ``events`` is empty.

    Raises:
        WrongRunError: the events are not all of the state's run.
    """
    for event, partition, offset in events:
        if until_seq is not None and state is not None and state.last_seq >= until_seq:
            break
        state = apply(state, event, partition=partition, offset=offset, critical=critical)
    return state


def mark_outcome_unknown(state: RunState, call_ids: Iterable[str]) -> RunState:
    """Recovery's declaration: these calls' INTENDED records become OUTCOME_UNKNOWN (§ Recovery job).

    For the recovery job's in-memory view after fencing and folding the tail, before it
    publishes RUN_RESUMED (which makes the same change durable through :func:`apply`). Records
    that already have an outcome (or are already unknown) are left as they are; positions, seq
    and counters are untouched. Classification (NOT_STARTED / FAILED retry policy) is recovery's.

    Args:
        state: the run state.
        call_ids: call ids to mark.

    Returns:
        The new state, or ``state`` itself when nothing changed.

    Raises:
        UnknownCallError: a call id has no execution record.
    """
    records = state.records
    changed: dict[str, ExecutionRecord] = {}
    for call_id in call_ids:
        record = records.get(call_id)
        if record is None:
            raise UnknownCallError(f"run {state.run_id} has no execution record for call {call_id!r}")
        if record.status is CallStatus.INTENDED:
            changed[call_id] = evolve(record, status=CallStatus.OUTCOME_UNKNOWN)
    return evolve(state, records=as_pmap(records, RecordMap).update(changed)) if changed else state


def unsettled_calls(state: RunState) -> tuple[str, ...]:
    """call_ids whose record is INTENDED or OUTCOME_UNKNOWN (an effect may be in flight), sorted."""
    unsettled = (CallStatus.INTENDED, CallStatus.OUTCOME_UNKNOWN)
    return tuple(sorted(cid for cid, record in state.records.items() if record.status in unsettled))


def block(
    state: RunState | None,
    run_id: str,
    reason: str,
    *,
    partition: int,
    offset: int,
    tenant_id: str | None = None,
) -> RunState:
    """Park a run as BLOCKED because a record of it at ``(partition, offset)`` was quarantined.

    The projector calls this for an undecodable record (docs/design/protocol.md § Events: quarantined with its
    offset, never guessed at); the run_id comes from the record key ``{run_id}:{epoch}:{seq}``.
    Idempotent by position like :func:`apply`. An already parked run keeps its status and first
    ``blocked_reason`` (the reason is set if it had none).

    Args:
        state: the run's state, or None if nothing of it was applied yet.
        run_id: the run the record belongs to.
        reason: why it was quarantined (error name and message).
        partition: the record's partition.
        offset: the record's offset.
        tenant_id: the tenant, if known (used only when ``state`` is None).

    Returns:
        The BLOCKED (or still parked) state; ``state`` itself at or below the applied position.

    Raises:
        WrongRunError: ``run_id`` is not ``state.run_id``.
    """
    text = f"{reason} (partition {partition} offset {offset})"
    if state is None:
        return RunState(
            run_id=run_id,
            tenant_id=tenant_id,
            status=RunStatus.BLOCKED,
            blocked_reason=text,
            applied_partition=partition,
            applied_offset=offset,
        )
    if run_id != state.run_id:
        raise WrongRunError(f"quarantined record of run {run_id} applied to run {state.run_id}")
    if partition == state.applied_partition and offset <= state.applied_offset:
        return state
    if state.status in _PARKED:
        return evolve(
            state,
            blocked_reason=state.blocked_reason or text,
            applied_partition=partition,
            applied_offset=offset,
            skipped_while_parked=state.skipped_while_parked + 1,
        )
    return evolve(
        state,
        status=RunStatus.BLOCKED,
        blocked_reason=text,
        applied_partition=partition,
        applied_offset=offset,
    )


# --------------------------------------------------------------------------- rule helpers


def _first(event: Event, partition: int, offset: int) -> RunState:
    base: Changes = {
        "run_id": event.run_id,
        "tenant_id": event.tenant_id,
        "applied_partition": partition,
        "applied_offset": offset,
    }
    if event.type is not EventType.RUN_STARTED or event.seq != 1:
        reason = (
            f"first event seen is {event.type} at seq {event.seq}; a run's history starts with RUN_STARTED at seq 1"
        )
        return RunState(status=RunStatus.GAP, gap_expected_seq=1, gap_seen_seq=event.seq, gap_reason=reason, **base)
    try:
        if event.epoch != 1:
            raise Violation(f"RUN_STARTED {event.event_id} has epoch {event.epoch}, not 1")
        agent, input_json = required(event, "agent"), required(event, "input_json")
    except Violation as exc:
        return RunState(
            status=RunStatus.BLOCKED, blocked_reason=f"{exc} (partition {partition} offset {offset})", **base
        )
    at_ms = ms(event.occurred_at)
    return RunState(
        status=RunStatus.RUNNING,
        epoch=1,
        last_seq=1,
        owner=event.producer_id,
        agent=agent,
        user_id=event.payload.get("user_id"),
        input_json=input_json,
        forked_from=event.payload.get("forked_from"),
        forked_at_seq=event.payload.get("forked_at_seq"),
        fork_lineage=tuple(event.payload.get("fork_lineage") or ()),
        requested_by=event.payload.get("requested_by"),
        request_reason=event.payload.get("request_reason"),
        started_at_ms=at_ms,
        updated_at_ms=at_ms,
        recent_event_ids=(event.event_id,),
        **base,
    )


def _park(state: RunState, event: Event, partition: int, offset: int, reason: str) -> RunState:
    return evolve(
        state,
        status=RunStatus.GAP,
        gap_expected_seq=state.last_seq + 1,
        gap_seen_seq=event.seq,
        gap_reason=f"{reason} (partition {partition} offset {offset})",
        applied_partition=partition,
        applied_offset=offset,
    )


def _seq_reason(state: RunState, event: Event) -> str:
    expected = state.last_seq + 1
    if event.seq > expected:
        return f"seq gap: expected {expected}, saw {event.type} at seq {event.seq}"
    return (
        f"seq reorder or conflict: saw {event.type} {event.event_id} at seq {event.seq}, "
        f"at or below the last applied seq {state.last_seq}, and not a known duplicate"
    )


def _stale(state: RunState, event: Event, offset: int) -> Changes:
    """A lower-epoch (zombie) event: rule 5. Never touches seq."""
    kind = event.type
    if kind is EventType.TOOL_CALL_INTENDED:
        return _consume_grant(state, event, offset, {  # a zombie's re-run used the grant as much as anyone's
            "records": call_intended(state.records, event, offset, run_epoch=state.epoch),
            "rejected_stale_epoch": state.rejected_stale_epoch + 1,
        })
    if kind in CONTROL_FLOW_TYPES:
        return {"rejected_stale_epoch": state.rejected_stale_epoch + 1}
    outcome = OUTCOMES.get(kind)
    if outcome is not None:
        return {"records": outcome(state.records, event, offset, run_epoch=state.epoch)}
    return {}


def _in_sequence(state: RunState, event: Event, offset: int, critical: frozenset[str]) -> Changes:
    """An event with the run's epoch (or a raising RUN_RESUMED) and the next seq: rules 7-8."""
    kind = event.type
    if kind is EventType.UNKNOWN:
        changes: Changes = unknown_event(state, event, critical)
    elif kind in _TRANSCRIPT:
        changes = {}
    elif state.status in _TERMINAL:
        changes = _after_terminal(state, event, offset)
    else:
        changes = HANDLERS[kind](state, event, offset)
        changes["updated_at_ms"] = ms(event.occurred_at)
    changes["last_seq"] = event.seq
    return changes


def _after_terminal(state: RunState, event: Event, offset: int) -> Changes:
    kind = event.type
    outcome = OUTCOMES.get(kind)
    if outcome is not None:
        records = outcome(state.records, event, offset, run_epoch=state.epoch)
        return {"records": records, "updated_at_ms": ms(event.occurred_at)}
    if kind is EventType.RUN_RESUMED and state.status is RunStatus.FAILED:  # continuing a failed run (rule 8)
        changes = HANDLERS[kind](state, event, offset)
        changes["updated_at_ms"] = ms(event.occurred_at)
        return changes
    changes = {"rejected_after_terminal": state.rejected_after_terminal + 1}
    if kind is EventType.TOOL_CALL_INTENDED:  # nobody reports an outcome in an ended run: unknown at once
        records = call_intended(state.records, event, offset, run_epoch=state.epoch)
        changes["records"] = mark_unsettled_at_end(records)
    return changes

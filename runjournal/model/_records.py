"""Value types of a run's state: errors, enums, nodes, approvals and execution records.

Frozen dataclasses treated as immutable (see :mod:`runjournal.model._state`). Times are integers in
**milliseconds since the Unix epoch, UTC** (``*_ms``); offsets are Kafka partition offsets of
``runjournal.events`` (DESIGN.md § Topic layout). Public names are re-exported by
:mod:`runjournal.model.reducer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar

from runjournal.core.errors import RunjournalError

__all__ = [
    "ApprovalDecision",
    "CallStatus",
    "Decision",
    "ExecutionRecord",
    "NodeState",
    "NodeStatus",
    "PendingApproval",
    "ReconciledOutcome",
    "ReducerError",
    "RunStatus",
    "StateFormatError",
    "UnknownCallError",
    "WrongRunError",
    "evolve",
    "ms",
    "with_changes",
]

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
    GAP = "GAP"
    """Parked: a seq gap, reordering, seq conflict or an epoch ahead of any RUN_RESUMED was seen."""
    BLOCKED = "BLOCKED"
    """Parked: an event of the run could not be interpreted (quarantined undecodable record, or a
    decoded event violating the contract); see ``RunState.blocked_reason``."""


class CallStatus(StrEnum):
    """Side-effect status of one tool call (DESIGN.md § The side-effect protocol, § Recovery job)."""

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


@dataclass(frozen=True)
class ExecutionRecord:
    """What the journal says about one tool call (DESIGN.md ``ExecutionRecordStore``).

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

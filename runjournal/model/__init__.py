"""The run model: run state, execution records and the pure reducer ``apply(state, event) -> state``.

No I/O. Used by the projector, the recovery job, replay and inspect; the rules are in
:mod:`runjournal.model.reducer`.
"""

from runjournal.model.reducer import (
    DUPLICATE_WINDOW,
    STATE_FORMAT_VERSION,
    ApprovalDecision,
    CallStatus,
    Decision,
    ExecutionRecord,
    NodeState,
    NodeStatus,
    PendingApproval,
    ReconciledOutcome,
    ReducerError,
    RunState,
    RunStatus,
    StateFormatError,
    UnknownCallError,
    WrongRunError,
    apply,
    block,
    fold,
    mark_outcome_unknown,
    state_digest,
    unsettled_calls,
)

__all__ = [
    "DUPLICATE_WINDOW",
    "STATE_FORMAT_VERSION",
    "ApprovalDecision",
    "CallStatus",
    "Decision",
    "ExecutionRecord",
    "NodeState",
    "NodeStatus",
    "PendingApproval",
    "ReconciledOutcome",
    "ReducerError",
    "RunState",
    "RunStatus",
    "StateFormatError",
    "UnknownCallError",
    "WrongRunError",
    "apply",
    "block",
    "fold",
    "mark_outcome_unknown",
    "state_digest",
    "unsettled_calls",
]

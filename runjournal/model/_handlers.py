"""Per-type handlers of the reducer (rule 7 of :mod:`runjournal.model.reducer`) for a running run.

Each takes ``(state, event, offset)`` for an in-sequence event of a run that is neither parked
nor terminal and returns the field changes (a dict) the reducer applies with the new seq and
position; it may raise :class:`~runjournal.model._calls.Violation`, which blocks the run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runjournal.model import _calls
from runjournal.model._calls import Violation, required
from runjournal.model._records import (
    ApprovalDecision,
    Decision,
    NodeState,
    NodeStatus,
    PendingApproval,
    RunStatus,
    ms,
)
from runjournal.model._state import RunState
from runjournal.schemas.events import Event, EventType

__all__ = ["HANDLERS", "OUTCOMES", "Changes", "unknown_event"]

_T = EventType
Changes = dict[str, Any]

#: Record transitions for the outcome types, which are recorded whatever the epoch or run status.
OUTCOMES = {
    _T.TOOL_CALL_COMMITTED: _calls.commit,
    _T.TOOL_CALL_FAILED: _calls.fail,
    _T.TOOL_CALL_RECONCILED: _calls.reconcile,
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
    return {"nodes": {**state.nodes, required(event, "node_path"): node}}


def _node_succeeded(state: RunState, event: Event, offset: int) -> Changes:
    path = required(event, "node_path")
    previous = state.nodes.get(path)
    node = NodeState(
        status=NodeStatus.SUCCEEDED,
        attempt=previous.attempt if previous else 0,
        output_digest=event.payload.get("output_digest"),
    )
    return {"nodes": {**state.nodes, path: node}}


def _node_failed(state: RunState, event: Event, offset: int) -> Changes:
    path = required(event, "node_path")
    previous = state.nodes.get(path)
    node = NodeState(
        status=NodeStatus.FAILED,
        attempt=previous.attempt if previous else 0,
        error=required(event, "error"),
        retryable=required(event, "retryable"),
    )
    return {"nodes": {**state.nodes, path: node}}


def _tool_call_intended(state: RunState, event: Event, offset: int) -> Changes:
    return {"records": _calls.intend(state.records, event, offset, run_epoch=state.epoch)}


def _tool_call_outcome(state: RunState, event: Event, offset: int) -> Changes:
    return {"records": OUTCOMES[event.type](state.records, event, offset, run_epoch=state.epoch)}


def _approval_requested(state: RunState, event: Event, offset: int) -> Changes:
    call_id = required(event, "call_id")
    pending = PendingApproval(
        reason=required(event, "reason"),
        tool=event.payload.get("tool"),
        requested_at_ms=ms(event.occurred_at),
    )
    changes: Changes = {
        "pending_approvals": {**state.pending_approvals, call_id: pending},
        "status": RunStatus.WAITING_APPROVAL,
    }
    if call_id in state.approvals:  # a new request supersedes the earlier decision
        changes["approvals"] = {k: v for k, v in state.approvals.items() if k != call_id}
    return changes


def _approval_decided(state: RunState, event: Event, offset: int) -> Changes:
    call_id = required(event, "call_id")
    granted = event.type is _T.APPROVAL_GRANTED
    decision = ApprovalDecision(
        decision=Decision.GRANTED if granted else Decision.DENIED,
        approver=required(event, "approver"),
        note=event.payload.get("comment" if granted else "reason"),
        decided_at_ms=ms(event.occurred_at),
    )
    pending = {k: v for k, v in state.pending_approvals.items() if k != call_id}
    return {
        "pending_approvals": pending,
        "approvals": {**state.approvals, call_id: decision},
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
    changes: Changes = {
        "epoch": event.epoch,
        "owner": event.payload.get("assigned_to") or event.producer_id,
        "plan_json": required(event, "plan_json"),
        "status": RunStatus.WAITING_APPROVAL if state.pending_approvals else RunStatus.RUNNING,
        "records": _calls.mark_superseded_intents(state.records, event.epoch),
    }
    if state.status is RunStatus.FAILED:
        changes.update(error=None, finished_at_ms=None)
    return changes


def _run_succeeded(state: RunState, event: Event, offset: int) -> Changes:
    return {
        "status": RunStatus.SUCCEEDED,
        "output_json": event.payload.get("output_json"),
        "finished_at_ms": ms(event.occurred_at),
        "records": _calls.mark_unsettled_at_end(state.records),
    }


def _run_failed(state: RunState, event: Event, offset: int) -> Changes:
    return {
        "status": RunStatus.FAILED,
        "error": required(event, "error"),
        "finished_at_ms": ms(event.occurred_at),
        "records": _calls.mark_unsettled_at_end(state.records),
    }


def _run_cancelled(state: RunState, event: Event, offset: int) -> Changes:
    return {
        "status": RunStatus.CANCELLED,
        "error": required(event, "reason"),
        "finished_at_ms": ms(event.occurred_at),
        "records": _calls.mark_unsettled_at_end(state.records),
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
    _T.RUN_STARTED: _run_started,
    _T.PLAN_COMPILED: _plan_compiled,
    _T.NODE_STARTED: _node_started,
    _T.NODE_SUCCEEDED: _node_succeeded,
    _T.NODE_FAILED: _node_failed,
    _T.TOOL_CALL_INTENDED: _tool_call_intended,
    _T.TOOL_CALL_COMMITTED: _tool_call_outcome,
    _T.TOOL_CALL_FAILED: _tool_call_outcome,
    _T.TOOL_CALL_RECONCILED: _tool_call_outcome,
    _T.APPROVAL_REQUESTED: _approval_requested,
    _T.APPROVAL_GRANTED: _approval_decided,
    _T.APPROVAL_DENIED: _approval_decided,
    _T.RUN_RESUMED: _run_resumed,
    _T.RUN_SUCCEEDED: _run_succeeded,
    _T.RUN_FAILED: _run_failed,
    _T.RUN_CANCELLED: _run_cancelled,
}

"""The pure run reducer: ``apply(state, event) -> state``. No I/O, no Kafka, no Redis.

Used by the projector (folds batches into Redis), the recovery job (folds the partition tail
onto a Redis snapshot, then classifies tool calls), ``replay`` (fold up to a seq) and ``inspect``.
DESIGN.md § Projector, § Zombies, § Recovery job, § The side-effect protocol.

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
   fields; NODE_* -> ``nodes``; TOOL_CALL_* -> ``records`` (merge rules in ``runjournal.model._calls``:
   a commit is sticky, a re-intent opens a new attempt, an older attempt's failure never
   overwrites a newer attempt); APPROVAL_REQUESTED -> pending,
   WAITING_APPROVAL; APPROVAL_GRANTED / DENIED -> decided, RUNNING when none is pending;
   RUN_RESUMED (epoch must rise) -> epoch, owner (``assigned_to`` or ``producer_id``), RUNNING
   unless approvals pending, and every INTENDED record of a lower epoch becomes OUTCOME_UNKNOWN;
   RUN_SUCCEEDED / FAILED / CANCELLED -> terminal, and every INTENDED record becomes
   OUTCOME_UNKNOWN (an ended run reports no more outcomes: the call is to be reconciled, never
   "not done"). MESSAGE / USER_CORRECTION only consume the seq: transcripts never change execution
   state (DESIGN.md, the one rule). UNKNOWN (a newer writer's type this reader does not know)
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
"""

from __future__ import annotations

from collections.abc import Iterable

from runjournal.model import _calls
from runjournal.model._calls import Violation, required
from runjournal.model._handlers import HANDLERS, OUTCOMES, Changes, unknown_event
from runjournal.model._records import (
    ApprovalDecision,
    CallStatus,
    Decision,
    ExecutionRecord,
    NodeState,
    NodeStatus,
    PendingApproval,
    ReconciledOutcome,
    ReducerError,
    RunStatus,
    StateFormatError,
    UnknownCallError,
    WrongRunError,
    evolve,
    ms,
    with_changes,
)
from runjournal.model._state import STATE_FORMAT_VERSION, RunState, state_digest
from runjournal.schemas.events import CONTROL_FLOW_TYPES, Event, EventType

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

#: How many recent event_ids a state keeps to recognise a redelivered event at a new offset.
DUPLICATE_WINDOW = 64

_T = EventType
_TRANSCRIPT = frozenset({_T.MESSAGE, _T.USER_CORRECTION})
_TERMINAL = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED})
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
        module docstring for the rules (DESIGN.md § Projector, § Zombies).

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
        elif event.epoch > state.epoch and event.type is not _T.RUN_RESUMED:
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
    return evolve(state, records={**records, **changed}) if changed else state


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

    The projector calls this for an undecodable record (DESIGN.md § Events: quarantined with its
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
    if event.type is not _T.RUN_STARTED or event.seq != 1:
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
    if kind is _T.TOOL_CALL_INTENDED:
        return {
            "records": _calls.intend(state.records, event, offset, run_epoch=state.epoch),
            "rejected_stale_epoch": state.rejected_stale_epoch + 1,
        }
    if kind in CONTROL_FLOW_TYPES:
        return {"rejected_stale_epoch": state.rejected_stale_epoch + 1}
    outcome = OUTCOMES.get(kind)
    if outcome is not None:
        return {"records": outcome(state.records, event, offset, run_epoch=state.epoch)}
    return {}


def _in_sequence(state: RunState, event: Event, offset: int, critical: frozenset[str]) -> Changes:
    """An event with the run's epoch (or a raising RUN_RESUMED) and the next seq: rules 7-8."""
    kind = event.type
    if kind is _T.UNKNOWN:
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
    if kind is _T.RUN_RESUMED and state.status is RunStatus.FAILED:  # continuing a failed run (rule 8)
        changes = HANDLERS[kind](state, event, offset)
        changes["updated_at_ms"] = ms(event.occurred_at)
        return changes
    changes = {"rejected_after_terminal": state.rejected_after_terminal + 1}
    if kind is _T.TOOL_CALL_INTENDED:  # nobody reports an outcome in an ended run: unknown at once
        records = _calls.intend(state.records, event, offset, run_epoch=state.epoch)
        changes["records"] = _calls.mark_unsettled_at_end(records)
    return changes

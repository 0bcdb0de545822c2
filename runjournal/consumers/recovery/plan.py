"""Classify a run's tool calls from its folded state and build the RecoveryPlan (pure; no I/O).

Authority order (docs/design/protocol.md, the one rule): only the execution records folded from the journal
decide. Memory, retrieval and transcripts are never consulted; MESSAGE events only advanced
the seq in the fold.

| execution record | plan class | what the resumed run does |
|---|---|---|
| COMMITTED, RECONCILED(COMMITTED) | COMMITTED / RECONCILED_COMMITTED | returns the recorded result, never re-runs |
| INTENDED / OUTCOME_UNKNOWN | OUTCOME_UNKNOWN | reconciles by key (1), else holds for approval |
| RECONCILED(NOT_EXECUTED) | RECONCILED_NOT_EXECUTED | runs it (same idempotency key) |
| FAILED, RECONCILED(FAILED) | FAILED | retryable: runs again (attempt + 1); not: the recorded failure is raised again |
| (no record) | NOT_STARTED | runs it |

(1) ``tool.reconcile(idempotency_key)``, once the lease expired and the tool's timeout passed;
never a blind retry.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import orjson

from runjournal.model.reducer import CallStatus as Rec
from runjournal.model.reducer import ReconciledOutcome, RunState
from runjournal.producers.plan import ApprovalStatus, PlannedCall, RecoveryPlan
from runjournal.producers.plan import CallVerdict as Plan

__all__ = ["Classified", "build_plan", "classify"]


@dataclass(frozen=True)
class Classified:
    """The classification of one run's calls."""

    calls: dict[str, PlannedCall]
    """idempotency_key -> planned call."""
    counts: dict[str, int]
    """plan class -> number of calls."""
    unknown_timeout_ms: int
    """The longest ``timeout_ms`` of the OUTCOME_UNKNOWN calls (0 when there is none). Not a deadline: when their
    requests may still act is the writer's effect window, which the job reads from Redis (one clock; never the
    intent's ``occurred_at`` against this host's clock — docs/design/protocol.md § Zombies)."""
    has_unknown: bool = False
    """Whether any call is OUTCOME_UNKNOWN (its effect may be in flight)."""


def _plan_class(status: Rec, reconciled: ReconciledOutcome | None) -> Plan:
    if status == Rec.COMMITTED:
        return Plan.COMMITTED
    if status == Rec.RECONCILED:
        return {ReconciledOutcome.COMMITTED: Plan.RECONCILED_COMMITTED,
                ReconciledOutcome.NOT_EXECUTED: Plan.RECONCILED_NOT_EXECUTED}.get(reconciled, Plan.FAILED)
    if status == Rec.FAILED:
        return Plan.FAILED
    return Plan.OUTCOME_UNKNOWN  # INTENDED or OUTCOME_UNKNOWN: an effect may be in flight


def classify(state: RunState) -> Classified:
    """Classify every execution record of ``state`` (see the module table)."""
    calls: dict[str, PlannedCall] = {}
    counts: Counter[str] = Counter()
    longest, unknown = 0, False
    for rec in state.records.values():
        cls = _plan_class(rec.status, rec.reconciled_outcome)
        counts[cls.value] += 1
        if cls == Plan.OUTCOME_UNKNOWN:
            unknown = True
            longest = max(longest, rec.timeout_ms or 0)
        calls[rec.idempotency_key] = PlannedCall(
            call_id=rec.call_id, tool=rec.tool, status=cls, result_json=rec.result_json,
            result_ref=rec.result_ref, attempts=rec.attempts,
            side_effect=True if rec.side_effect is None else bool(rec.side_effect),
            args_digest=rec.args_digest or None,
            retryable=rec.retryable if cls == Plan.FAILED else None,
            error=rec.error if cls == Plan.FAILED else None)
    return Classified(calls=calls, counts=dict(counts), unknown_timeout_ms=longest, has_unknown=unknown)


def build_plan(state: RunState, classified: Classified, *, new_epoch: int, resumed_seq: int,
               assigned_to: str | None, now_ms: int) -> RecoveryPlan:
    """The plan handed to the resumed instance: classified calls, approvals, node attempts, new epoch."""
    approvals = {cid: ApprovalStatus.PENDING for cid in state.pending_approvals}
    # a grant a re-run already used authorises nothing more (one approval, one attempt): left out
    approvals.update({cid: ApprovalStatus(d.decision.value) for cid, d in state.approvals.items()
                      if d.consumed_offset is None})
    return RecoveryPlan(
        run_id=state.run_id, tenant_id=state.tenant_id or "", agent=state.agent or "",
        epoch=new_epoch, last_seq=resumed_seq, calls=classified.calls, approvals=approvals,
        created_at_ms=now_ms, node_attempts={path: n.attempt for path, n in state.nodes.items()},
        assigned_to=assigned_to, fork_lineage=state.fork_lineage, input_json=state.input_json, user_id=state.user_id)


def plan_summary(classified: Classified, *, previous_epoch: int, new_epoch: int, offsets: dict[str, int]) -> str:
    """The RUN_RESUMED ``plan_json``: counts per class, epochs and the offsets the decision was made from."""
    data = {"calls": classified.counts, "previous_epoch": previous_epoch, "epoch": new_epoch, "offsets": offsets}
    return orjson.dumps(data, option=orjson.OPT_SORT_KEYS).decode()  # = json.dumps(sort_keys, compact): ASCII

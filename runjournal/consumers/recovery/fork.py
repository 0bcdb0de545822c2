"""Fork a run from a point of its history: a new run that starts from the source's execution facts up to that point.

docs/design/decisions/0049-fork.md. The fork is a new run id. Its journal starts with RUN_STARTED (the source's
agent, tenant, user and input, with ``forked_from``, ``forked_at_seq``, ``fork_lineage`` and who asked) followed by
**copies** of the source's execution facts at the fork point — every tool call's intent and outcome under the
source's idempotency key — then a RUN_RESUMED handing it to a live instance (epoch 2). All of it is written in one
transaction of the recovery producer (two actors fence each other, as for any recovery), then handed over like a
recovered run. So the fork's own journal holds everything its recovery needs: it never reads the source again (the
source may be erased or archived later).

The fork's owner re-executes the agent's code from the top with the plan built from those facts, and a call's key
follows ``RecoveryPlan.fork_lineage`` (``RunHandle``): a call the fork copied keeps the source's key, so

* a call COMMITTED at the fork point returns its recorded result (it is not run again);
* a call whose outcome was unknown at the fork point is reconciled with the provider under the source's key before
  anything after it runs (never run blind);
* every call after the fork point runs under the fork's own new keys — so it **may perform an effect again** that
  the source performed after the fork point; :func:`preview` lists exactly those, for ``fork --dry-run``.

Approval decisions and transcript messages are not copied (a fork asks again; memory is not duplicated).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from runjournal.consumers.recovery.resumed import RECOVERY_PRODUCER_ID
from runjournal.model.reducer import CallStatus, ExecutionRecord, ReconciledOutcome, RunState
from runjournal.schemas import Event, EventType, new_event_id, utcnow

__all__ = ["ForkPreview", "fork_history", "preview"]


@dataclass(frozen=True)
class ForkedCall:
    """One call of the source as the fork will meet it."""

    call_id: str
    """The source's call id (its idempotency key)."""
    tool: str
    """The tool."""
    side_effect: bool
    """From its intent."""
    at_fork: str | None
    """Its status at the fork point (None: not yet intended there)."""
    now: str
    """Its status in the source now."""
    what: str
    """What the fork does with it, in words."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return asdict(self)


@dataclass
class ForkPreview:
    """What a fork at a point would do with the source's calls (``fork --dry-run``)."""

    returned: list[ForkedCall] = field(default_factory=list)
    """Recorded at the fork point: their results are returned, they do not run."""
    reconciled: list[ForkedCall] = field(default_factory=list)
    """Unknown at the fork point: reconciled with the provider under the source's key first."""
    rerun: list[ForkedCall] = field(default_factory=list)
    """Failed at the fork point: run again under the source's key (retry policy), as the source would."""
    may_repeat: list[ForkedCall] = field(default_factory=list)
    """Side effects the source performed (or may have) after the fork point: if the fork's code reaches them again,
    they run under the fork's new keys — **the effects the fork may perform again**."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {"returned": [c.as_dict() for c in self.returned], "reconciled": [c.as_dict() for c in self.reconciled],
                "rerun": [c.as_dict() for c in self.rerun], "may_repeat": [c.as_dict() for c in self.may_repeat]}


def _status(record: ExecutionRecord) -> str:
    if record.status is CallStatus.RECONCILED and record.reconciled_outcome is not None:
        return f"RECONCILED_{record.reconciled_outcome.value}"
    return record.status.value


def preview(at: RunState, now: RunState) -> ForkPreview:
    """Classify the source's calls for a fork at ``at`` (the source folded to the fork point), given ``now`` (the
    source folded to its end)."""
    out = ForkPreview()
    for call_id, rec in now.records.items():
        before = at.records.get(call_id)
        effect = bool(rec.side_effect) if rec.side_effect is not None else True
        if before is None or before.attempts == 0:
            if effect and (rec.effect_committed or rec.status in (CallStatus.INTENDED, CallStatus.OUTCOME_UNKNOWN)
                           or rec.status is CallStatus.FAILED):
                out.may_repeat.append(ForkedCall(call_id, rec.tool, effect, None, _status(rec),
                                                 "performed after the fork point: runs again under a new key if the "
                                                 "fork's code reaches it"))
            continue
        if before.effect_committed:
            out.returned.append(ForkedCall(call_id, rec.tool, effect, _status(before), _status(rec),
                                           "its recorded result is returned; it does not run"))
        elif before.status in (CallStatus.INTENDED, CallStatus.OUTCOME_UNKNOWN):
            out.reconciled.append(ForkedCall(call_id, rec.tool, effect, _status(before), _status(rec),
                                             "reconciled with the provider under the source's key before the fork "
                                             "goes on (never run blind)"))
        else:
            out.rerun.append(ForkedCall(call_id, rec.tool, effect, _status(before), _status(rec),
                                        "failed or not executed at the fork point: run again under the source's "
                                        "key, as the source itself would"))
    return out


def fork_history(source: RunState, *, fork_id: str, at_seq: int, requested_by: str,
                 reason: str | None) -> list[Event]:
    """The fork's first events (epoch 1, seq 1 …, written by the recovery producer): RUN_STARTED naming the
    source, then each execution record of ``source`` (the source folded to the fork point) as its intent and its
    outcome under the source's key — none for a call unknown there (the RUN_RESUMED that follows marks it
    OUTCOME_UNKNOWN: the fork's owner reconciles it).

    Raises:
        ValueError: ``source`` is parked or has no RUN_STARTED fields (nothing to fork from).
    """
    if source.parked or source.agent is None or source.input_json is None or source.tenant_id is None:
        raise ValueError(f"run {source.run_id} cannot be forked at seq {at_seq}: its state is "
                         f"{source.status.value}")
    events: list[Event] = []

    def add(etype: EventType, payload: dict[str, Any], node_id: str | None = None) -> None:
        events.append(Event(new_event_id(), fork_id, source.tenant_id or "", len(events) + 1, 1,
                            RECOVERY_PRODUCER_ID, etype, utcnow(), payload, node_id, None))

    add(EventType.RUN_STARTED, {"agent": source.agent, "input_json": source.input_json, "user_id": source.user_id,
                                "forked_from": source.run_id, "forked_at_seq": at_seq,
                                "fork_lineage": [source.run_id, *source.fork_lineage], "requested_by": requested_by,
                                "request_reason": reason})
    for rec in sorted(source.records.values(), key=lambda r: (r.intended_offset or -1, r.call_id)):
        common = {"call_id": rec.call_id, "tool": rec.tool, "idempotency_key": rec.idempotency_key,
                  "args_digest": rec.args_digest}
        add(EventType.TOOL_CALL_INTENDED, {**common, "side_effect": True if rec.side_effect is None else
                                           bool(rec.side_effect), "attempt": max(1, rec.attempts),
                                           "timeout_ms": rec.timeout_ms or 0, "args_json": None}, rec.node_id)
        result = {"result_json": rec.result_json, "result_ref": rec.result_ref, "result_digest": rec.result_digest}
        if rec.status is CallStatus.COMMITTED:
            add(EventType.TOOL_CALL_COMMITTED, {**common, **result, "result_digest": rec.result_digest or ""},
                rec.node_id)
        elif rec.status is CallStatus.FAILED:
            add(EventType.TOOL_CALL_FAILED, {**common, "error": rec.error or "",
                                             "retryable": bool(rec.retryable)}, rec.node_id)
        elif rec.status is CallStatus.RECONCILED:
            outcome = (rec.reconciled_outcome or ReconciledOutcome.NOT_EXECUTED).value
            add(EventType.TOOL_CALL_RECONCILED, {**common, **result, "outcome": outcome}, rec.node_id)
    return events

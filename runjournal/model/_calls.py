"""Execution-record transitions: how TOOL_CALL_* facts fold into a run's ``records`` mapping.

Pure functions over ``Mapping[str, ExecutionRecord]``; each returns the *same* mapping object
when nothing changes, else a shallow copy with the one record replaced.

Merge rules (they hold whichever epoch wrote the fact; DESIGN.md § The side-effect protocol,
§ Zombies, § Recovery job):

* A committed effect is sticky: once a record is COMMITTED (or RECONCILED as COMMITTED) no later
  intent, failure or reconcile changes its status or its recorded result. The first commit wins.
* An intent opens a new attempt (``attempts += 1``) and clears the previous attempt's outcome.
  From the run's current epoch it is INTENDED; from a lower epoch (a zombie writing after the
  run was resumed) it is OUTCOME_UNKNOWN at once, ``zombie=True``: its writer is superseded, so
  nobody will report its outcome in this epoch, but an effect may be in flight.
* An outcome (COMMITTED / FAILED / RECONCILED) for an unknown call creates the record from the
  outcome's own fields (``attempts=0``, no intent offset): an execution fact is never dropped.
* An outcome that is not a commit (FAILED, RECONCILED as NOT_EXECUTED / FAILED) from an epoch
  below the record's latest intent concerns a superseded attempt: it does not overwrite the
  newer attempt's status (the journal keeps it). A commit from any epoch always applies.
* ``zombie`` is True when the status was set by a lower epoch than the run's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, fields
from typing import Any

from runjournal.model._records import CallStatus, ExecutionRecord, ReconciledOutcome, evolve, ms
from runjournal.schemas.events import Event

__all__ = [
    "Violation",
    "commit",
    "fail",
    "intend",
    "mark_superseded_intents",
    "mark_unsettled_at_end",
    "reconcile",
    "required",
]

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
    return {**records, record.call_id: record}


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


def intend(records: Records, event: Event, offset: int, *, run_epoch: int) -> Records:
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


def commit(records: Records, event: Event, offset: int, *, run_epoch: int) -> Records:
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


def fail(records: Records, event: Event, offset: int, *, run_epoch: int) -> Records:
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


def reconcile(records: Records, event: Event, offset: int, *, run_epoch: int) -> Records:
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
    return {**records, **changed} if changed else records


def mark_superseded_intents(records: Records, epoch: int) -> Records:
    """INTENDED records of an epoch below ``epoch`` become OUTCOME_UNKNOWN (same mapping if none).

    Applied when RUN_RESUMED raises the run's epoch: the writer of those intents is superseded
    (fenced, DESIGN.md § Zombies), so their outcome is unknown, not "not done" and not "done".
    """
    changed = {
        call_id: evolve(record, status=CallStatus.OUTCOME_UNKNOWN)
        for call_id, record in records.items()
        if record.status is CallStatus.INTENDED and record.epoch < epoch
    }
    return {**records, **changed} if changed else records

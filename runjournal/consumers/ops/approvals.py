"""A human's decision on a pending approval, checked against the projection and written to the run's inbox.

Shared by ``runjournal approve`` / ``deny`` / ``settle`` and the console's buttons (grant: run the call again; deny:
never; settle: it happened — record it with its result, never run it again). The decision goes to the
run's approval inbox (``runjournal.producers.approvals.ApprovalInbox``, Redis); the run's owner journals it as
APPROVAL_GRANTED / APPROVAL_DENIED — the approver never writes the run's stream (one writer per epoch). Before
writing, the projected run state is checked: a call with no pending APPROVAL_REQUESTED is refused, so a typo or
a second decision never lands in an inbox.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import redis

from runjournal.consumers.projector.store import ProjectionStore
from runjournal.consumers.runtime.partitions import run_partition
from runjournal.core import redis_client as redis_clients
from runjournal.core.errors import RunjournalError
from runjournal.core.ids import CALL_ID, RUN_ID
from runjournal.core.settings import Settings
from runjournal.producers.approvals import ApprovalInbox
from runjournal.producers.encryption import ENCRYPTED, ContentCrypto, approval_address, call_address

__all__ = ["ApprovalRefusedError", "submit_decision", "submit_settlement"]


class ApprovalRefusedError(RunjournalError):
    """The decision was not written: the run has no projected state, no pending approval with that
    call_id (never requested, or already decided), or a decision is already waiting in its inbox."""


def submit_decision(settings: Settings, run_id: str, call_id: str, *, granted: bool, approver: str,
                    comment: str | None = None, reason: str | None = None,
                    redis_client: redis.Redis | None = None) -> dict[str, Any]:
    """Write a decision to the run's inbox if the projection shows ``call_id`` pending.

    Args:
        settings: bootstrap (partition count), Redis URL and prefix.
        run_id: the run.
        call_id: the ``call_id`` of its APPROVAL_REQUESTED.
        granted: grant (True) or deny (False).
        approver: who decides.
        comment: the grant's comment (APPROVAL_GRANTED ``comment``); on a denial it is read as ``reason`` with a
            ``DeprecationWarning`` (kept one release).
        reason: the denial's reason (APPROVAL_DENIED ``reason``).
        redis_client: default ``runjournal.core.redis_client.client(settings)``.

    Returns:
        ``{"run_id", "call_id", "decision", "approver", "comment", "reason", "tool", "request_reason", "args"}``:
        ``comment`` (a grant's, else None) and ``reason`` (a denial's, else None) are the decision's; ``tool``,
        ``request_reason`` (why the run asked) and ``args`` (the call's arguments, decoded, or None when the
        request did not record them: envelope v4) are the request's.

    Raises:
        ApprovalRefusedError: see the class; nothing was written.
        ValueError: ``reason`` given with ``granted=True``; nothing was written.
        InvalidIdError: ``run_id`` or ``call_id`` is not text (``runjournal.core.ids`` ``check_lookup``).
        TopicNotFoundError: the events topic does not exist.
        redis.RedisError: Redis unreachable.
    """
    RUN_ID.check_lookup(run_id)
    CALL_ID.check_lookup(call_id)
    if granted and reason is not None:
        raise ValueError("a grant is recorded with a comment, not a reason: pass comment=")
    if not granted and comment is not None:
        warnings.warn("submit_decision(granted=False, comment=...) is deprecated: a denial's reason is reason=",
                      DeprecationWarning, stacklevel=2)
        reason, comment = (comment if reason is None else reason), None
    client = redis_client if redis_client is not None else redis_clients.client(settings)
    state = ProjectionStore(client, settings.topic_prefix).get(run_partition(settings, run_id), run_id)
    if state is None:
        raise ApprovalRefusedError(f"run {run_id} has no projected state (unknown run, or the projector has not "
                                   "caught up: is `runjournal projector` running?)")
    pending = state.pending_approvals.get(call_id)
    if pending is None:
        decided = state.approvals.get(call_id)
        if decided is not None:
            raise ApprovalRefusedError(f"approval {call_id!r} of run {run_id} was already {decided.decision} "
                                       f"by {decided.approver}")
        listed = ", ".join(sorted(state.pending_approvals)) or "none"
        raise ApprovalRefusedError(f"run {run_id} ({state.status}) has no pending approval {call_id!r}; "
                                   f"pending: {listed}")
    inbox = ApprovalInbox(client, settings.topic_prefix)
    note = {"comment": comment} if granted else {"reason": reason}
    if not inbox.decide(run_id, call_id, granted=granted, approver=approver, **note):
        waiting = inbox.decision(run_id, call_id) or {}
        raise ApprovalRefusedError(f"a decision on {call_id!r} of run {run_id} is already waiting for its owner: "
                                   f"{waiting.get('decision')} by {waiting.get('approver')}")
    return {"run_id": run_id, "call_id": call_id, "decision": "GRANTED" if granted else "DENIED",
            "approver": approver, "comment": comment, "reason": reason, "tool": pending.tool,
            "request_reason": pending.reason,
            "args": _args(settings, run_id, call_id, pending.args_json)}


def _args(settings: Settings, run_id: str, call_id: str, stored: str | None) -> Any:
    """The approval's recorded arguments, parsed — ``"encrypted"`` when this operator holds no key for them
    (decision 0059; never raised: the decision is already written)."""
    text = ContentCrypto(settings, encrypt=False).reveal(stored, [run_id], call_address(call_id), "args_json")
    if text is None or text == ENCRYPTED:
        return text
    return json.loads(text)


def submit_settlement(settings: Settings, run_id: str, call_id: str, *, result: Any, approver: str,
                      comment: str | None = None, redis_client: redis.Redis | None = None) -> dict[str, Any]:
    """Write "it happened, with this result" for a pending unknown-outcome approval (``<key>@<attempt>``): the
    run's owner records the call as TOOL_CALL_RECONCILED(COMMITTED) with ``result`` and never runs it again
    (``runjournal.producers.approvals``, *Settled by hand*).

    Args:
        settings, run_id, call_id, approver, comment, redis_client: as :func:`submit_decision`.
        result: the call's result as the person knows it (JSON values; recorded as canonical JSON).

    Returns:
        ``{"run_id", "call_id", "decision": "EXECUTED", "approver", "comment", "tool", "request_reason",
        "result_json", "settles"}`` (``comment``: why the person knows it happened; ``request_reason``: why the run
        asked; ``settles``: the idempotency key of the call).

    Raises:
        ApprovalRefusedError: no such pending approval, it is not bound to one call, that call's outcome is not
            unknown in the projection, or a decision is already waiting; nothing was written.
        EncryptedContentError / KeyUnavailableError: with ``RUNJOURNAL_ENCRYPTION=on`` the result, sealed under the
            run's key while it waits in the inbox (decision 0059), could not be sealed (an erased subject: its key
            was destroyed); nothing was written.
        NonCanonicalValueError: ``result`` has no exact JSON form; nothing was written.
        InvalidIdError, TopicNotFoundError, redis.RedisError: as :func:`submit_decision`.
    """
    from runjournal.model.reducer import CallStatus
    from runjournal.producers import canonical_value
    from runjournal.producers.handle import approval_scope

    RUN_ID.check_lookup(run_id)
    CALL_ID.check_lookup(call_id)
    result_json = canonical_value(result, "result")
    client = redis_client if redis_client is not None else redis_clients.client(settings)
    state = ProjectionStore(client, settings.topic_prefix).get(run_partition(settings, run_id), run_id)
    pending = state.pending_approvals.get(call_id) if state is not None else None
    if state is None or pending is None:
        return _refuse_missing(state, run_id, call_id)
    key = pending.scope_call_id or approval_scope(call_id)[0]
    if key is None:
        raise ApprovalRefusedError(f"approval {call_id!r} of run {run_id} is not bound to one call (an unknown "
                                   "outcome's approval is <key>@<attempt>): it can be granted or denied, not settled")
    record = state.records.get(key)
    if record is None or record.status not in (CallStatus.INTENDED, CallStatus.OUTCOME_UNKNOWN):
        now = "not in the run" if record is None else record.status.value
        raise ApprovalRefusedError(f"call {key} of run {run_id} is {now}: only an unknown outcome is settled by hand")
    stored = result_json
    if settings.encryption == "on":  # the inbox is at rest too: sealed under the run's key until the owner takes it
        if state.tenant_id is None:
            raise ApprovalRefusedError(f"run {run_id}: its tenant is not known, so the result cannot be sealed "
                                       "(RUNJOURNAL_ENCRYPTION=on)")
        crypto = ContentCrypto(settings)
        if not crypto.has_key(state.tenant_id, state.user_id):
            raise ApprovalRefusedError(f"run {run_id}: this host's key directory holds no live "
                                       "key of the run's user, so the result cannot be sealed for it: use the agents' "
                                       "RUNJOURNAL_KEYS_DIR (docs/guide/encryption.md)")
        stored = crypto.seal_text(result_json, tenant_id=state.tenant_id, subject=state.user_id, run_id=run_id,
                                  address=approval_address(call_id), field="result_json")
    inbox = ApprovalInbox(client, settings.topic_prefix)
    if not inbox.settle(run_id, call_id, result_json=stored, approver=approver, comment=comment):
        waiting = inbox.decision(run_id, call_id) or {}
        raise ApprovalRefusedError(f"a decision on {call_id!r} of run {run_id} is already waiting for its owner: "
                                   f"{waiting.get('decision')} by {waiting.get('approver')}")
    return {"run_id": run_id, "call_id": call_id, "decision": "EXECUTED", "approver": approver, "comment": comment,
            "tool": pending.tool, "request_reason": pending.reason, "result_json": result_json, "settles": key}


def _refuse_missing(state: Any, run_id: str, call_id: str) -> dict[str, Any]:
    if state is None:
        raise ApprovalRefusedError(f"run {run_id} has no projected state (unknown run, or the projector has not "
                                   "caught up: is `runjournal projector` running?)")
    decided = state.approvals.get(call_id)
    if decided is not None:
        raise ApprovalRefusedError(f"approval {call_id!r} of run {run_id} was already {decided.decision} "
                                   f"by {decided.approver}")
    listed = ", ".join(sorted(state.pending_approvals)) or "none"
    raise ApprovalRefusedError(f"run {run_id} ({state.status}) has no pending approval {call_id!r}; "
                               f"pending: {listed}")

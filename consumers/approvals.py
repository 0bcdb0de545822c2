"""A human's decision on a pending approval, checked against the projection and written to the run's inbox.

Shared by ``runjournal approve`` / ``deny`` and the console's approve / deny buttons. The decision goes to the
run's approval inbox (``runjournal.producers.approvals.ApprovalInbox``, Redis); the run's owner journals it as
APPROVAL_GRANTED / APPROVAL_DENIED — the approver never writes the run's stream (one writer per epoch). Before
writing, the projected run state is checked: a call with no pending APPROVAL_REQUESTED is refused, so a typo or
a second decision never lands in an inbox.
"""

from __future__ import annotations

from typing import Any

import redis

from runjournal.consumers._partitions import run_partition
from runjournal.consumers.projector.store import ProjectionStore
from runjournal.core import redis_client as redis_clients
from runjournal.core.errors import RunjournalError
from runjournal.core.settings import Settings
from runjournal.producers.approvals import ApprovalInbox

__all__ = ["ApprovalRefusedError", "submit_decision"]


class ApprovalRefusedError(RunjournalError):
    """The decision was not written: the run has no projected state, no pending approval with that
    call_id (never requested, or already decided), or a decision is already waiting in its inbox."""


def submit_decision(settings: Settings, run_id: str, call_id: str, *, granted: bool, approver: str,
                    comment: str | None = None, redis_client: redis.Redis | None = None) -> dict[str, Any]:
    """Write a decision to the run's inbox if the projection shows ``call_id`` pending.

    Args:
        settings: bootstrap (partition count), Redis URL and prefix.
        run_id: the run.
        call_id: the ``call_id`` of its APPROVAL_REQUESTED.
        granted: grant (True) or deny (False).
        approver: who decides.
        comment: the grant's comment or the denial's reason.
        redis_client: default ``runjournal.core.redis_client.client(settings)``.

    Returns:
        ``{"run_id", "call_id", "decision", "approver", "comment", "tool", "reason"}`` (``tool`` and
        ``reason`` from the request).

    Raises:
        ApprovalRefusedError: see the class; nothing was written.
        TopicNotFoundError: the events topic does not exist.
        redis.RedisError: Redis unreachable.
    """
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
    if not inbox.decide(run_id, call_id, granted=granted, approver=approver, comment=comment):
        waiting = inbox.decision(run_id, call_id) or {}
        raise ApprovalRefusedError(f"a decision on {call_id!r} of run {run_id} is already waiting for its owner: "
                                   f"{waiting.get('decision')} by {waiting.get('approver')}")
    return {"run_id": run_id, "call_id": call_id, "decision": "GRANTED" if granted else "DENIED",
            "approver": approver, "comment": comment, "tool": pending.tool, "reason": pending.reason}

"""Durable human approvals: a Redis inbox for decisions, journaled by the run's own writer.

A run has one writer at a time (its epoch's owner), so a human's decision is not published
to the run's stream by the approver — that would race the owner for the next seq. Instead:

1. The owner publishes APPROVAL_REQUESTED (durable) for a ``call_id`` — :func:`await_approval`.
2. A human decides: ``runjournal approve RUN_ID CALL_ID`` / ``deny`` (``runjournal.cli.approvals``;
   refused unless the projected run shows ``call_id`` pending) → :meth:`ApprovalInbox.decide` writes
   ``rj:{P:r:<run_id>}:approvals`` field ``call_id`` (the first decision wins).
3. The owner sees the decision and publishes APPROVAL_GRANTED / APPROVAL_DENIED (durable) — the
   journal, not the inbox, is the execution fact. A GRANT authorises running the call again (same key); a DENY
   refuses it.

**Settled by hand** (``runjournal settle RUN_ID APPROVAL_ID --result JSON``, :meth:`ApprovalInbox.settle`): for an
unknown-outcome approval (``<key>@<attempt>``), a person who knows the effect happened records it with its
result. The owner publishes TOOL_CALL_RECONCILED(COMMITTED) with that result (durable) — the call is never run
again, and calling it returns the result — then APPROVAL_DENIED whose reason says it was settled by hand, by
whom and why (no re-run was authorised). In that order: a crash between leaves the outcome recorded and the
request pending, which a resumed owner answers from the inbox again.

Across a crash: the recovery plan carries the run's approvals (PENDING / GRANTED / DENIED from
the journal). A GRANTED one is never asked again; a PENDING one is not re-requested — the
resumed owner waits for the inbox (a decision made while nobody owned the run is still there).
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Generator
from typing import Any

from runjournal.core.ids import CALL_ID
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.producers._steps import Effect, Sleep, advance, drive
from runjournal.producers.encryption import ContentCrypto, approval_address
from runjournal.producers.errors import JournalError
from runjournal.producers.handle import RunHandle, approval_scope
from runjournal.producers.plan import ApprovalStatus, CallVerdict
from runjournal.schemas import EventType

__all__ = ["ApprovalInbox", "ApprovalTimeoutError", "approval_steps", "await_approval"]


class ApprovalTimeoutError(JournalError):
    """No decision arrived within the wait; the request stays pending (durable) for a later resume."""


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


class ApprovalInbox:
    """Decisions waiting for a run's owner. Keys (``runjournal.core.redis_keys``): ``rj:{P:r:<run_id>}:approvals``
    (hash call_id -> JSON) and ``rj:P:approvals:pending``."""

    def __init__(self, redis_client: Any, prefix: str) -> None:
        self._r = redis_client
        self._prefix = prefix
        self._keys = RedisKeys(prefix)

    @classmethod
    def from_settings(cls, settings: Settings, *, connect_timeout_s: float = 5.0) -> ApprovalInbox:
        """The inbox of ``settings``' prefix on the Redis its URL names (one server or a cluster, ACL user, TLS:
        ``runjournal.core.redis_client``), once that Redis answered a PING.

        Args:
            settings: the Redis URL, user and TLS files, and the prefix.
            connect_timeout_s: how long the PING may take, seconds (default 5).

        Raises:
            StackUnavailableError: no Redis answers at ``settings.redis_url`` within ``connect_timeout_s`` (the message
                names ``RUNJOURNAL_REDIS_URL`` and ``runjournal stack up``).
            ConfigError: Redis refused the login, the ACL user or the TLS handshake (the settings named).
            ValueError: ``connect_timeout_s`` is not positive.
        """
        from runjournal.core import redis_client

        if connect_timeout_s <= 0:
            raise ValueError(f"connect_timeout_s must be > 0, got {connect_timeout_s}")
        redis_client.probe(settings, timeout_s=connect_timeout_s)
        return cls(redis_client.client(settings), settings.topic_prefix)

    def key(self, run_id: str) -> str:
        """``rj:{P:r:<run_id>}:approvals``."""
        return self._keys.approvals(run_id)

    def pending_key(self) -> str:
        """``rj:P:approvals:pending``: set of ``run_id|call_id`` awaiting a decision (a hint for approvers)."""
        return self._keys.approvals_pending()

    def decide(
        self, run_id: str, call_id: str, *, granted: bool, approver: str, comment: str | None = None,
        reason: str | None = None,
    ) -> bool:
        """Record a human decision; the first decision wins (HSETNX).

        Args:
            run_id: the run.
            call_id: the ``call_id`` of its APPROVAL_REQUESTED.
            granted: True to grant, False to deny.
            approver: who decided.
            comment: a grant's comment (journaled as APPROVAL_GRANTED ``comment``). On a denial it is read as
                ``reason``, with a ``DeprecationWarning`` (kept one release: pass ``reason``).
            reason: a denial's reason (journaled as APPROVAL_DENIED ``reason``).

        Returns:
            True when this decision was recorded; False when one was already waiting (it stays).

        Raises:
            ValueError: a ``reason`` given with ``granted=True`` (a grant has a comment, a denial a reason).
            redis.RedisError: Redis unreachable.
        """
        if granted and reason is not None:
            raise ValueError("a grant is recorded with a comment, not a reason: pass comment=")
        if not granted and comment is not None:
            warnings.warn("ApprovalInbox.decide(granted=False, comment=...) is deprecated: a denial's reason is "
                          "reason=", DeprecationWarning, stacklevel=2)
            reason = comment if reason is None else reason
        note = {"comment": comment} if granted else {"reason": reason}
        value = json.dumps({"decision": "GRANTED" if granted else "DENIED", "approver": approver, **note,
                            "at_ms": int(time.time() * 1000)})
        return bool(self._r.hsetnx(self.key(run_id), call_id, value))

    def settle(self, run_id: str, call_id: str, *, result_json: str, approver: str,
               comment: str | None = None) -> bool:
        """Record a person's word that the unknown-outcome call behind approval ``call_id`` happened, with its
        result (canonical JSON text); the first decision wins (HSETNX), as for :meth:`decide`.

        Returns:
            True when recorded; False when a decision was already waiting (it stays).

        Raises:
            redis.RedisError: Redis unreachable.
        """
        value = json.dumps({"decision": "EXECUTED", "approver": approver, "comment": comment,
                            "result_json": result_json, "at_ms": int(time.time() * 1000)})
        return bool(self._r.hsetnx(self.key(run_id), call_id, value))

    def decision(self, run_id: str, call_id: str) -> dict[str, Any] | None:
        """The decision waiting for the run's owner, or None when undecided: ``{"decision", "approver", "at_ms"}``
        and ``"comment"`` (GRANTED; EXECUTED: why the person knows it happened, with ``"result_json"``) or
        ``"reason"`` (DENIED). A denial stored by the previous release (its reason under ``"comment"``) is read with
        ``"reason"`` (kept one release)."""
        raw = self._r.hget(self.key(run_id), call_id)
        if raw is None:
            return None
        decided: dict[str, Any] = json.loads(_text(raw))
        if decided.get("decision") == "DENIED" and "reason" not in decided:  # stored by the previous release
            decided["reason"] = decided.pop("comment", None)
        return decided

    def requested(self, run_id: str, call_id: str) -> None:
        """Note that a decision is awaited (so tools such as the demo's approver can find pending requests).

        The entry is ``run_id|call_id``: a call id holds no ``|`` (``runjournal.core.ids.CALL_ID``), so the entry
        splits at its last ``|`` into exactly these two, whatever the run id holds.

        Raises:
            InvalidIdError: ``call_id`` breaks its rules (a ``|`` would make the entry ambiguous).
        """
        self._r.sadd(self.pending_key(), f"{run_id}|{CALL_ID.check(call_id)}")

    def pending(self) -> list[tuple[str, str]]:
        """``(run_id, call_id)`` pairs awaiting a decision."""
        out = []
        for raw in self._r.smembers(self.pending_key()):
            run_id, _, call_id = _text(raw).rpartition("|")
            if self.decision(run_id, call_id) is None:
                out.append((run_id, call_id))
        return sorted(out)

    def forget(self, run_id: str) -> int:
        """Drop a finished (or erased) run's decisions and its entries in the pending set — its own only: an entry
        of run ``a|b`` is not run ``a``'s (entries split at their last ``|``, :meth:`requested`).

        Returns:
            Redis keys deleted (0 or 1) plus pending-set entries removed.
        """
        mine = [m for m in self._r.smembers(self.pending_key()) if _text(m).rpartition("|")[0] == run_id]
        removed = int(self._r.srem(self.pending_key(), *mine)) if mine else 0
        return int(self._r.delete(self.key(run_id))) + removed


def await_approval(
    handle: RunHandle,
    inbox: ApprovalInbox,
    call_id: str,
    reason: str,
    *,
    tool: str | None = None,
    args: Any = None,
    timeout_s: float = 300.0,
    poll_s: float = 0.1,
) -> bool:
    """Ask for (or, after a resume, keep waiting for) a human decision on ``call_id``; True when granted.

    ``tool`` and ``args`` (the call's arguments, recorded as canonical JSON: envelope v4) are what the approver
    sees in the console, ``inspect`` and ``approve`` — give them, or the approver decides blind.

    Publishes APPROVAL_REQUESTED unless the run's journal already shows it requested, and APPROVAL_GRANTED /
    DENIED once decided, unless the journal already has the decision — as known to the handle: its recovery
    plan plus what it published itself. So asking again for a decided ``call_id`` returns the recorded
    decision (live and after a resume alike) rather than publishing a new request that a decision left in the
    inbox would answer at once; ask with a new ``call_id`` to ask again. ``AsyncRunHandle.await_approval``
    drives the same steps (:func:`approval_steps`) from asyncio.

    Raises:
        ApprovalTimeoutError: no decision within ``timeout_s`` seconds (the request stays durable).
        RunCancelledError, RunPausedError: an operator cancelled or paused the run while it waited
            (``RunHandle.stop_if_requested``, checked on every poll).
        DeliveryError and the other publishing errors of :meth:`RunHandle.emit`.
    """
    granted: bool = drive(approval_steps(handle, inbox, call_id, reason, tool=tool, args=args, timeout_s=timeout_s,
                                         poll_s=poll_s), getattr(handle, "advance", advance))  # a ReplayHandle: plain
    return granted


def approval_steps(handle: RunHandle, inbox: ApprovalInbox, call_id: str, reason: str, *, tool: str | None,
                   timeout_s: float, poll_s: float, args: Any = None) -> Generator[Effect, Any, bool]:
    """:func:`await_approval` as steps (``runjournal.producers._steps``): yields a ``Sleep`` between inbox polls.
    ``call_id`` is checked first (``InvalidIdError``: ``runjournal.core.ids.CALL_ID``), before anything is published."""
    CALL_ID.check(call_id)
    known = _known(handle, call_id)
    if known in (ApprovalStatus.GRANTED, ApprovalStatus.DENIED):
        # Denied, but its call is recorded as having happened (settled by hand, or its provider answered since):
        # calling again returns that result without running — so "go on" is the answer.
        return known == ApprovalStatus.GRANTED or _verdict(handle, call_id) in _HAPPENED
    if known is None:
        handle.request_approval(call_id, reason, tool=tool, args=args)
    inbox.requested(handle.run_id, call_id)
    deadline = time.monotonic() + timeout_s
    stop = getattr(handle, "stop_if_requested", None)  # an operator's cancel / pause ends the wait (decisions/0047)
    while (decided := inbox.decision(handle.run_id, call_id)) is None:
        if callable(stop):
            stop()
        if time.monotonic() > deadline:
            raise ApprovalTimeoutError(
                f"no decision on {call_id} of run {handle.run_id} within {timeout_s} s"
            )
        yield Sleep(poll_s)
    if decided["decision"] == "EXECUTED":
        return _settled_by_hand(handle, call_id, decided)
    granted = bool(decided["decision"] == "GRANTED")
    etype = EventType.APPROVAL_GRANTED if granted else EventType.APPROVAL_DENIED
    payload = {
        "call_id": call_id,
        "approver": decided["approver"],
        ("comment" if granted else "reason"): decided.get("comment" if granted else "reason"),
    }
    handle.emit(etype, payload)
    return granted


def _settled_by_hand(handle: RunHandle, call_id: str, decided: dict[str, Any]) -> bool:
    """The EXECUTED decision (module docstring, *Settled by hand*): the outcome first, then the approval's answer.
    Returns True: calling the call again is safe — it returns the recorded result without running."""
    scope_call_id, _attempt = approval_scope(call_id)
    if scope_call_id is None:  # submit_decision refuses this; an inbox written by hand may not
        raise JournalError(f"approval {call_id} of run {handle.run_id} is not bound to one call (<key>@<attempt>): "
                           "it cannot be settled by hand")
    if _verdict(handle, call_id) is CallVerdict.OUTCOME_UNKNOWN:
        content = getattr(getattr(handle, "journal", None), "content", None) or ContentCrypto()  # none: no key
        text = content.open(decided["result_json"], handle.run_id, approval_address(call_id), "result_json")
        handle.settle_by_hand(scope_call_id, json.loads(str(text)))
    why = f"settled by hand: it happened, result recorded by {decided['approver']}"
    handle.emit(EventType.APPROVAL_DENIED, {"call_id": call_id, "approver": decided["approver"],
                                            "reason": f"{why} — {decided['comment']}" if decided.get("comment")
                                            else why})
    return True


_HAPPENED = (CallVerdict.COMMITTED, CallVerdict.RECONCILED_COMMITTED)


def _verdict(handle: RunHandle, approval: str) -> CallVerdict | None:
    """What ``handle`` knows of the call approval ``approval`` (``<key>@<attempt>``) is bound to: its own outcomes,
    then its plan's; None when unbound or unknown."""
    key, _attempt = approval_scope(approval)
    if key is None:
        return None
    calls = getattr(handle, "_calls", None) or {}
    planned = calls.get(key) or (handle.plan.calls.get(key) if handle.plan is not None else None)
    return planned.status if planned is not None else None


def _known(handle: RunHandle, call_id: str) -> ApprovalStatus | None:
    """The journal's state of approval ``call_id`` as ``handle`` knows it (``RunHandle.approval``; a look-alike
    handle without it: its plan's)."""
    lookup = getattr(handle, "approval", None)
    if callable(lookup):
        known: ApprovalStatus | None = lookup(call_id)
        return known
    return handle.plan.approvals.get(call_id) if handle.plan is not None else None

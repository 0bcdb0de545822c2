"""Durable waits: ``run.sleep`` and ``run.wait_signal`` — a run that waits holds no process, and survives crashes.

docs/design/decisions/0050-durable-waits.md. Both are steps of the run, journaled like tool calls of two built-in
tools, so a re-executed (resumed) run meets them again with their recorded answers:

* ``runjournal.timer`` answers ``{"due_ms": …}``: when the wait ends, ms since the Unix epoch by **Redis's clock**
  (``TIME``), the one clock every timer is set and fired by — never the agent host's;
* ``runjournal.signal`` answers the signal's payload, once it was delivered (``runjournal signal RUN_ID NAME``: an
  HSETNX in ``rj:{P:r:<run_id>}:signals``, so a signal sent twice is delivered once, and one sent before the run
  waits for it is there when it does).

A short wait happens in the process (a ``Sleep`` step: the sync and asyncio handles both drive it). A wait longer
than the Journal's ``hold_after_s`` **releases the run**: the handle stores a ``wait`` request with its wake-up time
and signal (``runjournal.producers.control``), gives the run up (``Journal.surrender``) and raises
:class:`~runjournal.producers.errors.RunWaitingError`; the recovery job holds it for nobody (a RUN_RESUMED with
``paused``, ``resume_at_ms``, ``waiting_for``) and its sweep resumes it when the time comes or the signal arrives,
on any live instance. The resumed code sleeps again: the timer answers its recorded due time, now passed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from runjournal.core.redis_keys import RedisKeys
from runjournal.producers.control import ControlStore
from runjournal.producers.tools import Outcome

__all__ = ["SIGNAL_TOOL", "TIMER_TOOL", "SignalInbox", "SignalReceive", "TimerStart"]

TIMER_TOOL = "runjournal.timer"
SIGNAL_TOOL = "runjournal.signal"


class TimerStart:
    """The built-in tool that fixes when a wait ends: ``{"seconds": s}`` or ``{"until_ms": t}`` → ``{"due_ms": …}``
    by Redis's clock. Read-only (its answer rides the next commit; a wait that releases the run commits it first)."""

    name = TIMER_TOOL
    side_effect = False
    timeout_ms = 5000

    def __init__(self, controls: ControlStore) -> None:
        self.controls = controls

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        now = self.controls.now_ms()
        if args.get("until_ms") is not None:
            return {"due_ms": int(args["until_ms"]), "set_at_ms": now}
        return {"due_ms": now + int(round(float(args["seconds"]) * 1000)), "set_at_ms": now}

    def reconcile(self, idempotency_key: str) -> Outcome | None:
        """A timer has no effect to reconcile: not executed, so it is set again."""
        return Outcome(executed=False)


class SignalReceive:
    """The built-in tool that records a delivered signal's payload (called only once the signal is in the inbox)."""

    name = SIGNAL_TOOL
    side_effect = False
    timeout_ms = 5000

    def __init__(self, delivered: dict[str, Any]) -> None:
        self.delivered = delivered

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        return self.delivered.get("payload")


class SignalInbox:
    """Signals delivered to runs: ``rj:{P:r:<run_id>}:signals`` (name → JSON ``{payload, sent_by}``), written once.

    Args:
        client: a client from ``runjournal.core.redis_client``.
        prefix: the topic prefix.
    """

    def __init__(self, client: Any, prefix: str) -> None:
        self.r = client
        self.keys = RedisKeys(prefix)

    def send(self, run_id: str, name: str, payload: Any, *, sent_by: str,
             seal: Callable[[str], str] | None = None) -> bool:
        """Deliver ``payload`` (a JSON value) as signal ``name`` of ``run_id``; False when that signal was delivered
        already (the first delivery stands: a signal is delivered exactly once).

        Args:
            seal: with encryption on (decision 0059), the sealing of the payload's canonical JSON under the run's
                key, bound to ``(run id, signal:<name>, payload)``
                (:func:`runjournal.producers.encryption.signal_address`): the inbox then holds ``{"sealed": token,
                "sent_by": …}``, never the payload in clear (Redis and its backups are at rest; an erased subject's
                signals are shredded with its key).

        Raises:
            redis.RedisError: Redis failed.
            EncryptedContentError / KeyUnavailableError: from ``seal`` (nothing delivered).
        """
        body: dict[str, Any] = ({"payload": payload} if seal is None
                                else {"sealed": seal(json.dumps(payload, sort_keys=True, separators=(",", ":")))})
        value = json.dumps({**body, "sent_by": sent_by}, sort_keys=True, separators=(",", ":"))
        return bool(self.r.hsetnx(self.keys.signals(run_id), name, value))

    def get(self, run_id: str, name: str) -> dict[str, Any] | None:
        """The delivery of signal ``name`` of ``run_id``, or None."""
        raw = self.r.hget(self.keys.signals(run_id), name)
        return None if raw is None else dict(json.loads(raw))

    def forget(self, run_id: str) -> int:
        """Delete every signal of ``run_id`` (erase); the number of keys deleted."""
        return int(self.r.delete(self.keys.signals(run_id)))

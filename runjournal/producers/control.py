"""Operator requests on a run — cancel, pause — as the agent, the recovery job and the operator see them.

docs/design/decisions/0047-operator-controls.md. An operator's request is one field of the hash
``rj:{P:ctl}:requests`` (run id → the request as JSON), stamped by Redis's clock, with a version counter
``rj:{P:ctl}:version`` raised by every change (both keys share the tag ``{P:ctl}``: each change is one script on a
Redis Cluster too). At most one request per run is pending: a cancel stands against anything later, a second
request of the same action is the same request (idempotent), a cancel replaces a pending pause.

Who carries a request out, and how (each writes the journal event first, then removes the request,
compare-and-delete by ``request_id``, so a crash between the two leaves the request to be carried out again —
finding the run already ended or paused, it is just removed):

* the run's **live owner**, at its next step boundary (before a tool call's intent, before a node, while it waits
  for an approval, and between a side effect's acknowledged intent and its request): a cancel → RUN_CANCELLED
  (``RunCancelledError`` to the agent's code); a pause → it gives the run up (``Journal.surrender``) and the
  recovery job writes the pause (``RunPausedError`` to the agent's code);
* the **recovery job**, for a run whose owner is dead, that was surrendered, or that is paused: a pause → RUN_RESUMED
  with ``paused`` (held by nobody); a cancel → RUN_CANCELLED — or, when a call's outcome is unknown, a normal
  resume, so that the new owner reconciles it first and then cancels (an effect in flight is never abandoned).

The owner learns of a request through its heartbeat (the version counter, then the requests of the runs it owns:
within ``lease_ttl_ms / 3``) and, for a side effect, from a read made after its intent was produced: a request
stored before that read stops the request from being sent (the call is recorded as not executed).

A running tool sees a request through :func:`stop_requested` (sync or async), e.g. to stop a long download.
"""

from __future__ import annotations

import contextvars
import json
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from runjournal.core.errors import RunjournalError
from runjournal.core.redis_keys import RedisKeys

__all__ = [
    "ACTIONS",
    "RESUME",
    "STOPS",
    "WAIT",
    "ControlRequest",
    "ControlStore",
    "RequestRefusedError",
    "current_stop",
    "reset_stop",
    "stop_requested",
]

ACTIONS = ("cancel", "pause")
"""The requests an operator may leave for a run's owner (a resume is not a request: it is carried out at once)."""
WAIT = "wait"
"""A run's own request to be held until a time or a signal (``RunHandle.sleep`` / ``wait_signal`` past
``hold_after_s``): carried out like a pause, with a wake-up time (``producers.waits``)."""
RESUME = "resume"
"""An operator's resume of a held (PAUSED) run, left for the recovery service when the operator's own credentials
may not publish recovery events (least privilege: docs/operations/cluster-and-least-privilege.md). Stored with a
timer armed at once, in one script, so the next sweep's wake pass hands the run over; never seen by an owner."""
STOPS = (*ACTIONS, WAIT)
"""The requests a run's owner carries out at its step boundaries (a :data:`RESUME` is the recovery job's alone)."""

#: Store a request unless one stands: KEYS = requests hash, version; ARGV = run id, action, JSON without the stamp.
#: A pending cancel stands; the same operator action pending stands (idempotent); a cancel replaces a pending pause
#: or wait; a run's own wait replaces an earlier wait of it but never an operator's pause; a resume (of a held run)
#: replaces a leftover pause or wait, a pause replaces a pending resume. KEYS[3] = timers, ARGV[4] = '1': arm the run's
#: timer at Redis's now when stored (a resume: the next wake pass carries it out).
#: Returns {1, json} when stored, {0, json of the standing request} otherwise. The stamp is Redis's clock.
_REQUEST = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local a = cjson.decode(cur)['action']
  if a == 'cancel' or (a == ARGV[2] and a ~= 'wait') or (ARGV[2] == 'wait' and a == 'pause') then
    return {0, cur}
  end
end
local t = redis.call('TIME')
local req = cjson.decode(ARGV[3])
req['requested_at_ms'] = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local text = cjson.encode(req)
redis.call('HSET', KEYS[1], ARGV[1], text)
redis.call('INCR', KEYS[2])
if ARGV[4] == '1' then
  redis.call('ZADD', KEYS[3], 'LT', req['requested_at_ms'], ARGV[1])
end
return {1, text}
"""
#: Remove a run's request when it is the one given (request_id ARGV[2]) or, with ARGV[2] = '', when its action is
#: ARGV[3]: KEYS = requests hash, version. Returns 1 when removed.
_REMOVE = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return 0 end
local req = cjson.decode(cur)
if (ARGV[2] ~= '' and req['request_id'] == ARGV[2]) or (ARGV[2] == '' and req['action'] == ARGV[3]) then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('INCR', KEYS[2])
  return 1
end
return 0
"""


class RequestRefusedError(RunjournalError):
    """An operator's request was not stored because another stands (a cancel is pending, or the run's state does
    not allow it). ``standing`` is the request that stands (None: refused for the run's state)."""

    def __init__(self, message: str, standing: ControlRequest | None = None) -> None:
        super().__init__(message)
        self.standing = standing


@dataclass(frozen=True)
class ControlRequest:
    """One operator request pending on a run (immutable; the JSON value of its hash field)."""

    run_id: str
    """The run it is for."""
    action: str
    """``cancel`` or ``pause`` (:data:`ACTIONS`)."""
    request_id: str
    """A uuid4 hex: the request's identity; the event that carries it out records it (``request_id``)."""
    requested_by: str
    """Who asked (an operator name: ``user@host`` from the CLI, the console's operator)."""
    reason: str
    """Why (free text; the cancel's RUN_CANCELLED ``reason``, the pause's RUN_RESUMED ``request_reason``)."""
    requested_at_ms: int = 0
    """When the request was stored, ms since the Unix epoch by Redis's clock (display only: nothing orders by it)."""
    until_ms: int | None = None
    """``wait``: when the held run wakes, ms since the Unix epoch by Redis's clock (None: only a signal wakes it)."""
    signal: str | None = None
    """``wait``: the signal the held run waits for (None: a sleep)."""

    @classmethod
    def from_json(cls, run_id: str, raw: bytes | str) -> ControlRequest:
        """Parse a stored value (unknown keys are ignored: a newer writer's field)."""
        data = json.loads(raw)
        until = data.get("until_ms")
        return cls(run_id=run_id, action=str(data["action"]), request_id=str(data["request_id"]),
                   requested_by=str(data.get("requested_by") or ""), reason=str(data.get("reason") or ""),
                   requested_at_ms=int(data.get("requested_at_ms") or 0),
                   until_ms=None if until is None else int(until), signal=data.get("signal"))

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return asdict(self)


class ControlStore:
    """The pending operator requests of one key prefix (module docstring). Methods raise ``redis.RedisError``.

    Args:
        client: a client from ``runjournal.core.redis_client`` (one server or a cluster).
        prefix: the topic prefix.
    """

    def __init__(self, client: Any, prefix: str) -> None:
        self.r = client
        keys = RedisKeys(prefix)
        self.requests_key = keys.control_requests()
        self.version_key = keys.control_version()
        self.timers_key = keys.control_timers()
        self._request = client.register_script(_REQUEST)
        self._remove = client.register_script(_REMOVE)

    def request(self, run_id: str, action: str, *, requested_by: str, reason: str, until_ms: int | None = None,
                signal: str | None = None) -> tuple[bool, ControlRequest]:
        """Store a request for ``run_id`` unless one stands (module docstring).

        Args:
            until_ms, signal: a :data:`WAIT` request's wake-up time (Redis's clock, ms) and signal.

        Returns:
            (stored, the request now pending): ``stored`` False when an earlier request stands (it is returned).

        A :data:`RESUME` arms the run's timer at Redis's now in the same script (the next wake pass takes it).

        Raises:
            ValueError: ``action`` is not one of :data:`STOPS` or :data:`RESUME`.
        """
        if action not in (*STOPS, RESUME):
            raise ValueError(f"action must be one of {(*STOPS, RESUME)}, got {action!r}")
        body = json.dumps({"action": action, "request_id": uuid.uuid4().hex, "requested_by": requested_by,
                           "reason": reason, **({"until_ms": until_ms} if until_ms is not None else {}),
                           **({"signal": signal} if signal is not None else {})})
        stored, text = self._request(keys=[self.requests_key, self.version_key, self.timers_key],
                                     args=[run_id, action, body, "1" if action == RESUME else "0"])
        return bool(int(stored)), ControlRequest.from_json(run_id, text)

    def get(self, run_id: str) -> ControlRequest | None:
        """The request pending on ``run_id``, or None."""
        raw = self.r.hget(self.requests_key, run_id)
        return None if raw is None else ControlRequest.from_json(run_id, raw)

    def get_many(self, run_ids: Iterable[str]) -> dict[str, ControlRequest]:
        """run_id → its pending request, for those of ``run_ids`` that have one (one HMGET)."""
        ids = list(run_ids)
        if not ids:
            return {}
        return {r: ControlRequest.from_json(r, raw) for r, raw in zip(ids, self.r.hmget(self.requests_key, ids),
                                                                        strict=True) if raw is not None}

    def pending(self) -> dict[str, ControlRequest]:
        """Every pending request (HGETALL: the requests not yet carried out — small; the console's list)."""
        return {(k.decode() if isinstance(k, bytes) else k): ControlRequest.from_json(
            k.decode() if isinstance(k, bytes) else k, v) for k, v in self.r.hgetall(self.requests_key).items()}

    def version(self) -> int:
        """The version counter (0 before any request): a change means some request was stored or removed."""
        raw = self.r.get(self.version_key)
        return int(raw) if raw is not None else 0

    def done(self, request: ControlRequest) -> bool:
        """Remove ``request`` once its event is durable (compare-and-delete by ``request_id``); True when removed."""
        return bool(int(self._remove(keys=[self.requests_key, self.version_key],
                                     args=[request.run_id, request.request_id, ""])))

    # -- durable timers: held runs' wake-up times ----------------------------------------------------------------
    def now_ms(self) -> int:
        """Redis's clock, ms since the Unix epoch: the one clock every timer is set and fired by."""
        seconds, micros = self.r.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def arm(self, run_id: str, until_ms: int, *, lt: bool = False) -> None:
        """Record that the held run ``run_id`` wakes at ``until_ms`` (before the event that holds it commits).
        ``lt``: keep an earlier wake-up time already stored (a signal delivered meanwhile armed it for now)."""
        self.r.zadd(self.timers_key, {run_id: until_ms}, lt=lt)

    def due(self, now_ms: int, limit: int = 1000) -> list[str]:
        """Held runs whose wake-up time is at or before ``now_ms`` (oldest first, at most ``limit``)."""
        return [m.decode() if isinstance(m, bytes) else m
                for m in self.r.zrangebyscore(self.timers_key, "-inf", now_ms, start=0, num=limit)]

    def disarm(self, run_ids: Iterable[str]) -> None:
        """Forget the wake-up times of ``run_ids`` (they were resumed, or ended)."""
        ids = list(run_ids)
        if ids:
            self.r.zrem(self.timers_key, *ids)

    def withdraw(self, run_id: str, action: str) -> bool:
        """Remove the pending request of ``run_id`` if its action is ``action`` (a resume withdraws a pause not yet
        carried out); True when removed."""
        return bool(int(self._remove(keys=[self.requests_key, self.version_key], args=[run_id, "", action])))


# -- what a running tool sees ----------------------------------------------------------------------------------------
_STOP: contextvars.ContextVar[Callable[[], ControlRequest | None] | None] = contextvars.ContextVar(
    "runjournal_stop", default=None)


def stop_requested() -> ControlRequest | None:
    """Inside a tool run by ``RunHandle.call`` (sync or asyncio): the operator's cancel or pause request pending on
    the run, as the instance last saw it (its heartbeat reads requests every ``lease_ttl_ms / 3``), or None — also
    outside a tool. A long tool may check it and stop early; whatever it returns or raises is recorded as usual
    (the call ends COMMITTED, FAILED or OUTCOME_UNKNOWN, never abandoned), and the run stops at its next step."""
    look = _STOP.get()
    return look() if look is not None else None


def current_stop(look: Callable[[], ControlRequest | None] | None) -> contextvars.Token[Any]:
    """Set what :func:`stop_requested` reads in this context (the run handle's drivers, around a call); returns the
    token for :func:`reset_stop`."""
    return _STOP.set(look)


def reset_stop(token: contextvars.Token[Any]) -> None:
    """Undo :func:`current_stop`."""
    _STOP.reset(token)


"""The spend ledger: token, money and call budgets reserved before each model call and settled after it.

docs/design/decisions/0053-spend-ledger.md. A model call costs money that is only known once it returns — the shape
of the side-effect protocol — so spend rides that protocol: a reservation and its settle are two steps of the run,
journaled as calls of two built-in, side-effecting tools, each carried out by one Redis script on the tenant's
ledger and answered by key when its outcome is unknown.

* ``runjournal.spend.reserve`` — args ``{"model", "estimate"}``; the script checks every budget that applies (the
  run's, the tenant's, the user's: :data:`DIMS`) and charges the estimate to each — or refuses, and the call is
  recorded as failed (``BudgetExceededError``, retryable) with nothing charged. Its result names the reservation.
* ``runjournal.spend.settle`` — args ``{"reservation", "usage"}``; the script replaces the reservation's estimate by
  the actual usage in every scope. A settle is never refused (the money is spent); one without its reservation is
  (``SettleWithoutReservationError``).

Both scripts are idempotent by key: a retried reserve (same idempotency key) charges once, a retried settle settles
once, and ``reconcile(key)`` reads the reservation's state — so a crash between intent and outcome leaves no double
charge and no lost one. A recorded step is answered from the journal (resume, replay, a fork's copied steps): it
never reaches Redis again, so nothing is charged twice. A crash between a reservation and its settle leaves the
reservation charged at its estimate (``open``: unknown spend) until a settle names it.

**Units.** Tokens and calls are integers; money is an integer count of micro-units of ``Settings.spend_currency``
(``cost_micros``: 1 USD = 1,000,000). A price per million tokens in currency units is therefore exactly the price
per token in micro-units.

**Overshoot bound.** The check is atomic per tenant (one hash tag, one script: exact on Redis Cluster). A budget
can be exceeded only by settles larger than their estimates: at most the sum, over the reservations in flight, of
``actual - estimate`` where positive. With an estimate at the request's ``max_tokens`` there is none.
"""

from __future__ import annotations

import json
import threading
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runjournal.core.ids import USER_ID
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.spend_policy import (
    DIMS,
    SpendConfigError,
    SpendPolicy,
    SpendValueError,
    UnknownCurrencyError,
    UnknownModelError,
    Usage,
    check_currency,
)
from runjournal.producers.errors import JournalError
from runjournal.producers.tools import Outcome, ToolOutcomeUnknownError

__all__ = [
    "DIMS",
    "RESERVE_TOOL",
    "AsyncReservation",
    "SETTLE_TOOL",
    "BudgetExceededError",
    "Reservation",
    "SettleWithoutReservationError",
    "SpendConfigError",
    "SpendLedger",
    "SpendPolicy",
    "SpendReserve",
    "SpendSettle",
    "SpendSummary",
    "SpendValueError",
    "UnknownCurrencyError",
    "UnknownModelError",
    "Usage",
    "check_currency",
    "fold_spend",
    "reconciled_charge",
    "reserve_step",
]

REDIS_RETRY_S = 60.0
"""How long a reserve or settle waits for an unreachable (or loading) Redis before its outcome is unknown, s."""
RESERVE_TOOL = "runjournal.spend.reserve"
SETTLE_TOOL = "runjournal.spend.settle"


class SettleWithoutReservationError(JournalError):
    """A settle names a reservation the ledger does not hold (never reserved, or another run's)."""


class BudgetExceededError(JournalError):
    """A reservation would take a budget past its limit; nothing was charged (the reserve step is recorded as a
    retryable failure: a later attempt, after an operator raised the budget, may pass).

    Attributes:
        scope: ``run:<id>``, ``tenant:<id>`` or ``user:<id>`` — the budget refused.
        dim: the dim (:data:`DIMS`).
        limit, used, asked: the budget, what is already charged (settled + reserved) and the estimate, in the dim's
            unit (tokens, calls, or micro-units of the currency).
        left: ``max(0, limit - used)`` — what the agent may still reserve in that dim (degrade, summarise, ask).
    """

    retryable = True
    outcome_unknown = False

    def __init__(self, *, scope: str, dim: str, limit: int, used: int, asked: int) -> None:
        self.scope, self.dim, self.limit, self.used, self.asked = scope, dim, limit, used, asked
        self.left = max(0, limit - used)
        super().__init__(f"budget {scope} {dim}: {asked} asked, {self.left} left of {limit} (used {used}); "
                         "reserve less, or raise the budget (runjournal spend budget)")


# -- the ledger's scripts (one tenant's hash tag: exact on Redis Cluster) ------------------------------------------
_LUA_DIMS = ("local DIMS = {'input_tokens', 'output_tokens', 'cost_micros', 'model_calls'}\n"
             # an integer's exact text (Lua's tostring and argument conversion keep 14 digits; amounts reach 2^53)
             "local function n(x) return string.format('%.0f', tonumber(x)) end\n"
             # the run's first step in this ledger: its scope starts from the spend its journal already records (a
             # fork's copied steps, a run whose ledger was lost) — applied once, never charged to the tenant again
             "local function start_run_scope(run, recorded)\n"
             "  if redis.call('HSETNX', run, 'init', '1') == 0 then return end\n"
             "  local base = cjson.decode(recorded)\n"
             "  for _, dim in ipairs(DIMS) do\n"
             "    local add = tonumber(base[dim] or 0)\n"
             "    if add ~= 0 then\n"
             "      redis.call('HINCRBY', run, 'used:' .. dim, n(add))\n"
             "      redis.call('HINCRBY', run, 'base:' .. dim, n(add))\n"
             "    end\n"
             "  end\n"
             "end\n")
_RESERVE = _LUA_DIMS + """
-- KEYS: run, tenant[, user]. ARGV: reservation key, estimate JSON, defaults JSON (one object per KEY), state JSON,
-- the run's recorded spend JSON (its scope's start, applied once). Numbers below 2^53: exact as Lua doubles.
local res = 'k:' .. ARGV[1]
local prior = redis.call('HGET', KEYS[1], res)
if prior then return {'dup', prior} end
local est = cjson.decode(ARGV[2])
local defaults = cjson.decode(ARGV[3])
start_run_scope(KEYS[1], ARGV[5])
for i = 1, #KEYS do
  for _, dim in ipairs(DIMS) do
    local add = tonumber(est[dim] or 0)
    local limit = redis.call('HGET', KEYS[i], 'limit:' .. dim) or defaults[i][dim]
    if limit ~= nil and add > 0 then
      local used = tonumber(redis.call('HGET', KEYS[i], 'used:' .. dim) or '0')
      if used + add > tonumber(limit) then
        return {'refused', tostring(i), dim, n(limit), n(used), n(add)}
      end
    end
  end
end
for i = 1, #KEYS do
  for _, dim in ipairs(DIMS) do
    local add = tonumber(est[dim] or 0)
    if add ~= 0 then
      redis.call('HINCRBY', KEYS[i], 'used:' .. dim, n(add))
      redis.call('HINCRBY', KEYS[i], 'open:' .. dim, n(add))
    end
  end
end
redis.call('HSET', KEYS[1], res, ARGV[4])
-- each limited (scope, dim) after the charge: "<scope index>:<dim>:<used>:<limit>" (budget-use gauges)
local use = {}
for i = 1, #KEYS do
  for _, dim in ipairs(DIMS) do
    local limit = redis.call('HGET', KEYS[i], 'limit:' .. dim) or defaults[i][dim]
    if limit ~= nil then
      local used = redis.call('HGET', KEYS[i], 'used:' .. dim) or '0'
      table.insert(use, tostring(i) .. ':' .. dim .. ':' .. used .. ':' .. n(limit))
    end
  end
end
return {'ok', ARGV[4], table.concat(use, ',')}
"""
_SETTLE = _LUA_DIMS + """
-- KEYS: run, tenant[, user]. ARGV: reservation key, settle key, actual amounts JSON, adopt JSON or '',
-- the run's recorded spend JSON (its scope's start when an adopted settle is the run's first step here).
-- The reservation's state (k:) is never re-encoded here: its settle is u: (the usage, as given) and b: (the settle).
local res = ARGV[1]
local prior = redis.call('HGET', KEYS[1], 'k:' .. res)
if redis.call('HEXISTS', KEYS[1], 'u:' .. res) == 1 then
  return {'dup', prior, redis.call('HGET', KEYS[1], 'u:' .. res), redis.call('HGET', KEYS[1], 'b:' .. res)}
end
local actual = cjson.decode(ARGV[3])
if not prior then
  if ARGV[4] == '' then return {'missing'} end
  -- a reservation the journal recorded that this run's ledger never held (a fork's copied step, a lost ledger): the
  -- money was charged where it was reserved; only this run's scope and its base move from the estimate to the usage
  prior = ARGV[4]
  local st = cjson.decode(prior)
  start_run_scope(KEYS[1], ARGV[5])
  for _, dim in ipairs(DIMS) do
    local delta = tonumber(actual[dim] or 0) - tonumber(st['estimate'][dim] or 0)
    if delta ~= 0 then
      redis.call('HINCRBY', KEYS[1], 'used:' .. dim, n(delta))
      redis.call('HINCRBY', KEYS[1], 'base:' .. dim, n(delta))
    end
  end
  redis.call('HSET', KEYS[1], 'k:' .. res, prior)
else
  local st = cjson.decode(prior)
  for i = 1, #KEYS do
    for _, dim in ipairs(DIMS) do
      local est = tonumber(st['estimate'][dim] or 0)
      local delta = tonumber(actual[dim] or 0) - est
      if delta ~= 0 then redis.call('HINCRBY', KEYS[i], 'used:' .. dim, n(delta)) end
      if est ~= 0 then redis.call('HINCRBY', KEYS[i], 'open:' .. dim, n(-est)) end
    end
  end
end
redis.call('HSET', KEYS[1], 'u:' .. res, ARGV[3], 'b:' .. res, ARGV[2], 's:' .. ARGV[2], res)
return {'ok', prior, ARGV[3], ARGV[2]}
"""


class SpendLedger:
    """One tenant's budgets, charged amounts and reservations in Redis (``RedisKeys.spend_*``), kept by two scripts.

    The ledger is the one place of truth a reserve is checked against; the journal (the reserve and settle steps'
    records) is the authority it is rebuilt from (``runjournal spend --fold``: a fresh fold of the topic).

    Args:
        client: a redis-py client (``runjournal.core.redis_client``).
        prefix: the topic prefix.
        policy: prices and default budgets.
    """

    def __init__(self, client: Any, prefix: str, policy: SpendPolicy) -> None:
        self.r = client
        self.keys = RedisKeys(prefix)
        self.policy = policy
        self._reserve = client.register_script(_RESERVE)
        self._settle = client.register_script(_SETTLE)

    def _scope_keys(self, tenant_id: str, run_id: str, user_id: str | None) -> tuple[list[str], list[str]]:
        keys = [self.keys.spend_run(tenant_id, run_id), self.keys.spend_tenant(tenant_id)]
        names = [f"run:{run_id}", f"tenant:{tenant_id}"]
        if user_id is not None:
            keys.append(self.keys.spend_user(tenant_id, user_id))
            names.append(f"user:{user_id}")
        return keys, names

    def reserve(self, *, tenant_id: str, run_id: str, user_id: str | None, key: str, model: str,
                estimate: Mapping[str, int], recorded: Mapping[str, int] | None = None) -> dict[str, Any]:
        """Check every budget of (run, tenant, user) and charge ``estimate`` to each, atomically; idempotent by
        ``key`` (a reservation already held is returned as it is).

        ``recorded``: the spend the run's journal already records (``{dim: amount}``) — the run's scope starts from
        it the first time the ledger meets the run (a fork starts from the spend at its fork point; a run whose
        ledger was lost gets its scope back), and it is never charged to the tenant or the user again.

        Returns: the reservation's state ``{"state": "reserved", "model", "estimate", "user_id", "tenant_id"}``.

        Raises:
            BudgetExceededError: a budget would pass its limit; nothing was charged.
        """
        keys, names = self._scope_keys(tenant_id, run_id, user_id)
        defaults = [self.policy.defaults("run", run_id), self.policy.defaults("tenant", tenant_id)]
        if user_id is not None:
            defaults.append(self.policy.defaults("user", user_id))
        state = json.dumps({"state": "reserved", "model": model, "estimate": dict(estimate), "user_id": user_id,
                            "tenant_id": tenant_id}, sort_keys=True)
        defaults_json = json.dumps([d or {"_": None} for d in defaults])  # cjson: an empty {} decodes as an array
        args = [key, json.dumps(dict(estimate)), defaults_json, state, json.dumps(dict(recorded or {}) or {"_": 0})]
        out = _with_retries(f"reserve {key}", lambda: self._reserve(keys=keys, args=args))
        tag = _text(out[0])
        if tag == "refused":
            i, dim, limit, used, asked = int(_text(out[1])), _text(out[2]), *(int(float(_text(v))) for v in out[3:6])
            raise BudgetExceededError(scope=names[i - 1], dim=dim, limit=limit, used=used, asked=asked)
        held: dict[str, Any] = dict(json.loads(_text(out[1])))
        if tag == "ok" and len(out) > 2 and _text(out[2]):  # each limited budget's use after the charge (gauges)
            held["_use"] = [(names[int(n) - 1].partition(":")[0], d, int(float(u)), int(float(lim)))
                            for n, d, u, lim in (item.split(":") for item in _text(out[2]).split(","))]
        return held

    def settle(self, *, tenant_id: str, run_id: str, user_id: str | None, key: str, settle_key: str,
               actual: Mapping[str, int], adopt: Mapping[str, Any] | None = None,
               recorded: Mapping[str, int] | None = None) -> dict[str, Any]:
        """Replace reservation ``key``'s estimate by ``actual`` in every scope; idempotent (a settled reservation is
        returned as it is — its first settle stands, ``settle`` names it).

        ``adopt``: the reservation's state as the journal recorded it, for a reservation this run's ledger never held
        (a fork's copied step, a ledger lost and rebuilt): then only the run's scope (and its ``base``) moves from the
        estimate to the usage — the tenant and the user were charged where it was reserved.

        Returns: the state with ``"state": "settled"``, ``"usage"`` and ``"settle"`` (the settle key that stood).

        Raises:
            SettleWithoutReservationError: the ledger holds no reservation ``key`` for this run (and none adopted).
        """
        keys, _ = self._scope_keys(tenant_id, run_id, user_id)
        args = [key, settle_key, json.dumps(dict(actual)), "" if adopt is None else json.dumps(dict(adopt)),
                json.dumps(dict(recorded or {}) or {"_": 0})]
        out = _with_retries(f"settle {key}", lambda: self._settle(keys=keys, args=args))
        if _text(out[0]) == "missing":
            raise SettleWithoutReservationError(f"run {run_id}: no reservation {key} to settle (reserve first; a "
                                                "settle names the reservation its reserve returned)")
        return _settled_state(key, _text(out[1]), _text(out[2]), _text(out[3]))

    def reservation(self, tenant_id: str, run_id: str, key: str) -> dict[str, Any] | None:
        """Reservation ``key``'s state (``state`` reserved or settled, with ``usage`` and ``settle`` once settled),
        or None (never reserved)."""
        raw = self.r.hmget(self.keys.spend_run(tenant_id, run_id), [f"k:{key}", f"u:{key}", f"b:{key}"])
        if raw[0] is None:
            return None
        if raw[1] is None:
            return dict(json.loads(_text(raw[0])))
        return _settled_state(key, _text(raw[0]), _text(raw[1]), _text(raw[2]))

    def settled_by(self, tenant_id: str, run_id: str, settle_key: str) -> dict[str, Any] | None:
        """The reservation settle ``settle_key`` settled (its state), or None."""
        run_key = self.keys.spend_run(tenant_id, run_id)
        res = self.r.hget(run_key, f"s:{settle_key}")
        return None if res is None else self.reservation(tenant_id, run_id, _text(res))

    def scope(self, tenant_id: str, kind: str = "tenant", ident: str | None = None) -> dict[str, dict[str, int]]:
        """One scope's amounts: ``{"used": {dim: n}, "open": {dim: n}, "base": {dim: n}, "limit": {dim: n}}`` —
        ``base``: a run's recorded spend its scope started from (a fork's copied steps; never charged to the tenant,
        so a tenant's ``used`` is the sum of its runs' ``used - base``); ``limit``: the operator's budget, else the
        settings' default; absent dims have none."""
        if kind == "tenant":
            key, ident = self.keys.spend_tenant(tenant_id), tenant_id
        elif kind == "run":
            key = self.keys.spend_run(tenant_id, str(ident))
        else:
            key = self.keys.spend_user(tenant_id, str(ident))
        raw = {_text(k): _text(v) for k, v in (self.r.hgetall(key) or {}).items()}
        out: dict[str, dict[str, int]] = {"used": {}, "open": {}, "base": {},
                                          "limit": dict(self.policy.defaults(kind, ident))}
        for name, value in raw.items():
            part, _, dim = name.partition(":")
            if part in ("used", "open", "limit", "base") and dim in DIMS:
                out[part][dim] = int(value)
        return out

    def set_limit(self, tenant_id: str, kind: str, ident: str | None, dim: str, value: int | None) -> None:
        """An operator's budget for one scope and dim (ledger units); ``None`` removes it (the default applies)."""
        if dim not in DIMS:
            raise SpendValueError(f"unknown dim {dim!r} (one of {', '.join(DIMS)})")
        key = (self.keys.spend_tenant(tenant_id) if kind == "tenant" else self.keys.spend_run(tenant_id, str(ident))
               if kind == "run" else self.keys.spend_user(tenant_id, str(ident)))
        if value is None:
            self.r.hdel(key, f"limit:{dim}")
        else:
            self.r.hset(key, f"limit:{dim}", _count_value(value, dim))


def _count_value(value: Any, dim: str) -> int:
    try:
        return Usage(input_tokens=value).input_tokens
    except SpendValueError as exc:
        raise SpendValueError(f"{dim}: {exc}") from None


def _settled_state(key: str, prior: str, usage: str, settle_key: str) -> dict[str, Any]:
    state: dict[str, Any] = dict(json.loads(prior))
    state.update(state="settled", reservation=key, usage=json.loads(usage), settle=settle_key)
    return state


def _with_retries(what: str, fn: Any) -> Any:
    """Run one ledger script, retried while Redis is unreachable or loading (the scripts are idempotent by key, so
    a retry is always safe) for up to :data:`REDIS_RETRY_S`; then raise ``ToolOutcomeUnknownError`` (the script may
    have run): the step stays intended and is reconciled by key."""
    import redis
    from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

    try:
        for attempt in Retrying(retry=retry_if_exception_type((redis.ConnectionError, redis.TimeoutError)),
                                stop=stop_after_delay(REDIS_RETRY_S), wait=wait_exponential(0.05, max=2.0),
                                reraise=True):
            with attempt:
                return fn()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise ToolOutcomeUnknownError(f"{what}: Redis unreachable for {REDIS_RETRY_S:.0f} s; the ledger may or may "
                                      "not hold it — call again to reconcile by key") from exc
    raise AssertionError("unreachable")


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


# -- the two built-in tools ----------------------------------------------------------------------------------------
class SpendReserve:
    """Built-in tool ``runjournal.spend.reserve``: ``{"model", "estimate", "user_id"}`` → the reservation."""

    name = RESERVE_TOOL
    side_effect = True
    timeout_ms = 1000  # a script's request cannot act after its connection closed: a short effect window
    outcome_commit = "strict"  # its outcome is durable before the step returns: a kill after it leaves the
    # journal saying what was reserved (a deferred outcome would leave an intent whose estimate only the ledger knows)

    def __init__(self, ledger: SpendLedger, tenant_id: str, run_id: str,
                 recorded: Mapping[str, int] | None = None, metrics: Any = None) -> None:
        self.ledger, self.tenant_id, self.run_id = ledger, tenant_id, run_id
        self.recorded = recorded
        self.metrics = metrics
        self.invoked = False

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        self.invoked = True
        try:
            state = self.ledger.reserve(tenant_id=self.tenant_id, run_id=self.run_id, user_id=args.get("user_id"),
                                        key=idempotency_key, model=args["model"], estimate=args["estimate"],
                                        recorded=self.recorded)
        except BudgetExceededError as exc:
            _meter(self.metrics, "spend_refused", exc.dim, exc.scope.partition(":")[0])
            raise
        _meter(self.metrics, "spend_reserved", args["model"], args["estimate"])
        for kind, dim, used, limit in state.get("_use", ()):  # how close each budget is to its limit, after this
            _meter(self.metrics, "spend_budget_use", self.tenant_id if kind == "tenant" else None, kind, dim, used,
                   limit)
        return _reserved(idempotency_key, state)

    def reconcile(self, idempotency_key: str) -> Outcome | None:
        """The ledger answers: held → executed (its state); absent → not executed (reserve again, same key)."""
        state = self.ledger.reservation(self.tenant_id, self.run_id, idempotency_key)
        return Outcome(executed=False) if state is None else Outcome(executed=True,
                                                                     result=_reserved(idempotency_key, state))


def _reserved(key: str, state: Mapping[str, Any]) -> dict[str, Any]:
    return {"reservation": key, "model": state["model"], "estimate": state["estimate"], "user_id": state.get("user_id")}


class SpendSettle:
    """Built-in tool ``runjournal.spend.settle``: ``{"reservation", "model", "usage", "user_id"}`` → the charge."""

    name = SETTLE_TOOL
    side_effect = True
    timeout_ms = 1000  # a script's request cannot act after its connection closed: a short effect window
    outcome_commit = "strict"  # its outcome is durable before the step returns: a kill after it leaves the
    # journal saying what was reserved (a deferred outcome would leave an intent whose estimate only the ledger knows)

    #: a settle finishes work already begun (the money is spent): an operator's stop waits for it, as for an outcome
    finishes_work = True

    def __init__(self, ledger: SpendLedger, tenant_id: str, run_id: str, metrics: Any = None, *,
                 usage: Mapping[str, int] | None = None, adopt: Mapping[str, Any] | None = None,
                 estimated: bool = False, recorded: Mapping[str, int] | None = None) -> None:
        self.ledger, self.tenant_id, self.run_id = ledger, tenant_id, run_id
        self.recorded = recorded
        self.metrics = metrics
        self.usage = dict(usage or {})
        self.adopt = adopt
        self.estimated = estimated
        self.invoked = False

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        self.invoked = True
        state = self.ledger.settle(tenant_id=self.tenant_id, run_id=self.run_id, user_id=args.get("user_id"),
                                   key=args["reservation"], settle_key=idempotency_key, actual=self.usage,
                                   adopt=self.adopt, recorded=self.recorded)
        if state.get("settle") == idempotency_key:  # this settle stood (a second one is answered with the first)
            _meter(self.metrics, "spend_settled", state["model"], state["usage"])
        return {**_settled(state), **({"estimated": True} if self.estimated else {})}

    def reconcile(self, idempotency_key: str) -> Outcome | None:
        state = self.ledger.settled_by(self.tenant_id, self.run_id, idempotency_key)
        return Outcome(executed=False) if state is None else Outcome(executed=True,
                                                                     result=_settled(state))


def _settled(state: Mapping[str, Any]) -> dict[str, Any]:
    """A settle step's recorded result; ``settled_by``: the settle the ledger took (the first) — the fold counts a
    settle only when it names itself, so a second settle of one reservation is never counted twice."""
    return {"reservation": state["reservation"], "model": state["model"], "estimate": state["estimate"],
            "usage": state["usage"], "settled_by": state.get("settle")}


class _Held:
    """What a reservation holds, and the settle step built from it (shared by :class:`Reservation` and
    :class:`AsyncReservation`: the two front ends differ only in how they drive the call)."""

    def __init__(self, handle: Any, reserved: Mapping[str, Any], *, step: str | None, recorded: bool) -> None:
        self._handle = handle  # the sync RunHandle: policy, ledger, ids (no I/O)
        self.key: str = reserved["reservation"]
        self.model: str = reserved["model"]
        self.estimate: dict[str, int] = dict(reserved["estimate"])
        self.user_id: str | None = reserved.get("user_id")
        self.recorded = recorded
        self.charge: dict[str, int] | None = None
        self._step = step
        self._lock = threading.Lock()  # two threads settling one reservation: one settle, both get its charge

    def settle_step(self, usage: Usage | Mapping[str, Any] | None = None, *, input_tokens: int | None = None,
                    output_tokens: int | None = None, estimated: bool = False
                    ) -> tuple[SpendSettle, dict[str, Any], str | None]:
        """The settle as a call: ``(tool, args, step)`` for ``RunHandle.call`` / ``AsyncRunHandle.call`` (no I/O).

        Raises:
            SpendValueError / UnknownModelError: bad counts.
        """
        if usage is None:
            usage = Usage(input_tokens=input_tokens or 0, output_tokens=output_tokens or 0)
        amounts = self._handle.spend_policy().amounts(self.model, Usage.of(usage))
        # the usage is not in the step's arguments: a re-executed model call reports other usage, and its recorded
        # settle (the same step) must answer it, not refuse it as other arguments; the result records the usage
        args: dict[str, Any] = {"reservation": self.key, "model": self.model, "user_id": self.user_id}
        adopt = ({"state": "reserved", "model": self.model, "estimate": self.estimate, "user_id": self.user_id,
                  "tenant_id": self._handle.tenant_id} if self.recorded else None)
        tool = SpendSettle(self._handle.spend_ledger(), self._handle.tenant_id, self._handle.run_id,
                           _metrics_of(self._handle), usage=amounts, adopt=adopt, estimated=estimated,
                           recorded=_recorded_spend(self._handle) if adopt is not None else None)
        return tool, args, None if self._step is None else f"{self._step}/settle"

    def estimated_usage(self) -> Usage:
        """The estimate as usage (what a settle without a reported usage charges)."""
        return Usage(input_tokens=self.estimate.get("input_tokens", 0),
                     output_tokens=self.estimate.get("output_tokens", 0))

    def _settled(self, result: Mapping[str, Any]) -> dict[str, int]:
        self.charge = dict(result["usage"])
        return self.charge


class Reservation(_Held):
    """A reservation of spend for one model call (``RunHandle.reserve``); settle it with the actual usage.

    Used as a context manager, leaving the block without a settle settles at the estimate (``estimated``: the
    actual usage was not reported; the estimate stays charged). A process killed before the settle leaves the
    reservation charged at its estimate (``open`` in the ledger and the console: unknown spend).

    Attributes:
        key: the reservation's key (the reserve step's idempotency key).
        model: the model named.
        estimate: ``{dim: amount}`` reserved (:data:`DIMS`).
        recorded: True when the journal answered the reserve (a resumed or replayed run): nothing was charged now.
        charge: the settled amounts once settled, else None.
    """

    def settle(self, usage: Usage | Mapping[str, Any] | None = None, *, input_tokens: int | None = None,
               output_tokens: int | None = None, estimated: bool = False) -> dict[str, int]:
        """Settle with the actual usage (``Usage``, a provider's usage mapping, or the two counts); returns the
        charged amounts ``{dim: amount}``. A second settle returns the first's charge.

        Raises:
            SpendValueError / UnknownModelError: bad counts; nothing was published.
            SettleWithoutReservationError: the ledger has no such reservation (e.g. the ledger was wiped).
            As ``RunHandle.call`` for publishing.
        """
        with self._lock:
            if self.charge is not None:
                return self.charge
            tool, args, step = self.settle_step(usage, input_tokens=input_tokens, output_tokens=output_tokens,
                                                estimated=estimated)
            return self._settled(self._handle.call(tool, args, step=step))

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if self.charge is None and (exc is None or isinstance(exc, Exception)):
            self.settle(self.estimated_usage(), estimated=True)


class AsyncReservation(_Held):
    """:class:`Reservation` for asyncio code (``AsyncRunHandle.reserve``): ``await r.settle(usage)``, and an
    async context manager — ``async with await run.reserve(...) as r:`` — that settles at the estimate when the
    block is left without a settle. The settle is the same step as the sync one, driven by ``AsyncRunHandle.call``.

    Attributes: as :class:`Reservation`.
    """

    def __init__(self, run: Any, reserved: Mapping[str, Any], *, step: str | None, recorded: bool) -> None:
        super().__init__(run.sync, reserved, step=step, recorded=recorded)
        self._run = run

    async def settle(self, usage: Usage | Mapping[str, Any] | None = None, *, input_tokens: int | None = None,
                     output_tokens: int | None = None, estimated: bool = False) -> dict[str, int]:
        """As :meth:`Reservation.settle`, awaited.

        Raises:
            As :meth:`Reservation.settle` (publishing: as ``AsyncRunHandle.call``).
        """
        if self.charge is not None:
            return self.charge
        tool, args, step = self.settle_step(usage, input_tokens=input_tokens, output_tokens=output_tokens,
                                            estimated=estimated)
        return self._settled(await self._run.call(tool, args, step=step))

    async def __aenter__(self) -> AsyncReservation:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if self.charge is None and (exc is None or isinstance(exc, Exception)):
            await self.settle(self.estimated_usage(), estimated=True)


def reserve_step(handle: Any, model: str, *, input_tokens: int, output_tokens: int, user_id: str | None = None,
                 step: str | None = None) -> tuple[SpendReserve, dict[str, Any], str | None]:
    """The reserve as a call: ``(tool, args, step)`` for ``RunHandle.call`` / ``AsyncRunHandle.call`` — checked and
    priced here, before anything is published (no I/O). ``handle`` is the sync :class:`RunHandle` (policy, ledger,
    ids). After the call, ``not tool.invoked`` says the journal answered it (``Reservation.recorded``).

    Raises:
        SpendValueError: a bad model name or token count. UnknownModelError: prices are set and the model has none.
        InvalidIdError: a bad ``user_id``.
    """
    if not isinstance(model, str) or not model or len(model.encode("utf-8", "surrogatepass")) > 256 \
            or any(unicodedata.category(ch) in ("Cc", "Cs") for ch in model):
        raise SpendValueError(f"model must be a name of 1 … 256 bytes without control characters, not {model!r}")
    USER_ID.check_optional(user_id)
    estimate = handle.spend_policy().amounts(model, Usage(input_tokens=input_tokens, output_tokens=output_tokens))
    tool = SpendReserve(handle.spend_ledger(), handle.tenant_id, handle.run_id, _recorded_spend(handle),
                        _metrics_of(handle))
    return tool, {"model": model, "estimate": estimate, "user_id": user_id}, \
        None if step is None else f"{step}/reserve"


def reserve(handle: Any, model: str, *, input_tokens: int, output_tokens: int, user_id: str | None = None,
            step: str | None = None) -> Reservation:
    """``RunHandle.reserve``: the reserve step (see the module docstring)."""
    tool, args, key = reserve_step(handle, model, input_tokens=input_tokens, output_tokens=output_tokens,
                                   user_id=user_id, step=step)
    return Reservation(handle, handle.call(tool, args, step=key), step=step, recorded=not tool.invoked)


def _recorded_spend(handle: Any) -> dict[str, int] | None:
    """What the journal records the run spent at its resume or fork point (its plan's steps): the run scope's start
    the first time the ledger meets the run (``SpendLedger.reserve``'s ``recorded``)."""
    plan = getattr(handle, "plan", None)
    return fold_spend(plan.calls.values()).charged() if plan is not None else None


def _metrics_of(handle: Any) -> Any:
    """The handle's journal's metrics (``runjournal.producers.metrics``, opt-in), or None (a replay's handle)."""
    return getattr(getattr(handle, "journal", None), "metrics", None)


def _meter(metrics: Any, name: str, *args: Any) -> None:
    """Count ``runjournal_spend_*_total`` when there are metrics; counted by the tools, so only a step that ran now
    counts (a step the journal answers counts nothing), from the sync and the asyncio front end alike."""
    method = getattr(metrics, name, None)
    if method is not None:
        method(*args)


# -- the fold: spend from a run's execution records ----------------------------------------------------------------
@dataclass
class SpendSummary:
    """A run's spend as its journal says (a fold of its execution records; the console and ``runjournal spend``).

    Attributes:
        settled: ``{dim: amount}`` of settled reservations (actual usage).
        open: ``{dim: amount}`` reserved and not settled (unknown spend: charged at the estimate).
        unknown_reserves: reserve steps whose outcome is unknown (their estimate is not in the projection).
        by_model: model → settled ``{dim: amount}``.
        reservations, refused: counts.
    """

    settled: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DIMS, 0))
    open: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DIMS, 0))
    unknown_reserves: int = 0
    by_model: dict[str, dict[str, int]] = field(default_factory=dict)
    unknown_keys: list[str] = field(default_factory=list)
    """Idempotency keys of reserve and settle steps whose outcome the journal does not record (intended only):
    what :func:`reconciled_charge` asks the ledger about, by key."""
    reservations: int = 0
    refused: int = 0

    def charged(self) -> dict[str, int]:
        """``settled + open`` per dim — what the ledger's ``used`` holds for the run."""
        return {d: self.settled[d] + self.open[d] for d in DIMS}

    def as_dict(self) -> dict[str, Any]:
        return {"settled": self.settled, "open": self.open, "charged": self.charged(),
                "unknown_reserves": self.unknown_reserves, "unknown_keys": self.unknown_keys, "by_model": self.by_model,
                "reservations": self.reservations, "refused": self.refused}


def fold_spend(records: Iterable[Any]) -> SpendSummary:
    """Fold a run's execution records (``ExecutionRecord`` objects or their dicts, or a recovery plan's
    ``PlannedCall`` entries) into its spend.

    A COMMITTED reserve is charged at its estimate until a COMMITTED settle names it; a FAILED reserve was refused
    (nothing charged); a reserve with an unknown outcome is counted in ``unknown_reserves``.
    """
    reserved: dict[str, dict[str, Any]] = {}
    settles: list[dict[str, Any]] = []
    out = SpendSummary()
    for rec in records:
        get = rec.get if isinstance(rec, Mapping) else (lambda name, r=rec: getattr(r, name, None))
        tool = get("tool")
        if tool not in (RESERVE_TOOL, SETTLE_TOOL):
            continue
        status = str(getattr(get("status"), "value", get("status")))
        reconciled = str(getattr(get("reconciled_outcome"), "value", get("reconciled_outcome")))
        value = _record_value(get("result_json"))
        done = status in ("COMMITTED", "RECONCILED_COMMITTED") or (status == "RECONCILED" and reconciled == "COMMITTED")
        if tool == RESERVE_TOOL:
            if done and value is not None:
                reserved[value["reservation"]] = value
            elif status == "FAILED" or (status == "RECONCILED" and reconciled == "FAILED"):
                out.refused += 1
            elif not done:
                out.unknown_reserves += 1
                out.unknown_keys.append(str(get("idempotency_key") or get("call_id")))
        elif done and value is not None:
            # the settle the ledger took (a plan's entries name their key call_id: the journal's call id is the key)
            if value.get("settled_by") in (None, get("idempotency_key") or get("call_id")):
                settles.append(value)
        elif status not in ("FAILED", "RECONCILED") and not done:
            out.unknown_keys.append(str(get("idempotency_key") or get("call_id")))  # a settle of unknown outcome
    out.reservations = len(reserved)
    settled_keys = set()
    for s in settles:
        key = s.get("reservation")
        if key in settled_keys:  # records from before ``settled_by``: the first settle of a reservation stands
            continue
        settled_keys.add(key)
        model = s.get("model", "?")
        per = out.by_model.setdefault(model, dict.fromkeys(DIMS, 0))
        for d in DIMS:
            amount = int(s["usage"].get(d, 0))
            out.settled[d] += amount
            per[d] += amount
    for key, r in reserved.items():
        if key not in settled_keys:
            for d in DIMS:
                out.open[d] += int(r["estimate"].get(d, 0))
    return out


def reconciled_charge(summary: SpendSummary, ledger: SpendLedger, tenant_id: str, run_id: str) -> dict[str, int]:
    """A run's charge as the journal says, its steps of unknown outcome answered by the ledger by key — what a
    resumed run's reconcile would record (``SpendReserve.reconcile`` / ``SpendSettle.reconcile``): ``{dim: amount}``.
    Equal to the ledger's run scope ``used`` when every model call was charged exactly once.
    """
    charged = summary.charged()
    settled_reservations = set()
    for key in summary.unknown_keys:
        held = ledger.reservation(tenant_id, run_id, key)
        if held is not None:  # an unknown reserve the ledger holds: its estimate (or, settled since, its usage)
            amounts = held["usage"] if held.get("state") == "settled" else held["estimate"]
            for d in DIMS:
                charged[d] += int(amounts.get(d, 0))
            continue
        settled = ledger.settled_by(tenant_id, run_id, key)
        if settled is not None and settled["reservation"] not in settled_reservations:
            settled_reservations.add(settled["reservation"])  # an unknown settle that happened: actual for estimate
            for d in DIMS:
                charged[d] += int(settled["usage"].get(d, 0)) - int(settled["estimate"].get(d, 0))
    return charged


def _record_value(text: Any) -> dict[str, Any] | None:
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None

"""The contract between the recovery job and an agent instance that resumes a run.

The recovery job (``consumers/recovery``, docs/design/protocol.md § Recovery job) decides, per tool call,
what is done, unknown or may run, publishes RUN_RESUMED (epoch + 1) and hands the run to a
live instance. Producers must not import consumers, so the hand-over shape lives here:

* :class:`RecoveryPlan` / :class:`PlannedCall` — frozen, JSON round-trippable (``to_json`` /
  ``from_json``; the JSON carries ``"v": 1``).
* :class:`PlanStore` — Redis: the plan under ``rj:{P:r:<run_id>}:plan`` and one assignment list
  per instance, ``rj:{P:i:<instance>}:assign`` (key names: ``runjournal.core.redis_keys``).

Hand-over protocol (numbered, so both sides agree):

1. The recovery job fences the dead instance, reads, classifies (docs/design/protocol.md § Zombies).
2. It publishes RUN_RESUMED with ``seq = last + 1`` and ``epoch + 1``.
3. ``PlanStore.put(plan)`` with ``plan.last_seq`` = that RUN_RESUMED's seq and ``plan.epoch`` = the new epoch.
4. ``PlanStore.assign(run_id, producer_id)``: one script, check-and-set, that — unless the instance's
   owned set (``rj:{P:i:<instance>}:owned``) holds the run already — RPUSHes the run id onto its
   assignment list *and* SADDs it to the owned set, so the run is owned by the assignee from that moment
   (if the assignee dies before claiming, recovering the assignee finds the run). Both keys share the
   instance's hash tag: one Redis Cluster slot.
5. The instance's ``PlanStore.claim_assignment(producer_id, timeout_s)`` (BLPOP) pops the run id;
   ``Journal.resume(run_id)`` reads the plan and continues at ``seq = last_seq + 1``.

Running steps 3-4 twice is harmless: the second assign finds the run owned and adds no list entry.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson

from runjournal.core.redis_keys import RedisKeys
from runjournal.producers.errors import StalePlanError

__all__ = ["ApprovalStatus", "CallVerdict", "PlanStore", "PlannedCall", "RecoveryPlan"]

_PLAN_JSON_VERSION = 1
#: Hand runs over, check-and-set each: KEYS = owned set, assignment list, incoming set (one instance: one slot);
#: ARGV = run ids. Returns one flag per run id: 1 when assigned now, 0 when the instance already owned it (nothing
#: written for it). Either way the run leaves the incoming set: its hand-over reached the assignee.
_ASSIGN = ("local out = {} for i, run in ipairs(ARGV) do redis.call('SREM', KEYS[3], run) "
           "if redis.call('SISMEMBER', KEYS[1], run) == 1 then out[i] = 0 else "
           "redis.call('RPUSH', KEYS[2], run) redis.call('SADD', KEYS[1], run) out[i] = 1 end end return out")


#: Store a plan unless the run's stored plan has a newer epoch (check-and-set on the epoch): KEYS = the plan key;
#: ARGV = plan JSON, its epoch. Returns 1 when stored, 0 when a newer plan is there (nothing written).
_PUT = ("local cur = redis.call('GET', KEYS[1]) if cur then local ok, doc = pcall(cjson.decode, cur) "
        "if ok and type(doc) == 'table' and tonumber(doc['epoch']) and tonumber(doc['epoch']) > tonumber(ARGV[2]) "
        "then return 0 end end redis.call('SET', KEYS[1], ARGV[1]) return 1")


class CallVerdict(StrEnum):
    """How the recovery job classified one tool call (docs/design/protocol.md § Recovery job): the plan's verdict,
    not the execution record's :class:`runjournal.model.CallStatus` (which says what the journal recorded)."""

    COMMITTED = "COMMITTED"
    """TOOL_CALL_COMMITTED recorded: never re-run; the recorded result is returned."""
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
    """INTENDED without an outcome: reconcile by idempotency key, or hold for approval."""
    FAILED = "FAILED"
    """TOOL_CALL_FAILED recorded: may be retried (attempt + 1, same idempotency key)."""
    RECONCILED_COMMITTED = "RECONCILED_COMMITTED"
    """The provider confirmed it executed: treated like COMMITTED."""
    RECONCILED_NOT_EXECUTED = "RECONCILED_NOT_EXECUTED"
    """The provider confirmed it did not execute: safe to run (same idempotency key)."""
    NOT_STARTED = "NOT_STARTED"
    """No intent recorded: safe to run."""


class ApprovalStatus(StrEnum):
    """A human decision about re-running an unknown-outcome call."""

    GRANTED = "GRANTED"
    """Re-run it (same idempotency key)."""
    DENIED = "DENIED"
    """Do not re-run it; ``call`` raises ``ApprovalDeniedError``."""
    PENDING = "PENDING"
    """Requested, not decided; ``call`` raises ``OutcomeUnknownError``."""


@dataclass(frozen=True, slots=True)
class PlannedCall:
    """One tool call of a run as the recovery job classified it, keyed in the plan by idempotency key."""

    call_id: str
    """The call's id as published in its TOOL_CALL_* events."""
    tool: str
    """Tool name; a resumed step that calls another tool raises ``PlanMismatchError``."""
    status: CallVerdict
    """The classification."""
    result_json: str | None = None
    """Recorded result as canonical JSON text (COMMITTED / RECONCILED_COMMITTED), when inline."""
    result_ref: str | None = None
    """Recorded result by reference (``sha256:<hex>``, stored in Redis), when too large to inline."""
    attempts: int = 0
    """How many TOOL_CALL_INTENDED were published for it so far; the next attempt is ``attempts + 1``."""
    side_effect: bool = True
    """From the intent; a read-only call (False) of unknown outcome is simply run again."""
    args_digest: str | None = None
    """sha256 of the canonical JSON args the call was made with; a resumed step calling with other
    args raises ``PlanMismatchError`` instead of silently getting this call's result."""
    retryable: bool | None = None
    """FAILED only: the recorded ``retryable`` flag. False: resuming raises the recorded failure
    (``RecordedFailureError``) instead of running the tool again — the run already decided around it."""
    error: str | None = None
    """FAILED only: the recorded error text."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (status as its string)."""
        return {
            "call_id": self.call_id,
            "tool": self.tool,
            "status": self.status.value,
            "result_json": self.result_json,
            "result_ref": self.result_ref,
            "attempts": self.attempts,
            "side_effect": self.side_effect,
            "args_digest": self.args_digest,
            "retryable": self.retryable,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlannedCall:
        """Inverse of :meth:`to_dict`. Raises ValueError on an unknown status."""
        return cls(
            call_id=str(data["call_id"]),
            tool=str(data["tool"]),
            status=CallVerdict(data["status"]),
            result_json=data.get("result_json"),
            result_ref=data.get("result_ref"),
            attempts=int(data.get("attempts", 0)),
            side_effect=bool(data.get("side_effect", True)),
            args_digest=data.get("args_digest"),
            retryable=data.get("retryable"),
            error=data.get("error"),
        )


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    """What the recovery job decided for one run; ``Journal.resume`` continues the run from it."""

    run_id: str
    """The run."""
    tenant_id: str
    """Its tenant."""
    agent: str
    """Its agent (from RUN_STARTED)."""
    epoch: int
    """The NEW ownership epoch (the one RUN_RESUMED carries); the resumed handle writes with it."""
    last_seq: int
    """The seq of the RUN_RESUMED event the recovery job published; the handle continues at +1."""
    calls: Mapping[str, PlannedCall] = field(default_factory=dict)
    """idempotency_key -> classified call."""
    approvals: Mapping[str, ApprovalStatus] = field(default_factory=dict)
    """call_id -> approval decision, for calls that had an approval requested."""
    created_at_ms: int = 0
    """When the plan was made, Unix epoch milliseconds."""
    node_attempts: Mapping[str, int] = field(default_factory=dict)
    """node path -> how many NODE_STARTED it had so far; a re-entered node starts at attempt + 1."""
    assigned_to: str | None = None
    """producer_id of the instance the run was handed to, when assigned."""
    fork_lineage: tuple[str, ...] = ()
    """A forked run's source, that run's source …: a call whose key derived with one of them is in :attr:`calls`
    keeps that key (a copied call of the source: its recorded outcome answers it); every other call derives its key
    from this run (docs/design/decisions/0049-fork.md)."""
    input_json: str | None = None
    """The run's input (RUN_STARTED ``input_json``), for the code that continues it."""
    user_id: str | None = None
    """The run's user (RUN_STARTED ``user_id``): with encryption on, whose key seals the content the resumed run
    writes (docs/design/decisions/0059-encryption-and-crypto-shredding.md)."""

    def to_json(self) -> str:
        """The plan as JSON text (``"v": 1``; keys sorted, so equal plans give equal text)."""
        data = {
            "v": _PLAN_JSON_VERSION,
            "run_id": self.run_id,
            "tenant_id": self.tenant_id,
            "agent": self.agent,
            "epoch": self.epoch,
            "last_seq": self.last_seq,
            "calls": {k: c.to_dict() for k, c in self.calls.items()},
            "approvals": {k: ApprovalStatus(v).value for k, v in self.approvals.items()},
            "created_at_ms": self.created_at_ms,
            "node_attempts": dict(self.node_attempts),
            "assigned_to": self.assigned_to,
            **({"fork_lineage": list(self.fork_lineage)} if self.fork_lineage else {}),
            **({"input_json": self.input_json} if self.input_json is not None else {}),
            **({"user_id": self.user_id} if self.user_id is not None else {}),
        }
        try:  # orjson with sorted keys writes what json.dumps(sort_keys=True, separators=(",", ":")) does for ASCII
            return orjson.dumps(data, option=orjson.OPT_SORT_KEYS).decode("utf-8")
        except orjson.JSONEncodeError:  # e.g. a lone surrogate (never so for decoded events): json escapes it
            return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> RecoveryPlan:
        """Parse :meth:`to_json` output.

        Raises:
            ValueError: not JSON, an unsupported ``"v"``, or an unknown status.
        """
        data = json.loads(text)
        if data.get("v") != _PLAN_JSON_VERSION:
            raise ValueError(f"unsupported recovery plan version {data.get('v')!r}")
        return cls(
            run_id=data["run_id"],
            tenant_id=data["tenant_id"],
            agent=data["agent"],
            epoch=int(data["epoch"]),
            last_seq=int(data["last_seq"]),
            calls={k: PlannedCall.from_dict(v) for k, v in data.get("calls", {}).items()},
            approvals={k: ApprovalStatus(v) for k, v in data.get("approvals", {}).items()},
            created_at_ms=int(data.get("created_at_ms", 0)),
            node_attempts={k: int(v) for k, v in data.get("node_attempts", {}).items()},
            assigned_to=data.get("assigned_to"),
            fork_lineage=tuple(data.get("fork_lineage") or ()),
            input_json=data.get("input_json"),
            user_id=data.get("user_id"),
        )


class PlanStore:
    """Recovery plans and run assignments in Redis (see the module docstring for the protocol).

    Args:
        redis_client: a client from ``runjournal.core.redis_client`` (thread-safe; ``decode_responses`` either way).
        prefix: key prefix, normally ``settings.topic_prefix``. Keys (``runjournal.core.redis_keys``):
            ``rj:{P:r:<run_id>}:plan`` (string, JSON), ``rj:{P:i:<instance>}:assign`` (list of run ids),
            ``rj:{P:i:<instance>}:owned`` (set of run ids).

    Raises:
        redis.RedisError: from any method when Redis fails (not wrapped: the store is a thin adapter).
    """

    def __init__(self, redis_client: Any, prefix: str) -> None:
        self._r = redis_client
        self._prefix = prefix
        self._keys = RedisKeys(prefix)
        self._assign = redis_client.register_script(_ASSIGN)
        self._put = redis_client.register_script(_PUT)

    def plan_key(self, run_id: str) -> str:
        """``rj:{P:r:<run_id>}:plan``."""
        return self._keys.plan(run_id)

    def assign_key(self, producer_id: str) -> str:
        """``rj:{P:i:<instance>}:assign``."""
        return self._keys.assign(producer_id)

    def owned_key(self, producer_id: str) -> str:
        """``rj:{P:i:<instance>}:owned``."""
        return self._keys.owned(producer_id)

    def put(self, plan: RecoveryPlan) -> bool:
        """Store ``plan``, check-and-set on the epoch: an earlier plan of the run is replaced, a newer one (a later
        recovery's) is kept. Returns True when stored, False when a newer plan is there (nothing written)."""
        return bool(int(self._put(keys=[self.plan_key(plan.run_id)], args=[plan.to_json(), plan.epoch])))

    def put_many(self, plans: Iterable[RecoveryPlan]) -> dict[str, Exception]:
        """Store every plan as :meth:`put` does (check-and-set on the epoch), one pipelined script call each (one
        run's slot per command; not atomic across runs).

        Returns:
            run_id -> why each plan not stored was not: a Redis error, or :class:`StalePlanError` when the run
            already has a plan of a newer epoch (a later recovery took it). Empty when all are stored.

        Raises:
            redis.RedisError: the pipeline itself failed (connection lost …): any of the plans may be stored.
        """
        todo = list(plans)
        if not todo:
            return {}
        pipe = self._r.pipeline(transaction=False)
        for plan in todo:
            # EVAL through execute_command: a cluster pipeline has no eval() method, and EVAL (not EVALSHA) needs no
            # script loaded on each node. The key after numkeys routes it to the run's slot.
            pipe.execute_command("EVAL", _PUT, 1, self.plan_key(plan.run_id), plan.to_json(), plan.epoch)
        replies = pipe.execute(raise_on_error=False)
        out: dict[str, Exception] = {}
        for plan, reply in zip(todo, replies, strict=True):
            if isinstance(reply, Exception):
                out[plan.run_id] = reply
            elif not int(reply):
                out[plan.run_id] = StalePlanError(
                    f"run {plan.run_id} already has a plan newer than epoch {plan.epoch}: a later recovery took it",
                    plan_epoch=plan.epoch, newest_epoch=plan.epoch + 1)
        return out

    def get(self, run_id: str) -> RecoveryPlan | None:
        """The run's plan, or None when there is none."""
        raw = self._r.get(self.plan_key(run_id))
        return None if raw is None else RecoveryPlan.from_json(raw)

    def delete(self, run_id: str) -> None:
        """Remove the run's plan (harmless when absent)."""
        self._r.delete(self.plan_key(run_id))

    def assign(self, run_id: str, producer_id: str) -> bool:
        """Hand ``run_id`` to instance ``producer_id``: RPUSH to its assignment list and SADD to its owned set,
        in one script, unless its owned set holds the run already (check-and-set: never a second list entry).
        Store the plan with :meth:`put` first.

        Returns:
            True when assigned now; False when the instance already owned the run (nothing written).
        """
        return self.assign_many(producer_id, [run_id]) == [True]

    def assign_many(self, producer_id: str, run_ids: Sequence[str]) -> list[bool]:
        """:meth:`assign` for many runs in one script (the instance's keys: one slot), check-and-set per run.
        Store their plans first. Keep ``run_ids`` to a few hundred: the script holds Redis while it runs.

        Returns:
            One flag per run id, in order: True when assigned now, False when already owned (nothing written).

        Raises:
            redis.RedisError: the script failed; the runs before the failing one may be assigned (run it again:
                each assignment is check-and-set).
        """
        if not run_ids:
            return []
        flags = self._assign(keys=[self.owned_key(producer_id), self.assign_key(producer_id),
                                   self._keys.incoming(producer_id)], args=list(run_ids))
        return [bool(int(f)) for f in flags]

    def incoming_key(self, producer_id: str) -> str:
        """``rj:{P:i:<instance>}:incoming``: runs being handed to the instance (their RUN_RESUMED may be committed)."""
        return self._keys.incoming(producer_id)

    def mark_incoming(self, assignments: Mapping[str, Sequence[str]]) -> None:
        """Before a pass commits RUN_RESUMED: put each run in its assignee's incoming set (assignee → run ids; one
        SADD per assignee, pipelined, each in the assignee's slot). A pass killed after the commit and before the
        hand-over leaves the run there for the next pass to find (``consumers.recovery``).

        Raises:
            redis.RedisError: Redis failed; nothing may be committed then.
        """
        pipe = self._r.pipeline(transaction=False)
        for assignee, runs in assignments.items():
            if runs:
                pipe.sadd(self._keys.incoming(assignee), *runs)
        pipe.execute()

    def clear_incoming(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Take each ``(instance, run_id)`` off the instance's incoming set (pipelined; each in its slot).

        Raises:
            redis.RedisError: Redis failed (running it again is harmless).
        """
        pipe = self._r.pipeline(transaction=False)
        for instance, run_id in pairs:
            pipe.srem(self._keys.incoming(instance), run_id)
        pipe.execute()

    def unassign(self, run_id: str, producer_id: str) -> None:
        """Take ``run_id`` off ``producer_id``'s assignment list (a caller that resumes it directly)."""
        self._r.lrem(self.assign_key(producer_id), 0, run_id)

    def claim_assignment(self, producer_id: str, timeout_s: float) -> str | None:
        """Pop the next run assigned to ``producer_id``, waiting up to ``timeout_s`` seconds.

        Args:
            producer_id: the claiming instance.
            timeout_s: seconds to block (BLPOP); <= 0 means do not block (LPOP).

        Returns:
            The run id, or None when nothing was assigned within the timeout.
        """
        key = self.assign_key(producer_id)
        if timeout_s <= 0:
            raw = self._r.lpop(key)
        else:
            popped = self._r.blpop([key], timeout=timeout_s)
            raw = None if popped is None else popped[1]
        if raw is None:
            return None
        return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)

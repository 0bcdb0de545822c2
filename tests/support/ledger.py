"""A provider whose ledger is Redis: the independent witness of how many times an effect ran, by key.

``LedgerTool`` is a side-effecting tool: each execution ``HINCRBY {ns}:ledger:runs {key} 1`` and
``SADD {ns}:ledger:logical:{logical} {key}`` (``logical`` is the args' ``logical`` field: the test's
name for one logical call), then answers ``result``. It reconciles by key from the same ledger.
Nothing here goes through runjournal: Redis is written by the tool only, as a real provider would.

Behaviours (``then``): ``"return"`` (default), ``"raise_before"`` (a definite failure, nothing
executed), ``"timeout_after"`` (executed, then ``TimeoutError``: the reply was lost),
``"unknown_after"`` (executed, then ``ToolOutcomeUnknownError`` when available).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from runjournal.producers.tools import Outcome


@dataclass
class Ledger:
    """Reads of the witness."""

    client: redis.Redis
    ns: str

    @property
    def runs_key(self) -> str:
        return f"{self.ns}:ledger:runs"

    def logical_key(self, logical: str) -> str:
        return f"{self.ns}:ledger:logical:{logical}"

    def executions(self, key: str | None = None) -> int:
        """Executions of ``key`` (or of every key)."""
        if key is not None:
            return int(self.client.hget(self.runs_key, key) or 0)
        return sum(int(v) for v in self.client.hvals(self.runs_key))

    def keys_of(self, logical: str) -> set[str]:
        """Idempotency keys the provider saw for one logical call."""
        return {k.decode() for k in self.client.smembers(self.logical_key(logical))}

    def executed_keys(self) -> dict[str, int]:
        """key -> executions."""
        return {k.decode(): int(v) for k, v in self.client.hgetall(self.runs_key).items()}

    def logicals(self) -> dict[str, set[str]]:
        """logical call -> keys the provider saw."""
        head = self.logical_key("")
        return {k.decode()[len(head):]: self.keys_of(k.decode()[len(head):])
                for k in self.client.scan_iter(match=f"{head}*", count=1000)}


@dataclass
class LedgerTool:
    """A side-effecting tool executed against the Redis ledger (see the module docstring)."""

    ledger: Ledger
    result: Any = "ok"
    name: str = "book"
    then: str = "return"
    timeout_ms: int = 50
    side_effect: bool = True
    seen: list[str] = field(default_factory=list)
    before: Callable[[], None] | None = None
    """Called before the effect (may raise: a definite failure)."""
    after: Callable[[], None] | None = None
    """Called after the effect, before answering (may raise: the answer is lost)."""

    def answer(self, idempotency_key: str) -> Any:
        """What the call under ``idempotency_key`` answers (:attr:`result`); computed per call, never kept on the
        tool, so calls made at once on one tool each get their own answer."""
        return self.result

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        self.seen.append(idempotency_key)
        result = self.answer(idempotency_key)
        if self.before is not None:
            self.before()
        if self.then == "raise_before":
            raise RuntimeError("provider refused the request")
        pipe = self.ledger.client.pipeline(transaction=True)
        pipe.hincrby(self.ledger.runs_key, idempotency_key, 1)
        pipe.sadd(self.ledger.logical_key(str(args.get("logical", "?"))), idempotency_key)
        pipe.hset(f"{self.ledger.ns}:ledger:results", idempotency_key, json.dumps(_jsonable(result)))
        pipe.execute()
        if self.after is not None:
            self.after()
        if self.then == "timeout_after":
            err = TimeoutError("read timed out")
            err.retryable = True  # type: ignore[attr-defined]
            raise err
        if self.then == "unknown_after":
            from runjournal.producers import tools

            raise tools.ToolOutcomeUnknownError("connection reset after the request was sent")
        return result

    def reconcile(self, idempotency_key: str) -> Outcome | None:
        """The ledger's record of ``idempotency_key``."""
        raw = self.ledger.client.hget(f"{self.ledger.ns}:ledger:results", idempotency_key)
        if raw is None:
            return Outcome(executed=False)
        return Outcome(executed=True, result=json.loads(raw))


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value

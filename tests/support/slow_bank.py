"""A slow bank for clock-skew tests: a transfer request is queued in Redis and applied ``apply_after_s`` later by
the bank's own thread — after the requester may have died — as a real provider acting on a request it received
before a crash does. ``timeout_ms`` of the tool is the bank's promise: a request acts within it or never.

``TransferTool`` (the requester's side) pushes ``{key}`` to ``{ns}:bank:queue`` and waits for the bank's answer;
``reconcile`` asks the ledger by key. ``Bank`` (the test's side) applies queued requests: ``HINCRBY
{ns}:bank:applied {key} 1`` — the witness of how many times the transfer really happened. Nothing here goes through
runjournal.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import redis

from runjournal.producers.tools import Outcome


@dataclass
class TransferTool:
    """Send a transfer request to the bank and wait up to ``timeout_ms`` for it to be applied."""

    client: redis.Redis
    ns: str
    name: str = "transfer"
    side_effect: bool = True
    timeout_ms: int = 4000

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        self.client.rpush(f"{self.ns}:bank:queue", idempotency_key)
        deadline = time.monotonic() + self.timeout_ms / 1000
        while time.monotonic() < deadline:
            if self.client.hget(f"{self.ns}:bank:applied", idempotency_key):
                return {"transferred": args["amount"]}
            time.sleep(0.05)
        raise TimeoutError("the bank did not answer within the tool's timeout")

    def reconcile(self, idempotency_key: str) -> Outcome | None:
        done = self.client.hget(f"{self.ns}:bank:applied", idempotency_key)
        return Outcome(executed=bool(done), result={"transferred": "reconciled"} if done else None)


class Bank:
    """Applies each queued request ``apply_after_s`` after it arrived (a thread; :meth:`stop` ends it)."""

    def __init__(self, client: redis.Redis, ns: str, apply_after_s: float) -> None:
        self.client, self.ns, self.apply_after_s = client, ns, apply_after_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            got = self.client.blpop([f"{self.ns}:bank:queue"], timeout=0.2)
            if got is None:
                continue
            key = got[1].decode()
            threading.Timer(self.apply_after_s, self._apply, args=(key,)).start()

    def _apply(self, key: str) -> None:
        self.client.hincrby(f"{self.ns}:bank:applied", key, 1)

    def applied(self) -> dict[str, int]:
        """key -> times the transfer was applied."""
        return {k.decode(): int(v) for k, v in self.client.hgetall(f"{self.ns}:bank:applied").items()}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

"""Demo tools: side-effecting ones call the provider process; read-only ones answer from the recording."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

from runjournal.producers.tools import Outcome

__all__ = ["FencedByProvider", "ProviderTool", "RecordedTool"]


class FencedByProvider(RuntimeError):
    """The provider refused the request: a newer epoch of this run exists (this writer is a zombie)."""


@dataclass
class ProviderTool:
    """A side-effecting tool executed by the provider process, with reconcile-by-key and an epoch fencing token.

    Args:
        name: tool name.
        base_url: the provider's URL (``http://127.0.0.1:<port>``).
        run_id: the run, for the provider's fence.
        epoch: this handle's epoch, sent with every request (the fencing token).
        result: the recorded result the provider returns.
        timeout_ms: how long a request may still act after it was sent (ms); recorded in the intent.
    """

    name: str
    base_url: str
    run_id: str
    epoch: int
    result: str
    timeout_ms: int = 2000
    side_effect: bool = True

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        """Execute at the provider; returns the recorded result string.

        Raises:
            FencedByProvider: the provider has seen a newer epoch of the run.
            httpx.HTTPError: transport failure (the outcome is then unknown to the caller).
        """
        body = {"tool": self.name, "args": args, "idempotency_key": idempotency_key, "run_id": self.run_id,
                "epoch": self.epoch, "result": self.result}
        resp = httpx.post(f"{self.base_url}/execute", json=body, timeout=self.timeout_ms / 1000)
        if resp.status_code == 409:
            raise FencedByProvider(json.dumps(resp.json()))
        resp.raise_for_status()
        return resp.json()["result"]

    def reconcile(self, idempotency_key: str) -> Outcome | None:
        """Fence older epochs at the provider, then ask whether ``idempotency_key`` was executed."""
        resp = httpx.post(f"{self.base_url}/lookup", json={"idempotency_key": idempotency_key, "run_id": self.run_id,
                                                           "fence_epoch": self.epoch}, timeout=10)
        resp.raise_for_status()
        data = resp.json()
        return Outcome(executed=bool(data["executed"]), result=data.get("result"))


@dataclass
class RecordedTool:
    """A read-only tool answering with the trajectory's recorded result (no provider round trip)."""

    name: str
    result: str
    side_effect: bool = False
    timeout_ms: int = 1000

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        """Return the recorded result."""
        return self.result

"""The journaled-tool wrapper on its own (no stack): how the key reaches a function, sync and async."""

from __future__ import annotations

import asyncio
from typing import Any

from runjournal.adapters import JournaledTool, current_idempotency_key, journaled
from runjournal.producers.tools import Outcome, Reconcilable, Tool


def test_the_key_reaches_a_function_as_an_argument_or_through_the_context() -> None:
    seen: list[Any] = []

    def with_param(to: str, idempotency_key: str) -> str:
        seen.append((idempotency_key, current_idempotency_key()))
        return to

    def without(to: str) -> str:
        seen.append(current_idempotency_key())
        return to

    assert journaled(with_param)({"to": "bob"}, "k1") == "bob"
    assert journaled(without)({"to": "ann"}, "k2") == "ann"
    assert seen == [("k1", "k1"), "k2"] and current_idempotency_key() is None


def test_async_functions_and_hooks() -> None:
    async def send(to: str) -> str:
        await asyncio.sleep(0)
        return f"{to}:{current_idempotency_key()}"

    async def lookup(key: str) -> Outcome:
        return Outcome(executed=True, result=key)

    tool = journaled(send, name="send", reconcile=lookup, timeout_ms=5)
    assert isinstance(tool, Tool) and isinstance(tool, Reconcilable) and tool.name == "send"
    assert asyncio.run(tool.acall({"to": "bob"}, "k3")) == "bob:k3"
    assert tool({"to": "bob"}, "k4") == "bob:k4"  # an async function driven by a sync handle
    assert asyncio.run(tool.areconcile("k5")) == Outcome(True, "k5") == tool.reconcile("k5")


def test_without_a_reconcile_hook_the_protocol_sees_none() -> None:
    tool = JournaledTool(lambda: None, name="noop", side_effect=False)
    assert tool.reconcile is None and tool.side_effect is False and tool.timeout_ms == 30_000
    assert asyncio.run(tool.areconcile("k")) is None


def test_a_journaled_tool_may_opt_out_of_group_commit() -> None:
    """``journaled(reconcile=…, outcome_commit="strict")``: for a provider whose reconcile may answer None; the
    protocol then commits the outcome before ``call`` returns (tests/producers/test_group_commit.py)."""
    import pytest

    tool = journaled(lambda: 1, reconcile=lambda key: None, outcome_commit="strict")
    assert tool.outcome_commit == "strict" and callable(tool.reconcile)
    assert journaled(lambda: 1).outcome_commit is None
    with pytest.raises(ValueError, match="outcome_commit"):
        journaled(lambda: 1, outcome_commit="group")

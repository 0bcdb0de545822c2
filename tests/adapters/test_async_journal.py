"""The asyncio front end on the real broker and Redis: the sync protocol's guarantees, from async code.

The Redis ledger (``tests.support.ledger``) is the witness of every effect. The 100 × 10 case is the issue's
acceptance load; its event-loop lag is measured by ``make bench`` (pair 7), not asserted here.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import redis

from runjournal.adapters import current_idempotency_key, journaled
from runjournal.consumers.ops.inspect import read_run_events
from runjournal.core.settings import Settings
from runjournal.producers import OutcomeUnknownError, idempotency_key
from runjournal.producers.aio import AsyncJournal
from runjournal.producers.tools import Outcome
from tests.support.ledger import Ledger, LedgerTool

pytestmark = [pytest.mark.integration]


class AsyncLedgerTool(LedgerTool):
    """The ledger tool with a coroutine ``acall`` (awaited on the loop by the async driver)."""

    async def acall(self, args: dict[str, Any], idempotency_key: str) -> Any:
        await asyncio.sleep(0.001)
        return self(args, idempotency_key)


def ledger(settings: Settings) -> Ledger:
    return Ledger(redis.Redis.from_url(settings.redis_url), f"{settings.topic_prefix}-{uuid.uuid4().hex[:6]}")


def test_100_concurrent_runs_of_10_calls_each_effect_once(topics: Settings) -> None:
    book = ledger(topics)
    tool = AsyncLedgerTool(book, result={"ok": True})

    async def one_run(journal: AsyncJournal, n: int) -> list[Any]:
        run = await journal.start_run("acme", "load", {"n": n}, run_id=f"async-{n}")
        out = []
        async with run.node("work"):
            for i in range(10):
                out.append(await run.call(tool, {"logical": f"{n}-{i}", "i": i}))
        await run.succeed({"calls": len(out)})
        return out

    async def main() -> list[list[Any]]:
        async with await AsyncJournal.open(topics, producer_id="async-load") as journal:
            return await asyncio.gather(*(one_run(journal, n) for n in range(100)))

    results = asyncio.run(main())
    assert all(r == [{"ok": True}] * 10 for r in results)
    executed = book.executed_keys()
    assert len(executed) == 1000 and set(executed.values()) == {1}, "every effect exactly once"
    assert all(len(book.keys_of(f"{n}-{i}")) == 1 for n in range(100) for i in range(10))
    assert executed.keys() == {idempotency_key(f"async-{n}", "work", i) for n in range(100) for i in range(1, 11)}


def test_async_handle_follows_the_same_protocol(topics: Settings) -> None:
    """Sync and coroutine tools, the key handed over, intent before effect, the unknown outcome reconciled by key,
    nodes and the recorded value — the sync handle's rules, driven from asyncio."""
    book = ledger(topics)
    seen: list[str | None] = []

    @journaled(name="quote", side_effect=False)
    def quote(city: str) -> dict[str, Any]:
        seen.append(current_idempotency_key())
        return {"city": city, "price": (1, 2)}

    async def book_room(city: str, idempotency_key: str) -> str:
        book.client.hincrby(book.runs_key, idempotency_key, 1)
        if len(seen) == 1:  # the first attempt: the effect happened, the answer is lost
            seen.append("lost")
            raise TimeoutError("read timed out")
        return "room-1"

    def lookup(key: str) -> Outcome:
        return Outcome(executed=bool(book.executions(key)), result="room-1")

    room = journaled(book_room, name="book", timeout_ms=10, reconcile=lookup)

    async def main() -> None:
        async with await AsyncJournal.open(topics, producer_id="async-proto") as journal:
            run = await journal.start_run("acme", "proto", {}, run_id="async-proto")
            async with run.node("plan") as path:
                assert path == "plan"
                assert await run.call(quote, {"city": "Oslo"}) == {"city": "Oslo", "price": [1, 2]}
                with pytest.raises(OutcomeUnknownError):
                    await run.call(room, {"city": "Oslo"})
                assert await run.call(room, {"city": "Oslo"}) == "room-1"  # reconciled: not run again
            await run.message("assistant", "booked")
            await run.succeed("done")
            assert run.finished

    asyncio.run(main())
    key = idempotency_key("async-proto", "plan", 2)
    assert book.executions(key) == 1
    assert seen[0] == idempotency_key("async-proto", "plan", 1)
    types = [r["type"] for r in read_run_events(topics, "async-proto")]
    assert types == ["RUN_STARTED", "NODE_STARTED", "TOOL_CALL_INTENDED", "TOOL_CALL_COMMITTED",
                     "TOOL_CALL_INTENDED", "TOOL_CALL_RECONCILED", "NODE_SUCCEEDED", "MESSAGE", "RUN_SUCCEEDED"]


def test_a_cancelled_call_stays_intended_and_is_reconciled_not_rerun(topics: Settings) -> None:
    """Cancelling the task while the tool runs is an interruption: the call stays intended (unknown); the next
    call at the same step reconciles it by key instead of sending it again."""
    book = ledger(topics)
    started = asyncio.Event()

    async def send(to: str, idempotency_key: str) -> str:
        book.client.hincrby(book.runs_key, idempotency_key, 1)
        started.set()
        await asyncio.sleep(30)
        return "sent"

    def lookup(key: str) -> Outcome:
        return Outcome(executed=bool(book.executions(key)), result="sent")

    tool = journaled(send, name="send", timeout_ms=10, reconcile=lookup)

    async def main() -> None:
        async with await AsyncJournal.open(topics, producer_id="async-cancel") as journal:
            run = await journal.start_run("acme", "cancel", {}, run_id="async-cancel")
            task = asyncio.create_task(run.call(tool, {"to": "bob"}, step="call-1"))
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await run.call(tool, {"to": "bob"}, step="call-1") == "sent"
            await run.succeed()

    asyncio.run(main())
    assert book.executions() == 1

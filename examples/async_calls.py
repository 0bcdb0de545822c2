"""Many runs at once from asyncio: AsyncJournal, journaled coroutine tools, every effect once.

    runjournal stack up && runjournal topics create
    python examples/async_calls.py --runs 20 --calls 5

Each run books ``--calls`` rooms through a coroutine tool that receives the journal's idempotency key; the
intent is acknowledged by the broker before the tool runs and the outcome after it. Offline: no model, no
network beyond the local stack. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid

from runjournal import AsyncJournal, Settings, journaled

BOOKED: dict[str, int] = {}


@journaled(name="book_room", timeout_ms=5_000)
async def book_room(city: str, night: int, idempotency_key: str) -> dict[str, object]:
    """A provider call, deduplicated by the key (here: a dict standing in for the provider's ledger)."""
    await asyncio.sleep(0.001)
    BOOKED[idempotency_key] = BOOKED.get(idempotency_key, 0) + 1
    return {"city": city, "night": night, "confirmation": idempotency_key[:8]}


async def main(runs: int, calls: int) -> dict[str, object]:
    tag = uuid.uuid4().hex[:8]
    async with await AsyncJournal.open(Settings.load(), producer_id=f"example-async-{tag}") as journal:
        async def one(n: int) -> int:
            run = await journal.start_run("example", "booker", {"n": n}, run_id=f"example-async-{tag}-{n}")
            async with run.node("book"):
                for night in range(calls):
                    await run.call(book_room, {"city": "Oslo", "night": night})
            await run.succeed({"nights": calls})
            return calls

        done = await asyncio.gather(*(one(n) for n in range(runs)))
    return {"runs": runs, "calls": sum(done), "effects": sum(BOOKED.values()), "distinct_keys": len(BOOKED)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()
    summary = asyncio.run(main(args.runs, args.calls))
    print(json.dumps(summary))
    raise SystemExit(0 if summary["effects"] == summary["calls"] == summary["distinct_keys"] else 1)

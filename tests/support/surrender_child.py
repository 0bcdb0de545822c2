"""Child agent for the surrender crash test: one run whose intent's acknowledgement is lost (the handle breaks and
the instance surrenders the run); the test arms ``RJ_FAILPOINTS`` so the process is SIGKILLed inside the surrender.

Usage: ``python -m tests.support.surrender_child RUN_ID PRODUCER_ID NS`` with the service env. Prints ``broken``
once the handle refused the call; then waits to be killed.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from runjournal.core import redis_client
from runjournal.core.settings import Settings
from runjournal.producers import DeliveryError, Journal, TransactionAbortedError
from runjournal.schemas import Event, EventType
from tests.support.ledger import Ledger, LedgerTool


def _lose_intent_ack(journal: Journal) -> None:
    real = journal.publish
    left = {"n": 1}

    def publish(event: Event, *, durable: bool, on_lost: Any = None, **how: Any) -> None:
        real(event, durable=durable, on_lost=on_lost, **how)
        if event.type is EventType.TOOL_CALL_INTENDED and left["n"]:
            left["n"] -= 1
            journal.flush()
            lost = TransactionAbortedError("injected: the ack of the intent was lost")
            lost.retryable, lost.ambiguous = False, True
            raise lost

    journal.publish = publish  # type: ignore[method-assign]


def main() -> None:
    run_id, producer_id, ns = sys.argv[1:4]
    settings = Settings.load()
    tool = LedgerTool(Ledger(redis_client.client(settings), ns), name="book", result={"booked": 1})
    with Journal(settings, producer_id=producer_id, lease_ttl_ms=1500) as journal:
        handle = journal.start_run("tenant-a", "booker", {}, run_id=run_id)
        _lose_intent_ack(journal)
        try:
            handle.call(tool, {"logical": "a"})
        except DeliveryError:
            print("broken", flush=True)
        time.sleep(60)  # the surrender thread is SIGKILLed at its armed failpoint meanwhile


if __name__ == "__main__":
    main()

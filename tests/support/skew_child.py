"""Child agent for clock-skew tests (run under libfaketime with the writer's clock off): one run, one transfer
through :class:`tests.support.slow_bank.TransferTool`; the test SIGKILLs it while the bank holds the request.

Usage: ``python -m tests.support.skew_child RUN_ID PRODUCER_ID SKEW_S`` with the service env. Prints ``sent`` once
the request is queued.

The skew: this process's wall clock (``time.time`` / ``time.time_ns``, which every wall time the journal writes is
read from — ``occurred_at``, lease ``started_at_ms``) runs ``SKEW_S`` seconds off; its monotonic clock does not.
libfaketime would skew the C library's clock too, but librdkafka's timed waits then never end (its metadata
request times out under any offset), so the skew is applied where the journal reads the time.
"""

from __future__ import annotations

import sys

from runjournal.core import redis_client
from runjournal.core.settings import Settings
from runjournal.demo.agent import skew_wall_clock
from runjournal.producers import Journal
from tests.support.slow_bank import TransferTool


class _Announcing(TransferTool):
    def __call__(self, args, idempotency_key):  # noqa: ANN001, ANN204
        self.client.rpush(f"{self.ns}:bank:queue", idempotency_key)
        print("sent", flush=True)
        self.client.blpop([f"{self.ns}:never"], timeout=0)  # waits for the answer until killed
        raise AssertionError("unreachable")


def main() -> None:
    run_id, producer_id = sys.argv[1:3]
    if len(sys.argv) > 3 and int(sys.argv[3]):
        skew_wall_clock(int(sys.argv[3]))  # the demo agent's --clock-skew-s, before any Journal exists
    settings = Settings.load()
    tool = _Announcing(redis_client.client(settings), settings.topic_prefix)
    with Journal(settings, producer_id=producer_id, lease_ttl_ms=1000) as journal:
        handle = journal.start_run("tenant-a", "payer", {"to": "bob"}, run_id=run_id)
        with handle.node("pay"):
            handle.call(tool, {"to": "bob", "amount": 100})


if __name__ == "__main__":
    main()

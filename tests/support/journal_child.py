"""Child process for the SIGKILL crash tests: one run, one side-effecting call, then block.

Usage: ``python journal_child.py MODE RUN_ID PRODUCER_ID SIGNAL_FILE`` with the service env
(``RUNJOURNAL_*``). The counting tool INCRs ``{prefix}:witness:{run_id}`` in Redis — an
independent witness of how many times the side effect ran.

MODE ``in-tool``: the tool INCRs, writes SIGNAL_FILE, then sleeps (parent SIGKILLs).
MODE ``before-intent-ack``: the journal blocks right before the ``commit_transaction`` that would
acknowledge TOOL_CALL_INTENDED, writes SIGNAL_FILE, sleeps (parent SIGKILLs); the tool never runs.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from runjournal.core import redis_client
from runjournal.core.settings import Settings
from runjournal.producers import Journal
from runjournal.producers._txn import TxnPublisher


def _signal_and_hang(path: Path) -> None:
    path.write_text("ready")
    while True:
        time.sleep(60)


def main() -> None:
    mode, run_id, producer_id, signal_file = sys.argv[1:5]
    settings = Settings.load()
    r = redis_client.client(settings)
    witness = f"{settings.topic_prefix}:witness:{run_id}"
    signal = Path(signal_file)

    class CountingTool:
        name = "send_email"
        side_effect = True
        timeout_ms = 1000

        def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
            r.incr(witness)
            if mode == "in-tool":
                _signal_and_hang(signal)
            return {"sent": True}

    if mode == "before-intent-ack":
        original = TxnPublisher._commit

        def blocking_commit(self: TxnPublisher) -> None:
            if any(item.durable for item in self._items):  # the INTENDED is in this transaction
                _signal_and_hang(signal)
            original(self)

        TxnPublisher._commit = blocking_commit  # type: ignore[method-assign]

    journal = Journal(settings, producer_id=producer_id, max_txn_age_ms=60_000)
    run = journal.start_run("tenant-a", "crash-agent", {"to": "bob"}, run_id=run_id)
    with run.node("notify"):
        run.call(CountingTool(), {"to": "bob", "body": "hello"})
    run.succeed()
    journal.close()


if __name__ == "__main__":
    main()

"""Load agent for the failover test: runs short runs back to back and logs what the broker acknowledged.

Usage: ``python -m tests.support.load_agent PRODUCER_ID ACK_LOG STOP_FILE`` with the service env. Each run:
RUN_STARTED, then five steps of a MESSAGE and a durable MESSAGE (``emit(..., durable=True)`` returns once its
transaction is committed, i.e. acknowledged by ``min.insync.replicas`` brokers), then RUN_SUCCEEDED (durable).
After every durable publish returns, the run's seqs 1..last_seq are acknowledged: one JSON line
``{"run": run_id, "seq": last_seq}`` is appended (and flushed) to ACK_LOG — the agent's own record of what
it was told is safe. A publish that raises is logged as ``{"run": ..., "error": ...}`` and the run is
abandoned (its unacknowledged tail may or may not be in the topic). Stops when STOP_FILE exists; prints a
JSON summary.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from runjournal.core.settings import Settings
from runjournal.producers import Journal
from runjournal.schemas import EventType


def main() -> None:
    producer_id, ack_path, stop_path = sys.argv[1:4]
    stop, runs, errors = Path(stop_path), 0, 0
    started = time.monotonic()
    with open(ack_path, "a") as acks, Journal(Settings.load(), producer_id=producer_id, lease_ttl_ms=30_000) as j:
        def ack(line: dict[str, object]) -> None:
            acks.write(json.dumps(line) + "\n")
            acks.flush()

        while not stop.exists():
            run_id = f"{producer_id}-r{runs}"
            runs += 1
            try:
                run = j.start_run("tenant-load", "load", {"i": runs}, run_id=run_id)
                for step in range(5):
                    run.message("assistant", f"thinking {step}")
                    run.emit(EventType.MESSAGE, {"role": "assistant", "content": f"step {step}"}, durable=True)
                    ack({"run": run_id, "seq": run.last_seq})
                run.succeed({"steps": 5})
                ack({"run": run_id, "seq": run.last_seq, "done": True})
            except Exception as exc:  # noqa: BLE001 - counted and reported; the test decides
                errors += 1
                ack({"run": run_id, "error": f"{type(exc).__name__}: {exc}"})
    print(json.dumps({"producer_id": producer_id, "runs": runs, "errors": errors,
                      "elapsed_s": round(time.monotonic() - started, 2)}))


if __name__ == "__main__":
    main()

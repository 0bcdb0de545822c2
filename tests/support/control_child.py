"""Child agent for operator-control tests: one run that charges in a loop until an operator stops it.

Usage: ``python -m tests.support.control_child RUN_ID PRODUCER_ID LEDGER_DIR STEPS [take]`` with the service env
(``take``: wait until the run is handed to this instance, then continue it). Each step
is a side-effecting ``charge`` (its idempotency key is appended to ``LEDGER_DIR/<key>`` — the provider's witness of
what ran) and a short sleep. On ``RunPausedError`` it waits for the run to be handed back (``runjournal resume``) and
re-executes from the top (recorded steps return their results); on ``RunCancelledError`` it exits 0. After STEPS
steps it succeeds. It prints one JSON line per stop: ``{"stopped": "pause" | "cancel", "by": …}``, then
``{"done": true}`` when it finished.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from runjournal.core.settings import Settings
from runjournal.producers import Journal, Outcome, RunCancelledError, RunPausedError


class Charge:
    """A side effect whose provider is a directory: one file per idempotency key, one line per execution."""

    name = "charge"
    side_effect = True
    timeout_ms = 500

    def __init__(self, ledger: Path) -> None:
        self.ledger = ledger

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        with (self.ledger / idempotency_key).open("a") as f:
            f.write("ran\n")
        return {"step": args["step"]}

    def reconcile(self, idempotency_key: str) -> Outcome | None:
        ran = (self.ledger / idempotency_key).exists()
        return Outcome(executed=ran, result={"step": None} if ran else None)


def main() -> None:
    run_id, producer_id, ledger, steps = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    take = sys.argv[5:6] == ["take"]  # a second instance: wait until the run is handed to it, then continue it
    tool = Charge(ledger)
    with Journal(Settings.load(), producer_id=producer_id, lease_ttl_ms=1200) as journal:
        if take:
            print(json.dumps({"ready": journal.producer_id}), flush=True)
            deadline = time.monotonic() + 120
            while journal.claim_assignment(1.0) != run_id:
                if time.monotonic() > deadline:
                    raise SystemExit("not handed the run within 120 s")
            handle = journal.resume(run_id)
        else:
            handle = journal.start_run("t", "charger", {"steps": steps}, run_id=run_id)
        while True:
            try:
                for step in range(steps):
                    handle.call(tool, {"step": step})
                    time.sleep(0.05)
                handle.succeed({"steps": steps})
                print(json.dumps({"done": True}), flush=True)
                return
            except RunCancelledError as exc:
                print(json.dumps({"stopped": "cancel", "by": exc.requested_by}), flush=True)
                return
            except RunPausedError as exc:
                print(json.dumps({"stopped": "pause", "by": exc.requested_by}), flush=True)
                deadline = time.monotonic() + 120
                while (assigned := journal.claim_assignment(1.0)) != run_id:
                    if time.monotonic() > deadline:
                        raise SystemExit("not handed back within 120 s") from None
                    assert assigned is None, assigned
                handle = journal.resume(run_id)


if __name__ == "__main__":
    main()

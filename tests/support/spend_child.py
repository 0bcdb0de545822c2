"""Child agent for the spend crash and race tests (tests/faults/test_spend_crash.py).

Usage: ``python -m tests.support.spend_child MODE RUN_ID PRODUCER_ID TENANT`` with the service env (and
``RUNJOURNAL_SPEND_PRICES`` / ``RUNJOURNAL_SPEND_BUDGETS``):

* ``race`` — reserve one model call (1 input, 1 output token) and settle it at the estimate, again and again, until
  the budget refuses; print ``{"ok": <reservations that passed>, "refused": {...}}``.
* ``crash`` — :func:`agent` up to its first reservation, print ``{"reserved": <key>}`` and wait to be SIGKILLed.
* ``agent`` — :func:`agent` in full (with ``RJ_FAILPOINTS`` the process kills itself inside a step).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from runjournal.core.settings import Settings
from runjournal.producers import Journal
from runjournal.producers.spend import BudgetExceededError

MODEL = "m"


def agent(run: Any, *, stop_after_reserve: bool = False) -> list[bool]:
    """Two model calls: reserve (100 in, 50 out), settle (90 + i in, 40 out). Returns each reservation's
    ``recorded`` flag."""
    seen = []
    for i in range(2):
        r = run.reserve(MODEL, input_tokens=100, output_tokens=50)
        seen.append(r.recorded)
        if stop_after_reserve:
            print(json.dumps({"reserved": r.key}), flush=True)
            time.sleep(600)
        r.settle(input_tokens=90 + i, output_tokens=40)
    return seen


def main() -> None:
    mode, run_id, producer_id, tenant = sys.argv[1:5]
    with Journal(Settings.load(), producer_id=producer_id, lease_ttl_ms=1500) as journal:
        run = journal.start_run(tenant, "spender", {}, run_id=run_id)
        if mode == "race":
            ok = 0
            while True:
                try:
                    run.reserve(MODEL, input_tokens=1, output_tokens=1).settle(input_tokens=1, output_tokens=1)
                except BudgetExceededError as exc:
                    print(json.dumps({"ok": ok, "refused": {"scope": exc.scope, "dim": exc.dim}}), flush=True)
                    run.succeed()
                    return
                ok += 1
        agent(run, stop_after_reserve=mode == "crash")
        run.succeed()
        print(json.dumps({"done": True}), flush=True)


if __name__ == "__main__":
    main()

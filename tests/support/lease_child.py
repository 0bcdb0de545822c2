"""Child agent processes for the lease and incarnation tests (``tests/producers/test_leases.py``).

Usage (with the service env):

* ``python -m tests.support.lease_child chatter PRODUCER_ID STATE_DIR`` — a Journal with a 1 s lease starts
  a run and publishes a MESSAGE every 50 ms. It writes ``STATE_DIR/ready`` (its instance id) once running
  and, when a publish raises, ``STATE_DIR/error`` (the error's class name) and exits 3.
* ``python -m tests.support.lease_child restart PRODUCER_ID PROVIDER_URL RUN_ID`` — what a supervisor does
  after a crash: start a Journal under the same producer_id at once, retrying for up to 30 s while the
  name is refused; print the instance id; then take the assigned run and finish it with the mail script
  of ``tests.support.agent_child``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from runjournal.core.settings import Settings
from runjournal.producers import Journal, JournalError
from tests.support.agent_child import script


def chatter(producer_id: str, state_dir: Path) -> int:
    with Journal(Settings.load(), producer_id=producer_id, lease_ttl_ms=1000) as journal:
        run = journal.start_run("tenant-a", "chatter", {})
        (state_dir / "ready.tmp").write_text(journal.producer_id)
        (state_dir / "ready.tmp").rename(state_dir / "ready")  # atomic: the parent never reads it half written
        while True:
            try:
                run.message("assistant", "still here")
            except Exception as exc:  # noqa: BLE001 - reported to the test
                (state_dir / "error").write_text(type(exc).__name__)
                return 3
            time.sleep(0.05)


def restart(producer_id: str, provider_url: str, run_id: str) -> int:
    settings = Settings.load()
    deadline = time.monotonic() + 30
    while True:
        try:
            journal = Journal(settings, producer_id=producer_id, lease_ttl_ms=2500)
            break
        except JournalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    with journal:
        print(journal.producer_id, flush=True)
        claimed = journal.claim_assignment(timeout_s=30)
        assert claimed == run_id, claimed
        script(journal.resume(run_id), provider_url)
    return 0


def main() -> None:
    mode = sys.argv[1]
    if mode == "chatter":
        sys.exit(chatter(sys.argv[2], Path(sys.argv[3])))
    sys.exit(restart(*sys.argv[2:5]))


if __name__ == "__main__":
    main()

"""Child process for the large-result crash test: one run, one side-effecting call returning a large result.

Usage: ``python -m tests.support.payload_child RUN_ID PRODUCER_ID SIZE`` with the service env and
``RJ_FAILPOINTS=producers.result.before_payload_commit=1``: the process SIGKILLs itself after the result's records
are produced on ``{prefix}.payloads`` and before their transaction commits. The tool INCRs
``{prefix}:witness:{run_id}`` in Redis (how many times it ran).
"""

from __future__ import annotations

import sys
from typing import Any

from runjournal.core import redis_client
from runjournal.core.settings import Settings
from runjournal.producers import Journal


class BigResult:
    """Side-effecting; returns ``{"blob": "x" * size}`` and counts its runs in Redis."""

    name = "big"
    side_effect = True
    timeout_ms = 500

    def __init__(self, settings: Settings, run_id: str, size: int) -> None:
        self._r = redis_client.client(settings)
        self._key = f"{settings.topic_prefix}:witness:{run_id}"
        self._size = size

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        self._r.incr(self._key)
        return {"blob": "x" * self._size}


def main() -> None:
    run_id, producer_id, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    settings = Settings.load()
    with Journal(settings, producer_id=producer_id, lease_ttl_ms=2500) as journal:
        run = journal.start_run("tenant-a", "big", {}, run_id=run_id)
        run.call(BigResult(settings, run_id, size), {})
        run.succeed()


if __name__ == "__main__":
    main()

"""An agent-like process building contexts: ``python -m tests.support.context_child RUN_ID N QUERY``.

Prints one JSON line: ``{"built", "with_memory", "with_knowledge", "notes", "facts_known"}``."""

from __future__ import annotations

import json
import sys

from runjournal.consumers.context import ContextManager
from runjournal.core.settings import Settings


def main() -> None:
    run_id, n, query = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    manager = ContextManager.open(Settings.load())
    out = {"built": 0, "with_memory": 0, "with_knowledge": 0, "notes": [], "facts_known": 0}
    for _ in range(n):
        ctx = manager.build_context(run_id, query)
        out["built"] += 1
        out["with_memory"] += int(bool(ctx.memory))
        out["with_knowledge"] += int(bool(ctx.knowledge))
        out["facts_known"] += int(ctx.facts.known)
        out["notes"] += list(ctx.notes)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

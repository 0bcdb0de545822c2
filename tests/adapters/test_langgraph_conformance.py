"""The LangGraph checkpointer against ``langgraph-checkpoint-conformance`` on the real broker and Redis.

Every base capability (put, put_writes, get_tuple, list, delete_thread: 58 checks) must pass — asserted with
``passed_all_base()``, not the report's level (which counts only what it detects). The same saver instance is
the suite does not cover what makes this saver the journal's: see ``test_langgraph.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance import checkpointer_test, validate  # noqa: E402

from runjournal.adapters.langgraph import JournalCheckpointSaver, JournalRuns  # noqa: E402
from runjournal.core.settings import Settings  # noqa: E402
from runjournal.producers.aio import AsyncJournal  # noqa: E402

pytestmark = [pytest.mark.integration]


def test_conformance_suite_passes_every_base_check(topics: Settings) -> None:
    async def main() -> None:
        journal = await AsyncJournal.open(topics, producer_id="lg-conformance")
        try:
            @checkpointer_test(name="runjournal")
            async def saver() -> AsyncIterator[JournalCheckpointSaver]:
                yield JournalCheckpointSaver(JournalRuns(journal, tenant_id="t", agent="conformance"))

            report = await validate(saver)
            failures = {name: r.failures for name, r in report.results.items() if r.failures}
            assert report.passed_all_base(), failures
            base = ("put", "put_writes", "get_tuple", "list", "delete_thread")
            assert sum(report.results[c].tests_passed for c in base) == 58, report.results
        finally:
            await journal.close()

    asyncio.run(main())

"""OpenTelemetry spans of the services (issue 34): the projector's batch apply and write-behind write, the memory
extractor's batch and write. Recovery's spans are asserted with a crashed run (tests/producers/test_traces.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runjournal.consumers.memory import MemoryExtractor, QdrantMemoryStore
from runjournal.consumers.projector import Projector
from runjournal.core import otel
from runjournal.core.settings import Settings
from runjournal.testing import HashingEmbedder
from tests.consumers.memory.test_extractor import conversation
from tests.support.spans import span_dict
from tests.support.workload import publish

pytestmark = pytest.mark.integration


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    otel.configure_tracing(SimpleSpanProcessor(memory))
    yield memory
    otel.shutdown_tracing()


def _named(exporter: InMemorySpanExporter, name: str) -> list[dict[str, Any]]:
    return [s for s in map(span_dict, exporter.get_finished_spans()) if s["name"] == name]


def test_the_projector_traces_each_batch_and_its_write(topics: Settings, exporter: InMemorySpanExporter) -> None:
    from runjournal.producers import Journal

    events = conversation("r-1", ["hello", "I prefer window seats"]) + conversation("r-2", ["hi"])
    publish(topics, events)
    with Journal(topics, producer_id="traced-agent") as journal:  # a traced run: its events carry its traceparent
        run = journal.start_run("acme", "agent", {"q": 1})
        run.succeed()
    exporter.clear()
    Projector(topics).run(until_caught_up=True, idle_timeout_s=60)
    applies, writes = _named(exporter, "runjournal.projector.apply"), _named(exporter, "runjournal.projector.write")
    assert applies and writes
    events += [None, None]  # the traced run's RUN_STARTED and RUN_SUCCEEDED
    run_trace = f"{otel.run_trace(run.run_id)[0]:032x}"
    assert any(link.startswith(run_trace) for s in applies for link in s["links"])  # the batch links the run
    assert sum(s["attributes"]["runjournal.records"] for s in applies) == len(events)
    apply_ids = {f"{s['trace_id']}-{s['span_id']}" for s in applies}
    assert all(set(w["links"]) <= apply_ids and w["links"] for w in writes)  # each write links its batch


def test_the_memory_extractor_traces_each_batch_and_its_write(topics: Settings,
                                                              exporter: InMemorySpanExporter) -> None:
    publish(topics, conversation("r-m", ["I prefer window seats", "I prefer vegetarian meals"]))
    store = QdrantMemoryStore.open(topics, HashingEmbedder())
    try:
        MemoryExtractor(topics, store=store).run(until_caught_up=True)
    finally:
        store.close()
    batches, writes = _named(exporter, "runjournal.memory.batch"), _named(exporter, "runjournal.memory.write")
    assert batches and writes
    batch_ids = {s["span_id"] for s in batches}
    assert all(w["parent_id"] in batch_ids and w["attributes"]["runjournal.items"] >= 1 for w in writes)

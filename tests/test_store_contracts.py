"""Contract suites of the execution stores, shared by every implementation (style note 20).

* :class:`~runjournal.stores.EventStore` — the Kafka topic (:class:`KafkaEventStore`) and an in-memory fake.
* :class:`~runjournal.stores.StateStore`, :class:`~runjournal.stores.ExecutionRecordStore`,
  :class:`~runjournal.stores.CheckpointStore` — the Redis projection (:class:`RedisRunStore`, filled by the real
  projector) and a store folding each run from the EventStore on every read: both must give the same answers.

Each implementation supplies only a factory; the suites are the classes below.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest

from runjournal.consumers.execution_stores import KafkaEventStore, RedisRunStore
from runjournal.core.settings import Settings
from runjournal.model import CallStatus, RunStatus, state_digest
from runjournal.producers.partitioner import partition_for
from runjournal.schemas import Event, EventType
from runjournal.stores import (
    Authority,
    CheckpointStore,
    EventStore,
    ExecutionRecordStore,
    Plane,
    StateStore,
)
from tests.support.provider import project
from tests.support.stores import FoldingRunStore, InMemoryEventStore
from tests.support.workload import run_events

pytestmark = pytest.mark.integration
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def open_run(run_id: str) -> list[Event]:
    """A run left in flight: an intent without outcome, and an approval pending on another call."""
    def ev(seq: int, etype: EventType, payload: dict, node: str | None = "main") -> Event:
        return Event(event_id=str(uuid.uuid4()), run_id=run_id, tenant_id="acme", seq=seq, epoch=1,
                     producer_id="agent-1", type=etype, payload=payload, node_id=node,
                     occurred_at=T0 + timedelta(milliseconds=seq))
    tool = {"call_id": "send", "tool": "send_email", "idempotency_key": f"{run_id}-k", "args_digest": "a"}
    return [ev(1, EventType.RUN_STARTED, {"agent": "mailer", "input_json": "{}", "user_id": "u1"}, None),
            ev(2, EventType.NODE_STARTED, {"node_path": "main", "attempt": 1}),
            ev(3, EventType.TOOL_CALL_INTENDED, {**tool, "side_effect": True, "attempt": 1, "timeout_ms": 1000,
                                                 "args_json": "{}"}),
            ev(4, EventType.APPROVAL_REQUESTED, {"call_id": "refund", "reason": "big", "tool": "refund"})]


RUNS = {"done-1": run_events("done-1", calls=2), "done-2": run_events("done-2", calls=1), "open-1": open_run("open-1")}


# -- EventStore ------------------------------------------------------------------------------------------
@pytest.fixture(params=["kafka", "in-memory"])
def event_store(request: pytest.FixtureRequest, topics: Settings) -> EventStore:
    return KafkaEventStore(topics) if request.param == "kafka" else InMemoryEventStore(topics.partitions)


class TestEventStoreContract:
    def test_it_declares_the_execution_plane_and_authority(self, event_store: EventStore) -> None:
        assert isinstance(event_store, EventStore)
        assert (event_store.plane, event_store.authority) == (Plane.EXECUTION, Authority.AUTHORITATIVE)

    def test_append_then_read_by_run_returns_each_run_in_order(self, event_store: EventStore) -> None:
        for events in RUNS.values():
            positions = event_store.append(events)
            assert len({p.partition for p in positions}) == 1  # one run, one partition
            assert [p.offset for p in positions] == sorted(p.offset for p in positions)
        for run_id, events in RUNS.items():
            stored = event_store.read_run(run_id)
            assert [r.event.event_id for r in stored] == [e.event_id for e in events]  # nothing of another run
            assert [r.key for r in stored] == [e.key for e in events]
            assert [(r.event.type, r.event.seq, r.event.occurred_at) for r in stored] == \
                [(e.type, e.seq, e.occurred_at) for e in events]

    def test_read_by_offset_is_append_only_and_repeatable(self, event_store: EventStore) -> None:
        positions = event_store.append(RUNS["done-1"])
        first = positions[0]
        page = event_store.read_from(first.partition, first.offset, limit=3)
        assert [r.offset for r in page] == [p.offset for p in positions[:3]]
        event_store.append(RUNS["done-2"])  # appending never changes what was read
        assert event_store.read_from(first.partition, first.offset, limit=3) == page
        assert event_store.read_from(first.partition, positions[-1].offset + 10_000) == []


# -- StateStore / ExecutionRecordStore / CheckpointStore -----------------------------------------------------
RunStore = Callable[[], object]


@pytest.fixture(scope="module")
def run_stores(endpoints: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """The same journal behind both implementations: published once, projected by the real projector."""
    from runjournal.deploy.topics import create_topics

    settings = Settings.load(bootstrap=endpoints.bootstrap, redis_url=endpoints.redis_url,  # type: ignore[attr-defined]
                             topic_prefix=f"t{uuid.uuid4().hex[:12]}", stack_dir=tmp_path_factory.mktemp("s"),
                             partitions=3, replication_factor=endpoints.replication_factor)  # type: ignore[attr-defined]
    create_topics(settings)
    events = KafkaEventStore(settings)
    for run in RUNS.values():
        events.append(run)
    project(settings)
    yield {"redis-projection": RedisRunStore.open(settings), "fold-from-topic": FoldingRunStore(events),
           "settings": settings}


@pytest.fixture(params=["redis-projection", "fold-from-topic"])
def run_store(request: pytest.FixtureRequest, run_stores: dict[str, object]) -> object:
    return run_stores[request.param]


class TestStateStoreContract:
    def test_it_is_all_three_execution_contracts(self, run_store: object) -> None:
        assert isinstance(run_store, StateStore) and isinstance(run_store, ExecutionRecordStore)
        assert isinstance(run_store, CheckpointStore)
        assert (run_store.plane, run_store.authority) == (Plane.EXECUTION, Authority.DERIVED)

    def test_state_is_the_fold_of_the_run_at_its_version(self, run_store: StateStore,
                                                         run_stores: dict[str, object]) -> None:
        reference = run_stores["fold-from-topic"]
        for run_id in RUNS:
            state = run_store.get(run_id)
            assert state is not None and state_digest(state) == state_digest(reference.get(run_id))
            assert run_store.version(run_id) == (state.applied_partition, state.applied_offset)
        assert run_store.get("never-ran") is None and run_store.version("never-ran") is None
        assert run_store.get("done-1").status is RunStatus.SUCCEEDED

    def test_records_say_what_each_call_did(self, run_store: ExecutionRecordStore) -> None:
        done = run_store.records("done-1")
        assert sorted(done) == ["c0", "c1"] and all(r.status is CallStatus.COMMITTED for r in done.values())
        assert run_store.record("open-1", "send").status is CallStatus.INTENDED
        assert run_store.record("open-1", "nope") is None and run_store.records("never-ran") == {}

    def test_a_checkpoint_covers_its_offset_and_names_what_is_pending(self, run_store: CheckpointStore,
                                                                     run_stores: dict[str, object]) -> None:
        settings: Settings = run_stores["settings"]
        cp = run_store.checkpoint("open-1")
        assert cp.partition == partition_for("open-1", settings.partitions) == cp.state.applied_partition
        assert cp.offset == cp.state.applied_offset <= cp.partition_offset == run_store.applied_offset(cp.partition)
        assert cp.unsettled_calls == ("send",) and cp.pending_approvals == ("refund",)
        assert run_store.checkpoint("done-1").unsettled_calls == () and run_store.checkpoint("never-ran") is None

"""The execution stores' contract suites (``runjournal.testing``), run on every implementation the project has.

* :class:`~runjournal.stores.EventStore` — the Kafka topic (:class:`KafkaEventStore`) and the in-memory fake.
* StateStore / ExecutionRecordStore / CheckpointStore — the Redis projection (:class:`RedisRunStore`, filled by the
  real projector) and :class:`~runjournal.testing.FoldingRunStore` folding each run from the topic on every read:
  both must give the same answers.

Each implementation supplies only a fixture; the suites are the kit's classes — the same a third-party backend runs.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from runjournal.consumers.context.execution_stores import KafkaEventStore, RedisRunStore
from runjournal.core.settings import Settings
from runjournal.stores import EventStore
from runjournal.testing import (
    EventStoreContract,
    FoldingRunStore,
    InMemoryEventStore,
    RunStoreContract,
    contract_runs,
)
from tests.support.provider import project

pytestmark = pytest.mark.integration


class TestKafkaEventStore(EventStoreContract):
    @pytest.fixture
    def event_store(self, topics: Settings) -> EventStore:
        return KafkaEventStore(topics)


class TestInMemoryEventStore(EventStoreContract):
    @pytest.fixture
    def event_store(self) -> EventStore:
        return InMemoryEventStore(3)


@pytest.fixture(scope="module")
def journal(endpoints: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, KafkaEventStore]]:
    """The contract runs published once to a real topic and projected by the real projector."""
    from runjournal.deploy.topics import create_topics

    settings = Settings.load(bootstrap=endpoints.bootstrap, redis_url=endpoints.redis_url,  # type: ignore[attr-defined]
                             topic_prefix=f"t{uuid.uuid4().hex[:12]}", stack_dir=tmp_path_factory.mktemp("s"),
                             partitions=3, replication_factor=endpoints.replication_factor)  # type: ignore[attr-defined]
    create_topics(settings)
    events = KafkaEventStore(settings)
    for run in contract_runs().values():
        events.append(run)
    project(settings)
    yield settings, events


class TestRedisProjection(RunStoreContract):
    @pytest.fixture
    def contract_events(self, journal: tuple[Settings, KafkaEventStore]) -> EventStore:
        return journal[1]

    @pytest.fixture
    def run_store(self, journal: tuple[Settings, KafkaEventStore]) -> object:
        return RedisRunStore.open(journal[0])


class TestFoldFromTheTopic(RunStoreContract):
    @pytest.fixture
    def contract_events(self, journal: tuple[Settings, KafkaEventStore]) -> EventStore:
        return journal[1]

    @pytest.fixture
    def run_store(self, contract_events: EventStore) -> object:
        return FoldingRunStore(contract_events)


class TestFoldFromTheFake(RunStoreContract):
    """The kit on its own: the fake event store and the folding store, no services."""

    @pytest.fixture
    def contract_events(self) -> EventStore:
        events = InMemoryEventStore(3)
        for run in contract_runs().values():
            events.append(run)
        return events

    @pytest.fixture
    def run_store(self, contract_events: EventStore) -> object:
        return FoldingRunStore(contract_events)

"""Broker-side failures through the Journal: aborted transactions, refused records, partition counts."""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions

from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.producers import (
    DeliveryError,
    Journal,
    PartitionCountChangedError,
    RunHandle,
    TransactionAbortedError,
    partition_for,
)
from runjournal.schemas import EventType
from tests.support.readback import events_of, read_committed

pytestmark = pytest.mark.integration


@pytest.fixture
def small_records(topics: Settings) -> Settings:
    """The events topic refuses records over 3000 bytes (the broker, not our codec, says no)."""
    admin = kafka.admin_client(topics)
    entry = ConfigEntry("max.message.bytes", "3000", incremental_operation=AlterConfigOpType.SET)
    res = ConfigResource("topic", topics.events_topic, incremental_configs=[entry])
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result()
    return topics


@pytest.fixture
def journal(small_records: Settings) -> Iterator[Journal]:
    with Journal(small_records) as j:
        yield j


def _two_runs_in_different_partitions(journal: Journal) -> tuple[RunHandle, RunHandle]:
    ids: dict[int, str] = {}
    while len(ids) < 2:
        run_id = f"r-{uuid.uuid4().hex[:8]}"
        ids.setdefault(partition_for(run_id, journal.partitions), run_id)
    first, second = ids.values()
    return journal.start_run("tenant-a", "agent", {}, run_id=first), journal.start_run(
        "tenant-a", "agent", {}, run_id=second
    )


def test_refused_durable_event_aborts_and_raises_and_others_are_reproduced(
    journal: Journal, small_records: Settings
) -> None:
    bystander, run = _two_runs_in_different_partitions(journal)
    bystander.message("assistant", "in the doomed transaction")
    with pytest.raises(TransactionAbortedError) as info:
        run.request_approval("c-1", secrets.token_hex(4000))  # ~8 KB: the broker refuses it
    assert "MSG_SIZE_TOO_LARGE" in str(info.value) and info.value.retryable
    assert run.last_seq == 1 and run.writable  # its seq was not consumed
    run.request_approval("c-1", "short reason")
    bystander.succeed()
    records = read_committed(small_records)
    assert [(e.seq, e.type) for e in events_of(records, run.run_id)] == [
        (1, EventType.RUN_STARTED),
        (2, EventType.APPROVAL_REQUESTED),
    ]
    assert [e.type for e in events_of(records, bystander.run_id)] == [
        EventType.RUN_STARTED,
        EventType.MESSAGE,  # produced again, same event, into the next transaction
        EventType.RUN_SUCCEEDED,
    ]
    assert journal.stats["aborts"] >= 1  # librdkafka then fails one more (epoch bump), re-run transparently


def test_refused_non_durable_event_stops_its_run_only(journal: Journal, small_records: Settings) -> None:
    doomed, other = _two_runs_in_different_partitions(journal)
    doomed.message("assistant", secrets.token_hex(4000))  # accepted locally, refused by the broker
    with pytest.raises(TransactionAbortedError):
        other.request_approval("c-2", "why")  # the transaction it commits carries the refused record
    other.request_approval("c-2", "why")
    other.succeed()
    assert not doomed.writable
    with pytest.raises(DeliveryError) as info:
        doomed.message("assistant", "anyone?")
    assert not info.value.retryable
    records = read_committed(small_records)
    assert events_of(records, doomed.run_id) == []  # its RUN_STARTED rode in the lost transaction
    assert [e.seq for e in events_of(records, other.run_id)] == [1, 2, 3]


def test_partition_count_change_stops_publishing(topics: Settings) -> None:
    with Journal(topics, metadata_check_interval_s=0.1) as journal:
        run = journal.start_run("tenant-a", "agent", {})
        admin = kafka.admin_client(topics)
        admin.create_partitions([NewPartitions(topics.events_topic, topics.partitions + 1)])[
            topics.events_topic
        ].result()
        deadline = time.monotonic() + 10
        with pytest.raises(PartitionCountChangedError) as info:
            while time.monotonic() < deadline:
                run.message("assistant", "tick")
                time.sleep(0.05)
        assert (info.value.expected, info.value.actual) == (topics.partitions, topics.partitions + 1)

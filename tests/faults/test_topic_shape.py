"""A partition-count change is refused loudly where the count is assumed (issue 28 case 3).

The events topic grows from its partitions to twice as many (an operator's ``kafka-topics --alter``). Every run's
events are placed by murmur2(run_id) mod the count the journal was created with; with the new count, recovery looked
for an interrupted run in the wrong partition, found no facts and dropped it from every owned set. Now: recovery,
a new Journal, the readers and a projector rebuild all refuse with the repair named, and no run leaves its set.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from confluent_kafka.admin import NewPartitions

from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.consumers.runtime.partitions import events_partition_count
from runjournal.consumers.runtime.topic_identity import TopicMismatchError
from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.producers import Journal, PartitionCountChangedError
from tests.support.faults import live, owned, owns
from tests.support.workload import publish, run_events

pytestmark = pytest.mark.integration


def _grow(topics: Settings) -> int:
    admin = kafka.admin_client(topics)
    to = topics.partitions * 2
    admin.create_partitions([NewPartitions(topics.events_topic, to)])[topics.events_topic].result()
    return to


def _first_pass(topics: Settings) -> None:
    """A recovery pass before the change: it records the journal's shape (as a projector's start would)."""
    job = RecoveryJob(topics)
    try:
        job.recover(stale=True)
    finally:
        job.close()


def test_recovery_after_a_partition_count_change_refuses_and_keeps_every_run(topics: Settings) -> None:
    runs = [f"grow-{i}" for i in range(8)]
    _first_pass(topics)
    publish(topics, [e for run in runs for e in run_events(run, finish=False)])
    owns(topics, "agent-1", *runs)
    live(topics, "taker")
    _grow(topics)
    job = RecoveryJob(topics)
    try:
        with pytest.raises(TopicMismatchError) as info:
            job.recover(stale=True)
    finally:
        job.close()
    assert "created with" in str(info.value) and "new topic prefix" in info.value.repair
    assert owned(topics, "agent-1") == set(runs), "a run left its owner's set"


def test_a_journal_and_the_readers_refuse_to_start_on_a_changed_count(topics: Settings,
                                                                       service_env: dict[str, str]) -> None:
    _first_pass(topics)
    grown = _grow(topics)
    with pytest.raises(PartitionCountChangedError) as info:
        Journal(topics, producer_id="after-grow")
    assert (info.value.expected, info.value.actual) == (topics.partitions, grown)
    with pytest.raises(PartitionCountChangedError):
        events_partition_count(topics)  # inspect, erase, replay, the console, the context stores
    rebuild = subprocess.run([sys.executable, "-m", "runjournal", "projector", "--rebuild", "--until-caught-up"],
                             env=service_env, capture_output=True, text=True, timeout=120)
    assert rebuild.returncode == 1, rebuild.stderr
    assert "cannot repair" in rebuild.stderr or "wrong partitions" in rebuild.stderr, rebuild.stderr
    inspect = subprocess.run([sys.executable, "-m", "runjournal", "inspect", "any-run", "--json"],
                             env=service_env, capture_output=True, text=True, timeout=120)
    assert inspect.returncode == 1 and "partitions" in inspect.stderr, (inspect.stdout, inspect.stderr)

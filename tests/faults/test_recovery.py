"""Issue 14, recovery under faults — each numbered case of the issue on the real stack (cases 1, 3, 4).

Every test here failed on the code before issue 14 (the case's symptom is in its docstring).
"""

from __future__ import annotations

import dataclasses
import logging
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from runjournal.consumers.projector import Projector
from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core import kafka, redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.producers.fencing import transactional_id
from runjournal.schemas import EventCodec, codec_from_settings
from runjournal.schemas.keys import partition_for
from runjournal.schemas.registration import register_versions
from tests.conftest import LocalRegistry
from tests.support.faults import assigned, live, owned, owns, run_on_partition, steady_writers
from tests.support.workload import publish, run_events

pytestmark = pytest.mark.integration


def _alter_topic(settings: Settings, **config: str) -> None:
    admin = kafka.admin_client(settings)
    entries = [ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET)
               for k, v in config.items()]
    res = ConfigResource(ConfigResource.Type.TOPIC, settings.events_topic, incremental_configs=entries)
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(30)


def _delete_records_to(settings: Settings, partition: int, offset: int) -> None:
    """DeleteRecords up to ``offset``; the policy change before it reaches the partition leader asynchronously
    (the broker answers POLICY_VIOLATION until it has), so retry that answer for a bounded time."""
    admin = kafka.admin_client(settings)
    deadline = time.monotonic() + 30
    while True:
        try:
            for fut in admin.delete_records([TopicPartition(settings.events_topic, partition, offset)]).values():
                fut.result(30)
            return
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.POLICY_VIOLATION or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


# -- case 1: the tail read under steady transactions, and a partition whose log start is its end ---------------
def test_case1_recovery_reads_to_the_end_while_agents_commit_every_50ms(topics: Settings) -> None:
    """Old: a partition was done only when a data record sat at end-1 or a poll came back empty; with commit
    markers at end-1 and records arriving without pause, the read ran into its 30 s deadline (TimeoutError)."""
    run = "steady-run"
    publish(topics, run_events(run, finish=False))
    owns(topics, "agent-1", run)
    live(topics, "taker")
    with steady_writers(topics, writers=4, interval_s=0.05) as done:
        job = RecoveryJob(topics)
        started = time.monotonic()
        report = job.recover(stale=True)
        elapsed = time.monotonic() - started
        job.close()
        assert sum(done) > 10, "the writers must have been committing during the pass"
    (outcome,) = report.runs
    assert outcome.action == "resumed" and outcome.assigned_to == "taker", outcome
    assert all(p.complete for p in report.partitions)
    assert elapsed < 20, f"the pass took {elapsed:.1f} s under steady transactions"


def test_case1_truncated_partition_does_not_abort_other_runs(topics: Settings) -> None:
    """Old: a partition with log start = high watermark = 42 and nothing projected timed out after 30 s, and the
    TimeoutError aborted the whole pass — the healthy run on another partition was not recovered either."""
    gone = run_on_partition(topics, 0, "gone")
    healthy = run_on_partition(topics, 1, "healthy")
    producer = kafka.producer(topics)
    for i in range(41):
        producer.produce(topics.events_topic, key=f"{gone}:1:{i + 1}".encode(), value=b"\xc3\x01junk", partition=0)
    producer.produce(topics.events_topic, key=b"other:1:1", value=b"x", partition=0)
    assert producer.flush(30) == 0
    _alter_topic(topics, cleanup_policy="compact,delete")  # DeleteRecords needs the delete policy
    _delete_records_to(topics, 0, 42)
    _alter_topic(topics, cleanup_policy="compact")
    publish(topics, run_events(healthy, finish=False))
    owns(topics, "agent-1", gone, healthy)
    live(topics, "taker")
    job = RecoveryJob(topics)
    started = time.monotonic()
    report = job.recover(stale=True)
    job.close()
    elapsed = time.monotonic() - started
    actions = {r.run_id: r.action for r in report.runs}
    assert actions == {gone: "no_facts", healthy: "resumed"}, report.as_dict()
    assert elapsed < 15, f"{elapsed:.1f} s"
    started = time.monotonic()  # the projector's "caught up" decides from positions too (log start counted)
    Projector(topics).run(until_caught_up=True, idle_timeout_s=40)
    assert time.monotonic() - started < 25


# -- case 3: a failed commit does not break a long-lived job; the owner the tail names is fenced ----------------
def test_case3_failed_commit_is_aborted_and_the_next_pass_of_the_same_job_works(topics: Settings) -> None:
    """Old: after one failed commit_transaction (no abort, no reset) every later pass of the RecoveryJob failed
    at begin_transaction."""
    run = "commit-fail-run"
    publish(topics, run_events(run, finish=False))
    owns(topics, "agent-1", run)
    live(topics, "taker")
    job = RecoveryJob(topics)
    _alter_topic(topics, max_message_bytes="80")  # the broker refuses RUN_RESUMED: an abortable txn error
    try:
        first = job.recover(stale=True)
    finally:
        _alter_topic(topics, max_message_bytes="1048588")
    assert [r.action for r in first.runs] == ["retry_later"], first.as_dict()
    assert run in owned(topics, "agent-1") and assigned(topics, "taker") == []  # nothing handed over
    second = job.recover(stale=True)
    job.close()
    assert [(r.action, r.epoch) for r in second.runs] == [("resumed", 2)], second.as_dict()
    assert assigned(topics, "taker") == [run]


def test_case3_recover_run_fences_the_owner_the_tail_names_when_the_projection_lags(topics: Settings) -> None:
    """Old: ``recover --run`` fenced only the owner the projection showed — none when the projector lagged — so
    a paused owner (a zombie) behind the read could still commit after recovery had decided."""
    run = "lagging-run"
    zombie = kafka.producer(topics, **{"transactional.id": transactional_id(topics, "zombie-1")})
    zombie.init_transactions(30)
    codec = codec_from_settings(topics)
    events = [dataclasses.replace(e, producer_id="zombie-1") for e in run_events(run, finish=False)]
    zombie.begin_transaction()
    for e in events:
        zombie.produce(topics.events_topic, key=e.key.encode(), value=codec.encode(e),
                       partition=partition_for(run, topics.partitions))
    zombie.commit_transaction(30)
    live(topics, "taker")  # nothing projected: the projection names no owner
    job = RecoveryJob(topics)
    report = job.recover(runs=[run])
    job.close()
    assert report.fenced == ["zombie-1"], report.as_dict()
    assert [r.action for r in report.runs] == ["resumed"]
    zombie.begin_transaction()  # the paused owner wakes up and tries to write behind the read
    zombie.produce(topics.events_topic, key=f"{run}:1:99".encode(), value=b"late",
                   partition=partition_for(run, topics.partitions))
    with pytest.raises(KafkaException):
        zombie.commit_transaction(10)


# -- case 4: a schema-registry outage is waited out, never parked or disowned -----------------------------------
@pytest.mark.registry
@pytest.mark.slow
def test_case4_registry_outage_recovery_waits_never_parks_or_disowns(topics: Settings,
                                                                       own_registry: LocalRegistry) -> None:
    """Old: a registry transport failure was folded as an undecodable record: the run was BLOCKED, parked and
    disowned. Now its partition is not decided (``retry_later``); once the registry answers, it is resumed.

    Covers: records in Confluent framing written through a real registry process (Apicurio, the launcher of
    ``stack up --registry``), which is then stopped: the recovery job's cold codec meets ids it never cached
    (a real outage); the registry is started again on the same port and the next pass resumes the run."""
    run = "registry-run"
    register_versions(own_registry.url, f"{topics.events_topic}-value")
    with_registry = topics.model_copy(update={"schema_registry_url": own_registry.url})
    writer = EventCodec(schema_registry_url=own_registry.url, topic=topics.events_topic)
    publish(topics, [(e.key, writer.encode(e)) for e in run_events(run, finish=False)])
    owns(topics, "agent-1", run)
    live(topics, "taker")
    own_registry.stop()
    job = RecoveryJob(with_registry)
    report = job.recover(stale=True)
    assert [r.action for r in report.runs] == ["retry_later"], report.as_dict()
    assert "registry" in (report.runs[0].detail or "")
    assert run in owned(topics, "agent-1"), "a registry outage must not disown the run"
    assert not redis_client.client(topics).sismember(RedisKeys(topics.topic_prefix).parked(), run)
    assert job.policy.retries > 0  # the wait is visible (logged and counted)
    own_registry.start()  # the registry is back (same port, same stored ids)
    report = job.recover(stale=True)
    job.close()
    assert [(r.action, r.epoch) for r in report.runs] == [("resumed", 2)], report.as_dict()


def test_policy_logs_each_wait(caplog: pytest.LogCaptureFixture) -> None:
    """The failure policy's waits are WARNING lines naming the dependency (and bounded)."""
    import redis as redis_mod

    from runjournal.consumers.runtime.failures import DependencyUnavailableError, FailurePolicy

    policy = FailurePolicy("test", logging.getLogger("runjournal.test"), max_wait_s=0.5, backoff_base_s=0.05)

    def down() -> None:
        raise redis_mod.ConnectionError("refused")

    with caplog.at_level(logging.WARNING), pytest.raises(DependencyUnavailableError, match="redis"):
        policy.call("op", down)
    assert any(getattr(r, "dependency", None) == "redis" for r in caplog.records)

"""Schema evolution both ways, end to end on the real broker and Redis (and a real registry where named).

* A newer writer (a v3 candidate adding an event type and an optional field) publishes to a topic
  read by today's readers: nothing is dead-lettered, the run's other events are applied, the unknown
  event is counted and shown in ``runjournal inspect`` — unless declared critical (then BLOCKED).
* A topic holding both framings, switched in both directions, projects with 0 dead letters, with
  and without a registry configured on the reader.
* While the registry is down, no reader dead-letters or parks anything; they catch up after.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runjournal.consumers.ops.replay import replay_state
from runjournal.consumers.projector import Projector
from runjournal.core.settings import Settings
from runjournal.model.reducer import RunStatus, state_digest
from runjournal.schemas import EventCodec, EventType, RegistryError, codec_from_settings
from runjournal.schemas.catalog import SchemaCatalog
from runjournal.schemas.keys import partition_for
from tests.conftest import LocalRegistry
from tests.schemas.test_old_events import dlq_records
from tests.support.newer_writer import NEW_TYPE, NewerWriter, v3_run, write_candidate
from tests.support.workload import publish, run_events

pytestmark = [pytest.mark.integration]

RUNJOURNAL = [sys.executable, "-m", "runjournal"]


def _project(settings: Settings, *, wipe: bool = False) -> tuple[Projector, object]:
    projector = Projector(settings)
    if wipe:
        projector.store.wipe()
    return projector, projector.run(until_caught_up=True, idle_timeout_s=60)


def test_newer_writer_is_read_by_todays_readers(topics: Settings, tmp_path: Path,
                                                service_env: dict[str, str]) -> None:
    """Acceptance 1: a v3 agent publishes before any reader is upgraded; no DLQ, run applied, UNKNOWN visible."""
    candidate = write_candidate(tmp_path)
    gate = subprocess.run([*RUNJOURNAL, "schemas", "check", "--candidate", str(candidate), "--json"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert gate.returncode == 0, gate.stdout  # FULL_TRANSITIVE: today's v2 readers read it
    assert json.loads(gate.stdout)["policy"] == "FULL_TRANSITIVE"

    writer = NewerWriter(topics, candidate)
    publish(topics, [*v3_run(writer, "run-v3"), *run_events("run-v2", calls=1)])
    projector, stats = _project(topics)

    assert stats.dead_lettered == 0 and not stats.blocked_runs and not stats.parked_runs
    assert dlq_records(topics) == []
    state = projector.store.get(partition_for("run-v3", topics.partitions), "run-v3")
    assert state is not None and state.status is RunStatus.SUCCEEDED and state.last_seq == 5
    assert state.unknown_events == {NEW_TYPE: 1}  # recorded and counted, not acted on
    assert state.nodes["main"].status.value == "SUCCEEDED" and state.owner == "agent-v3"
    other = projector.store.get(partition_for("run-v2", topics.partitions), "run-v2")
    assert other is not None and other.status is RunStatus.SUCCEEDED and other.unknown_events == {}

    # as a user sees it: `runjournal inspect` names the writer's type in the timeline
    shown = subprocess.run([*RUNJOURNAL, "inspect", "run-v3", "--json"], capture_output=True, text=True,
                           env=service_env, timeout=120, check=False)
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert [row["type"] for row in report["timeline"]] == [
        "RUN_STARTED", "NODE_STARTED", "UNKNOWN", "NODE_SUCCEEDED", "RUN_SUCCEEDED"]
    assert report["timeline"][2]["writer_type"] == NEW_TYPE
    assert report["state"]["unknown_events"] == {NEW_TYPE: 1}
    table = subprocess.run([*RUNJOURNAL, "inspect", "run-v3"], capture_output=True, text=True,
                           env=service_env, timeout=120, check=False)
    assert f"UNKNOWN ({NEW_TYPE})" in table.stdout

    # replay and recovery fold the same records the same way
    assert state_digest(replay_state(topics, "run-v3").state) == state_digest(state)  # type: ignore[arg-type]


def test_unknown_type_declared_critical_parks_the_run_with_a_reason(topics: Settings, tmp_path: Path) -> None:
    writer = NewerWriter(topics, write_candidate(tmp_path))
    publish(topics, v3_run(writer, "run-crit"))
    strict = topics.model_copy(update={"critical_event_types": f"OTHER, {NEW_TYPE.lower()}"})
    projector, stats = _project(strict)

    assert stats.dead_lettered == 0 and stats.blocked_runs == set()  # a decision of the reader, not a bad record
    assert dlq_records(topics) == []
    state = projector.store.get(partition_for("run-crit", topics.partitions), "run-crit")
    assert state is not None and state.status is RunStatus.BLOCKED and state.last_seq == 2
    assert NEW_TYPE in (state.blocked_reason or "") and "critical" in (state.blocked_reason or "")
    assert "RUNJOURNAL_CRITICAL_EVENT_TYPES" in (state.blocked_reason or "")
    assert state.skipped_while_parked == 2


def _switching_runs(single: EventCodec, confluent: EventCodec) -> list[tuple[str, bytes]]:
    """Two runs: one switches single-object → Confluent halfway, the other Confluent → single-object."""
    out = []
    for run_id, first, second in (("run-so-to-cf", single, confluent), ("run-cf-to-so", confluent, single)):
        events = run_events(run_id, calls=2)
        half = len(events) // 2
        out += [(e.key, (first if i < half else second).encode(e)) for i, e in enumerate(events)]
    return out


@pytest.mark.registry
def test_a_topic_holding_both_framings_projects_with_no_dead_letter(registry_topics: Settings) -> None:
    """Acceptance 2: both switch directions on one topic; readers with and without a registry: 0 dead letters."""
    plain = registry_topics.model_copy(update={"schema_registry_url": None})
    single, confluent = codec_from_settings(plain), codec_from_settings(registry_topics)
    assert (single.wire_format, confluent.wire_format) == ("single-object", "confluent")
    records = _switching_runs(single, confluent)
    assert {value[:1] for _key, value in records} == {b"\xc3", b"\x00"}
    publish(registry_topics, records)

    states = {}
    for reader, wipe in ((registry_topics, False), (plain, True)):  # a registry-less reader finds ids in .schemas
        projector, stats = _project(reader, wipe=wipe)
        assert stats.dead_lettered == 0 and not stats.blocked_runs and not stats.parked_runs
        for run_id in ("run-so-to-cf", "run-cf-to-so"):
            state = projector.store.get(partition_for(run_id, reader.partitions), run_id)
            assert state is not None and state.status is RunStatus.SUCCEEDED and state.last_seq == 9
            states.setdefault(run_id, set()).add(state_digest(state))
    assert all(len(digests) == 1 for digests in states.values())  # the same states either way
    assert dlq_records(registry_topics) == []


def test_readers_without_a_catalog_still_decode_shipped_versions() -> None:
    """A bare EventCodec (no settings) reads its own versions in both framings' single-object form."""
    codec = EventCodec()
    event = run_events("run-bare", calls=0)[0]
    assert codec.decode(codec.encode(event)) == event
    assert codec.wire_format == "single-object"


@pytest.mark.registry
@pytest.mark.slow
def test_registry_outage_neither_dead_letters_nor_parks_and_readers_catch_up(
        topics: Settings, own_registry: LocalRegistry, service_env: dict[str, str]) -> None:
    """Acceptance 4: with the registry down, a cold reader meets ids it has never cached; it waits, then catches up."""
    from runjournal.schemas.registration import register_versions

    register_versions(own_registry.url, f"{topics.events_topic}-value")
    with_registry = topics.model_copy(update={"schema_registry_url": own_registry.url})
    runs = ("run-out-1", "run-out-2")
    publish(with_registry, [e for run_id in runs for e in run_events(run_id, calls=1)])
    value = codec_from_settings(with_registry).encode(run_events("run-out-3", calls=0)[0])

    own_registry.stop()
    with pytest.raises(RegistryError):  # the codec names the kind: availability, not content
        codec_from_settings(with_registry).decode(value)

    env = {**service_env, "RUNJOURNAL_SCHEMA_REGISTRY_URL": own_registry.url}
    projector = subprocess.Popen([*RUNJOURNAL, "projector", "--json"], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True)
    try:
        store = Projector(topics).store
        time.sleep(10)  # the projector meets the outage on its first record …
        assert projector.poll() is None and dlq_records(topics) == []
        for run_id in runs:
            state = store.get(partition_for(run_id, topics.partitions), run_id)
            assert state is None or not state.parked  # nothing parked or blocked while the registry is away
        own_registry.start()  # … and catches up when the registry is back
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(_succeeded(store, topics, r) for r in runs):
            time.sleep(0.5)
        assert all(_succeeded(store, topics, r) for r in runs)
    finally:
        projector.terminate()
        out, _ = projector.communicate(timeout=60)
    stats = json.loads(out)
    assert stats["dead_lettered"] == 0 and not stats["blocked_runs"] and not stats["parked_runs"]
    assert dlq_records(topics) == []


def _succeeded(store: object, settings: Settings, run_id: str) -> bool:
    state = store.get(partition_for(run_id, settings.partitions), run_id)  # type: ignore[attr-defined]
    return state is not None and state.status is RunStatus.SUCCEEDED


def test_catalog_round_trip(topics: Settings) -> None:
    """Every writer's schema is in {prefix}.schemas (keyed by fingerprint) before its first event is encoded."""
    codec = codec_from_settings(topics)
    codec.encode(run_events("run-cat", calls=0)[0])
    fresh = SchemaCatalog(topics)
    assert fresh.schema_text(codec.fingerprint) == codec.schema_version.text
    assert fresh.schema_text(0x0123456789ABCDEF) is None
    assert codec.decode(codec.encode(run_events("run-cat", calls=0)[0])).type is EventType.RUN_STARTED


@pytest.mark.registry
def test_one_shot_readers_raise_on_an_outage_instead_of_calling_records_undecodable(
        topics: Settings, own_registry: LocalRegistry) -> None:
    """replay / inspect / the event store meet RegistryError, never an UNDECODABLE record or a BLOCKED replay."""
    from runjournal.consumers.context.execution_stores import KafkaEventStore
    from runjournal.consumers.ops.inspect import read_run_events
    from runjournal.schemas.registration import register_versions

    register_versions(own_registry.url, f"{topics.events_topic}-value")
    with_registry = topics.model_copy(update={"schema_registry_url": own_registry.url})
    publish(with_registry, run_events("run-once", calls=1))
    own_registry.stop()
    with pytest.raises(RegistryError):
        replay_state(with_registry, "run-once")
    with pytest.raises(RegistryError):
        read_run_events(with_registry, "run-once")
    with pytest.raises(RegistryError):
        KafkaEventStore(with_registry).read_run("run-once")
    own_registry.start()
    replayed = replay_state(with_registry, "run-once").state
    assert replayed is not None and replayed.status is RunStatus.SUCCEEDED

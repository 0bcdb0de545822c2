"""Issue 14, the projector under faults — cases 4 (registry outage), 5 (re-created topic), 6 (fenced static
member), 7 (``projector --rebuild``). Each failed on the code before issue 14 (symptom in the docstring)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from runjournal.consumers.projector import Projector
from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.deploy.topics import create_topics
from runjournal.model.reducer import RunStatus
from runjournal.schemas import EventCodec
from runjournal.schemas.keys import partition_for
from runjournal.schemas.registration import register_versions
from tests.conftest import LocalRegistry
from tests.support.faults import live, owned, owns
from tests.support.provider import project
from tests.support.workload import publish, run_events

pytestmark = pytest.mark.integration


def _state(projector_or_store, settings: Settings, run: str):  # noqa: ANN001, ANN202
    store = getattr(projector_or_store, "store", projector_or_store)
    return store.get(partition_for(run, settings.partitions), run)


# -- case 4 ------------------------------------------------------------------------------------------------------
@pytest.mark.registry
@pytest.mark.slow
def test_case4_registry_outage_projector_waits_never_dead_letters_or_blocks(topics: Settings,
                                                                              own_registry: LocalRegistry) -> None:
    """Old: the projector dead-lettered every record it could not decode because the registry was away, and
    BLOCKED their runs. Now it waits (logged, counted), writes nothing, and folds the same records once the
    registry answers.

    Covers: Confluent-framed records written through a real registry process, which is then stopped (the
    projector's cold codec meets ids it never cached: a real outage), then started again on the same port
    (the outage ends; same projector process, no restart)."""
    run = "reg-run"
    register_versions(own_registry.url, f"{topics.events_topic}-value")
    writer = EventCodec(schema_registry_url=own_registry.url, topic=topics.events_topic)
    publish(topics, [(e.key, writer.encode(e)) for e in run_events(run)])
    own_registry.stop()
    away = EventCodec(schema_registry_url=own_registry.url, topic=topics.events_topic)
    projector = Projector(topics, codec=away)
    stop = threading.Event()
    thread = threading.Thread(target=projector.run, kwargs={"stop": stop}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60

    def waits() -> int:
        return getattr(getattr(projector, "policy", None), "retries", 0)

    while waits() < 3 and not projector.stats.dead_lettered and time.monotonic() < deadline:
        time.sleep(0.1)
    assert projector.stats.dead_lettered == 0 and not projector.stats.blocked_runs, "a registry outage is no bad record"
    assert waits() >= 3, "the projector must be waiting out the outage"
    assert projector.store.applied_offset(partition_for(run, topics.partitions)) == -1  # nothing moved
    own_registry.start()  # the registry answers again
    while _state(projector, topics, run) is None and time.monotonic() < deadline + 30:
        time.sleep(0.1)
    stop.set()
    thread.join(30)
    state = _state(projector, topics, run)
    assert state is not None and state.status is RunStatus.SUCCEEDED and projector.stats.dead_lettered == 0


# -- case 5 ------------------------------------------------------------------------------------------------------
def _recreate(settings: Settings) -> None:
    admin = kafka.admin_client(settings)
    for fut in admin.delete_topics([settings.events_topic], operation_timeout=30).values():
        fut.result(60)
    deadline = time.monotonic() + 60
    while True:
        try:
            create_topics(settings)
            return
        except Exception:  # noqa: BLE001 - the deletion completes asynchronously
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_case5_recreated_topic_is_a_named_error_not_a_silent_skip(topics: Settings, service_env: dict[str, str]
                                                                    ) -> None:
    """Old: after the topic was deleted and created again the projector sought past the new records (Redis
    held the old applied offsets), handled 0 events, exited 0 as caught up, and the new runs had no state;
    recovery read with the same assumption. Now both stop with TopicMismatchError naming the repair, and
    ``runjournal projector --rebuild`` (a subprocess, as a user runs it) projects the new topic."""
    publish(topics, [e for i in range(3) for e in run_events(f"old-{i}")])
    project(topics)
    _recreate(topics)
    publish(topics, run_events("new-run", finish=False))
    with pytest.raises(Exception, match="projector --rebuild") as raised:  # noqa: PT011 - the name is checked
        Projector(topics).run(until_caught_up=True, idle_timeout_s=30)
    assert type(raised.value).__name__ == "TopicMismatchError"
    owns(topics, "agent-1", "new-run")
    live(topics, "taker")
    with pytest.raises(Exception, match="projector --rebuild"):  # noqa: PT011 - TopicMismatchError, by message
        RecoveryJob(topics).recover(stale=True)
    assert owned(topics, "agent-1") == {"new-run"}, "nothing decided from a projection of another topic"
    cli = subprocess.run([sys.executable, "-m", "runjournal", "projector", "--until-caught-up", "--json"],
                         env=service_env, capture_output=True, text=True, timeout=120, check=False)
    assert cli.returncode == 1 and "projector --rebuild" in cli.stderr, cli.stderr[-2000:]
    cli = subprocess.run([sys.executable, "-m", "runjournal", "projector", "--rebuild", "--until-caught-up", "--json"],
                         env=service_env, capture_output=True, text=True, timeout=120, check=False)
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert json.loads(cli.stdout)["events"] == len(run_events("new-run", finish=False))
    store = project(topics)
    assert _state(store, topics, "new-run") is not None and _state(store, topics, "old-0") is None


# -- case 6 ------------------------------------------------------------------------------------------------------
def test_case6_fenced_static_member_exits_non_zero_naming_the_cause(topics: Settings, service_env: dict[str, str]
                                                                      ) -> None:
    """Old: with two ``runjournal projector --instance-id X`` the broker fenced the first, which logged one warning,
    stayed alive doing nothing and exited 0 on SIGTERM. Now it exits 1 at once, naming the cause and the fix."""
    argv = [sys.executable, "-m", "runjournal", "projector", "--instance-id", "same-id"]
    first = subprocess.Popen(argv, env=service_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(8)  # joined the group
        assert first.poll() is None, first.stderr.read()[-2000:] if first.stderr else ""
        second = subprocess.Popen(argv, env=service_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            rc = first.wait(60)
        except subprocess.TimeoutExpired:
            first.terminate()
            rc = first.wait(30)
            pytest.fail(f"the fenced projector stayed alive (exit {rc} on SIGTERM)")
        finally:
            second.terminate()
            second.wait(30)
        err = first.stderr.read() if first.stderr else ""
        assert rc == 1 and "instance-id" in err, (rc, err[-2000:])
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)


# -- case 7 ------------------------------------------------------------------------------------------------------
def test_case7_projector_rebuild_flag_runs(topics: Settings, service_env: dict[str, str]) -> None:
    """Old: ``runjournal projector --rebuild`` crashed (Console.print() got an unexpected keyword argument
    'stderr') right after wiping the projection — the repair the README gives for parked runs."""
    publish(topics, run_events("rb-run"))
    project(topics)
    cli = subprocess.run([sys.executable, "-m", "runjournal", "projector", "--rebuild", "--until-caught-up", "--json"],
                         env=service_env, capture_output=True, text=True, timeout=120, check=False)
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert json.loads(cli.stdout)["events"] == len(run_events("rb-run"))  # replayed from the earliest offset
    assert "wiped" in cli.stderr
    store = project(topics)
    assert _state(store, topics, "rb-run").status is RunStatus.SUCCEEDED

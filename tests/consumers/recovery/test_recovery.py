"""Recovery, resume, replay and approvals — the seed's verification table as named tests.

Real processes, real broker, real Redis; the demo provider's SQLite ledger is the independent
witness of how many times an effect really ran (idempotency OFF, so a repeat would show).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core.settings import Settings
from runjournal.model.reducer import CallStatus, RunStatus
from runjournal.producers.plan import CallVerdict as PlanClass
from runjournal.producers.plan import PlanStore
from runjournal.schemas.keys import partition_for
from tests.consumers.projector.test_projector import redis_digests, topic_fold_digests
from tests.support.provider import Provider, child, project, running_provider, wait_lease, wait_lease_gone

pytestmark = [pytest.mark.integration, pytest.mark.crash]


@pytest.fixture
def provider(tmp_path: Path, service_env: dict[str, str]) -> Iterator[Provider]:
    with running_provider(tmp_path, service_env) as running:
        yield running


@pytest.fixture(params=["group", "strict"])
def mode_env(request: pytest.FixtureRequest, service_env: dict[str, str]) -> dict[str, str]:
    """The agents' environment in each outcome mode (``RUNJOURNAL_OUTCOME_COMMIT``): the demo provider's tool can
    reconcile, so in ``group`` its TOOL_CALL_COMMITTED rides the next commit; in ``strict`` it is committed before
    ``call`` returns."""
    return {**service_env, "RUNJOURNAL_OUTCOME_COMMIT": request.param}


def _group(env: dict[str, str]) -> bool:
    return env["RUNJOURNAL_OUTCOME_COMMIT"] == "group"


def crash_then_recover(topics: Settings, env: dict[str, str], provider: Provider, run_id: str,
                       failpoint: str, *, sends: int = 1) -> dict:
    """Crash agent-a at ``failpoint``, recover, and let agent-b resume the run (or, when nothing of it was
    ever acknowledged, start it again — what a caller does with a run that never durably started)."""
    crashed = child(env, run_id, "agent-a", provider, failpoint=failpoint, sends=sends)
    assert crashed.wait(60) == -signal.SIGKILL, crashed.stderr.read()[-3000:]
    wait_lease_gone(topics, "agent-a")
    taker = child(env, run_id, "agent-b", provider, resume=True, sends=sends)
    wait_lease(topics, "agent-b")
    job = RecoveryJob(topics)
    report = job.recover(stale=True).as_dict()
    job.close()
    if report["runs"][0]["action"] == "no_facts":
        taker.terminate()
        taker.wait(30)
        taker = child(env, run_id, "agent-b2", provider, sends=sends)
    assert taker.wait(60) == 0, taker.stderr.read()[-3000:]
    return report


# -- the crash matrix -------------------------------------------------------------------------------
MATRIX = {
    # point where agent-a is SIGKILLed -> the class recovery must give the send (None: the run has no facts),
    # in strict mode; in group mode the outcome is not yet acknowledged at after_outcome (GROUP_MATRIX)
    "producers.call.before_intent_commit": None,
    "producers.call.after_intent": PlanClass.OUTCOME_UNKNOWN,
    "producers.call.before_send": PlanClass.OUTCOME_UNKNOWN,
    "producers.call.after_tool": PlanClass.OUTCOME_UNKNOWN,
    "producers.call.after_outcome": PlanClass.COMMITTED,
}
#: Group commit: the outcome rode the open transaction that the fence aborted — an unknown outcome that the
#: resumed run reconciles by key (executed once), never a re-run and never a lost effect.
GROUP_MATRIX = {**MATRIX, "producers.call.after_outcome": PlanClass.OUTCOME_UNKNOWN}


@pytest.mark.parametrize("point", list(MATRIX))
@pytest.mark.slow
def test_crash_matrix_each_side_effect_exactly_once(topics: Settings, mode_env: dict[str, str],
                                                    provider: Provider, point: str) -> None:
    expected_class = (GROUP_MATRIX if _group(mode_env) else MATRIX)[point]
    run_id = f"cm-{point.rsplit('.', 1)[1]}"
    report = crash_then_recover(topics, mode_env, provider, run_id, f"{point}=1")
    (outcome,) = report["runs"]
    assert report["fenced"] == ["agent-a"]
    if expected_class is None:
        # RUN_STARTED and the intent shared the transaction the fence aborted: nothing happened, nothing is known
        assert outcome["action"] == "no_facts"
    else:
        assert outcome["action"] == "resumed" and outcome["assigned_to"] == "agent-b" and outcome["epoch"] == 2
        assert outcome["calls"] == {expected_class.value: 1}
    assert provider.executions() == 1, "the email must be sent exactly once, whatever the crash point"
    store = project(topics)
    state = store.get(partition_for(run_id, topics.partitions), run_id)
    assert state.status == RunStatus.SUCCEEDED and state.epoch == (1 if expected_class is None else 2)
    (record,) = state.records.values()
    assert record.status in (CallStatus.COMMITTED, CallStatus.RECONCILED)
    assert redis_digests(topics, [run_id]) == topic_fold_digests(topics, [run_id])


def test_crash_after_effect_before_transcript_resume_sees_it_done(topics: Settings, mode_env: dict[str, str],
                                                                  provider: Provider) -> None:
    """Seed table: side effect succeeded, transcript not appended, crash → resume sees the action as done: from the
    journal (strict: the outcome was acknowledged) or from the provider by key (group: the outcome rode the
    transaction the fence aborted, so the call is OUTCOME_UNKNOWN and reconciled as committed, not sent again)."""
    report = crash_then_recover(topics, mode_env, provider, "mail-1", "producers.call.after_outcome=1")
    assert report["runs"][0]["calls"] == ({"OUTCOME_UNKNOWN": 1} if _group(mode_env) else {"COMMITTED": 1})
    assert provider.executions() == 1
    (record,) = project(topics).get(partition_for("mail-1", topics.partitions), "mail-1").records.values()
    if _group(mode_env):
        assert record.status == CallStatus.RECONCILED and record.reconciled_outcome.value == "COMMITTED"
    else:
        assert record.status == CallStatus.COMMITTED


def test_group_commit_crash_after_the_commit_that_carried_the_outcome(topics: Settings,
                                                                       service_env: dict[str, str],
                                                                       provider: Provider) -> None:
    """Group commit, the other side of its window: SIGKILL right after the commit that acknowledged send 1's
    deferred outcome (the next send's intent commit, or the keeper's ``outcome_linger_ms`` commit if that came
    first). Send 1 is COMMITTED — from the journal, never reconciled or re-sent — and send 2 runs once."""
    env = {**service_env, "RUNJOURNAL_OUTCOME_COMMIT": "group"}
    report = crash_then_recover(topics, env, provider, "mail-g", "producers.txn.after_outcome_commit=1", sends=2)
    calls = report["runs"][0]["calls"]
    assert calls.get("COMMITTED") == 1 and sum(calls.values()) <= 2, calls  # send 2: intended (unknown) or absent
    assert provider.executions() == 2, "each email exactly once"
    state = project(topics).get(partition_for("mail-g", topics.partitions), "mail-g")
    first, second = sorted(state.records.values(), key=lambda r: r.intended_offset)
    assert first.status == CallStatus.COMMITTED and first.epoch == 1, "acknowledged by the crashed instance"
    assert state.status == RunStatus.SUCCEEDED and second.epoch == 2


def test_memory_saying_sent_does_not_override_unknown_outcome(topics: Settings, service_env: dict[str, str],
                                                              provider: Provider) -> None:
    """Seed table: memory holds "the email has been sent", the record says INTENDED without outcome → the plan
    says OUTCOME_UNKNOWN and the resumed run reconciles: not skipped past the send, not blindly re-sent."""
    run_id = "mail-2"
    crashed = child(service_env, run_id, "agent-a", provider, failpoint="producers.call.after_tool=1")
    assert crashed.wait(60) == -signal.SIGKILL
    _write_misleading_memory(topics, run_id)
    wait_lease_gone(topics, "agent-a")
    taker = child(service_env, run_id, "agent-b", provider, resume=True)
    wait_lease(topics, "agent-b")
    job = RecoveryJob(topics)
    report = job.recover(stale=True).as_dict()
    plan = PlanStore(redis.Redis.from_url(topics.redis_url), topics.topic_prefix).get(run_id)
    job.close()
    assert report["runs"][0]["calls"] == {"OUTCOME_UNKNOWN": 1}
    assert [c.status for c in plan.calls.values()] == [PlanClass.OUTCOME_UNKNOWN]
    assert taker.wait(60) == 0
    assert provider.executions() == 1  # reconciled through the provider: executed once, not re-sent
    state = project(topics).get(partition_for(run_id, topics.partitions), run_id)
    (record,) = state.records.values()
    assert record.status == CallStatus.RECONCILED and record.reconciled_outcome.value == "COMMITTED"


def _write_misleading_memory(settings: Settings, run_id: str) -> None:
    """Put "the email has been sent" into the memory plane, for this run's tenant, user and run."""
    from datetime import UTC, datetime

    from runjournal.consumers.memory import ItemKind, MemoryItem, Provenance, QdrantMemoryStore, Scope
    from runjournal.testing import HashingEmbedder

    item = MemoryItem(text="The confirmation email has been sent to bob.", kind=ItemKind.FACT, subject="email",
                      scope=Scope("tenant-a", "u1"), created_at=datetime.now(UTC),
                      provenance=Provenance(run_id=run_id, event_id="e-memory", event_type="MESSAGE",
                                            topic=settings.events_topic, partition=0, offset=0, schema="test",
                                            extractor="test"))
    with QdrantMemoryStore.open(settings, HashingEmbedder()) as store:
        assert store.upsert([item]) == 1
        assert store.search(Scope("tenant-a", "u1"), "was the email sent?")[0].text.startswith("The confirmation")


def test_zombie_cannot_start_a_new_side_effect(topics: Settings, mode_env: dict[str, str],
                                               provider: Provider) -> None:
    """SIGSTOP after its send's outcome, lease expires, the run is recovered and finished elsewhere, SIGCONT:
    the zombie is fenced at the broker, writes no new intent, starts no new effect; its send stays on record —
    committed (strict), or, its outcome having ridden the transaction the fence aborted (group), reconciled by
    key as committed: sent once either way."""
    service_env = mode_env
    run_id = "zombie-1"
    zombie = child(service_env, run_id, "agent-a", provider, failpoint="producers.call.after_outcome=1:stop",
                   sends=2)
    deadline = time.monotonic() + 30
    while provider.executions() < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    wait_lease_gone(topics, "agent-a")
    taker = child(service_env, run_id, "agent-b", provider, resume=True, sends=2)
    wait_lease(topics, "agent-b")
    job = RecoveryJob(topics)
    report = job.recover(stale=True).as_dict()
    job.close()
    known = "OUTCOME_UNKNOWN" if _group(mode_env) else "COMMITTED"
    assert report["fenced"] == ["agent-a"] and report["runs"][0]["calls"] == {known: 1}
    assert taker.wait(60) == 0
    assert provider.executions() == 2  # send 1 by the zombie before the pause, send 2 by agent-b
    zombie.send_signal(signal.SIGCONT)  # it goes on to send 2: its intent must be refused
    rc = zombie.wait(60)
    assert rc != 0, "the zombie must fail: it is fenced"
    # Fenced either at the broker (ProducerFencedError) or, when its heartbeat wakes first, by its lapsed lease
    # (LeaseLapsedError, a ProducerFencedError): both refuse the intent, which the provider count below proves.
    err = zombie.stderr.read()
    assert "ProducerFencedError" in err or "LeaseLapsedError" in err or "Fenced" in err, err[-2000:]
    assert provider.executions() == 2
    state = project(topics).get(partition_for(run_id, topics.partitions), run_id)
    assert state.status == RunStatus.SUCCEEDED and state.epoch == 2
    first, second = sorted(state.records.values(), key=lambda r: r.intended_offset)
    assert first.epoch == 1  # the zombie's effect is still on record
    if _group(mode_env):
        assert first.status == CallStatus.RECONCILED and first.reconciled_outcome.value == "COMMITTED"
    else:
        assert first.status == CallStatus.COMMITTED
    assert second.status == CallStatus.COMMITTED and second.epoch == 2


def test_zombie_paused_between_intent_and_send_is_stopped_by_the_providers_fencing_token(
        topics: Settings, service_env: dict[str, str], provider: Provider) -> None:
    """SIGSTOP right after the intent is acknowledged, before the request is sent; recovery reconciles (not
    executed) and the new owner sends; SIGCONT: the zombie's lease is gone, so it does not send — and were it
    to, the provider refuses its older epoch (the fence the reconcile registered). Idempotency is OFF."""
    run_id = "zombie-2"
    zombie = child(service_env, run_id, "agent-a", provider, failpoint="producers.call.after_intent=1:stop")
    wait_lease(topics, "agent-a")
    wait_lease_gone(topics, "agent-a", timeout_s=30)
    taker = child(service_env, run_id, "agent-b", provider, resume=True)
    wait_lease(topics, "agent-b")
    job = RecoveryJob(topics)
    report = job.recover(stale=True).as_dict()
    job.close()
    assert report["runs"][0]["calls"] == {"OUTCOME_UNKNOWN": 1}
    assert taker.wait(60) == 0
    assert provider.executions() == 1
    zombie.send_signal(signal.SIGCONT)
    assert zombie.wait(60) != 0
    assert provider.executions() == 1, "the paused zombie must not send a second email"

"""Operator controls under least privilege: credentials that may make requests but not run a recovery pass.

docs/operations/cluster-and-least-privilege.md; ``runjournal.consumers.ops.control`` (module docstring). On the
secure cluster the operator's Kafka user has no transactional id (tests/cluster: a pause and a resume as the real
operator user); here the same refusal comes from Redis: a user that reads everything of the prefix and may write only
the requests (``control``) and signals — what a pass writes (plans, owned sets, assignments) is refused. Nothing fails:
each request stays durable, the recovery service (its own user: the suite's administrator here) carries it out at its
next sweep, and the run's events say who asked.
"""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import SecretStr

from runjournal.consumers.ops.control import Operator
from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core import redis_client
from runjournal.core.settings import Settings
from runjournal.deploy.redis_acls import family_globs
from runjournal.model.reducer import RunStatus
from runjournal.producers import Journal, RunPausedError
from runjournal.producers.control import RESUME
from runjournal.schemas import EventType
from tests.consumers.ops.test_control import LEASE_MS, Ledger
from tests.support.readback import events_of, read_committed

pytestmark = pytest.mark.integration


@pytest.fixture
def requester(topics: Settings) -> Iterator[Operator]:
    """An Operator whose Redis user reads the prefix and writes only requests, timers and signals."""
    admin = redis_client.client(topics)
    user, password = f"rj-req-{uuid.uuid4().hex[:8]}", secrets.token_hex(12)
    reads = [f"%R~{g}" for g in family_globs("everything", topics.topic_prefix)]
    writes = [f"~{g}" for fam in ("control", "signals") for g in family_globs(fam, topics.topic_prefix)]
    admin.execute_command("ACL", "SETUSER", user, "on", f">{password}", *reads, *writes, "+@read", "+@write",
                          "-@dangerous", "+ping", "+command", "+time", "+eval", "+evalsha", "+script|load")
    settings = topics.model_copy(update={"redis_username": user, "redis_password": SecretStr(password)})
    try:
        with Operator(settings, wait_s=3, poll_s=0.1) as op:
            yield op
    finally:
        admin.execute_command("ACL", "DELUSER", user)


def test_pause_and_resume_without_recovery_rights_are_carried_out_by_the_recovery_service(
        topics: Settings, requester: Operator) -> None:
    tool = Ledger()
    service = RecoveryJob(topics)
    with Journal(topics, producer_id=f"a-{uuid.uuid4().hex[:8]}", lease_ttl_ms=LEASE_MS) as journal:
        run = journal.start_run("t", "payer", {"n": 2})
        first = run.call(tool, {"amount": 1})
        asked: list[Any] = []
        asking = threading.Thread(target=lambda: asked.append(requester.pause(run.run_id, reason="budget",
                                                                              requested_by="ops@test")))
        asking.start()
        with pytest.raises(RunPausedError):
            for _ in range(200):
                run.call(tool, {"amount": 2})
                time.sleep(0.05)
        asking.join(30)
        (paused,) = asked
        # the owner gave the run up; the operator's own pass was refused: left to the service, not an error
        assert paused.outcome == "requested" and "recovery service" in paused.detail, paused
        assert requester.refused is not None and "NoPermission" in requester.refused
        swept = service.recover(stale=True)
        assert [r.action for r in swept.runs if r.run_id == run.run_id] == ["paused"], swept
        assert requester.controls.get(run.run_id) is None  # carried out: removed
        # a resume: stored as a request with its timer; the stale sweep leaves it, the wake pass carries it out
        resumed = requester.resume(run.run_id, reason="approved", requested_by="lead@test")
        assert resumed.outcome == "requested" and resumed.request["action"] == RESUME, resumed
        assert journal.request_for(run.run_id) is None  # an owner never takes a resume for a stop
        swept = service.recover(stale=True)  # the sweep, then its wake pass
        woken = service.wake()
        actions = [r.action for r in [*swept.runs, *woken.runs] if r.run_id == run.run_id]
        assert "resumed" in actions, (swept, woken)
        assert requester.controls.get(run.run_id) is None
        assert journal.claim_assignment(5) == run.run_id
        again = journal.resume(run.run_id)
        assert again.call(tool, {"amount": 1}) == first
        again.succeed("done")
    assert all(n == 1 for n in tool.ran.values()), tool.ran
    events = events_of(read_committed(topics), run.run_id)
    held = [e for e in events if e.type is EventType.RUN_RESUMED]
    assert [bool(e.payload.get("paused")) for e in held] == [True, False]
    assert held[0].payload["requested_by"] == "ops@test" and held[1].payload["requested_by"] == "lead@test"
    assert held[1].payload["request_reason"] == "approved"
    assert requester._fold(run.run_id).status is RunStatus.SUCCEEDED  # noqa: SLF001 - the journal to its end


def test_a_resume_request_stands_against_a_second_and_yields_to_a_pause_or_cancel(
        topics: Settings, requester: Operator) -> None:
    store, run_id = requester.controls, f"r-{uuid.uuid4().hex[:6]}"
    stored, first = store.request(run_id, RESUME, requested_by="a", reason="")
    assert stored and run_id in store.due(store.now_ms() + 1)  # its timer, armed in the same script
    assert store.request(run_id, RESUME, requested_by="b", reason="") == (False, first)
    stored, pause = store.request(run_id, "pause", requested_by="c", reason="")
    assert stored and store.get(run_id) == pause  # the later pause wins: the run stays held
    stored, cancel = store.request(run_id, "cancel", requested_by="d", reason="")
    assert stored and store.request(run_id, RESUME, requested_by="e", reason="") == (False, cancel)
    store.disarm([run_id])
    assert store.done(cancel)


def test_a_resume_left_to_the_service_is_moot_once_another_operator_resumed_the_run(
        topics: Settings, requester: Operator) -> None:
    """Two operators at once: one with recovery rights resumes the run itself while the other's resume request is
    pending; the service's wake pass finds the run running, resumes nothing and removes the moot request."""
    service = RecoveryJob(topics)
    with Journal(topics, producer_id=f"a-{uuid.uuid4().hex[:8]}", lease_ttl_ms=LEASE_MS) as journal, \
            Operator(topics, wait_s=10, poll_s=0.1) as full:
        run = journal.start_run("t", "payer", {})
        run.call(Ledger(), {"amount": 1})
        asked: list[Any] = []
        asking = threading.Thread(target=lambda: asked.append(full.pause(run.run_id)))
        asking.start()
        with pytest.raises(RunPausedError):
            for _ in range(200):
                run.call(Ledger(), {"amount": 2})
                time.sleep(0.05)
        asking.join(30)
        assert asked[0].outcome == "paused", asked
        left = requester.resume(run.run_id, requested_by="slow@test")
        assert left.outcome == "requested"
        # the other operator's own pass resumes the run (it reads the pending resume and removes it with its commit)
        done = full.resume(run.run_id, requested_by="fast@test")
        assert done.outcome == "resumed", done
        assert requester.controls.get(run.run_id) is None
        woken = service.wake()
        assert all(r.action != "resumed" for r in woken.runs if r.run_id == run.run_id), woken
        events = events_of(read_committed(topics), run.run_id)
        resumed = [e.payload for e in events if e.type is EventType.RUN_RESUMED and not e.payload.get("paused")]
        assert [p["requested_by"] for p in resumed] == ["fast@test"]  # one hand-over, not two

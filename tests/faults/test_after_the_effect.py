"""After the effect: an invoked tool's call ends COMMITTED, FAILED or OUTCOME_UNKNOWN — never re-run under a new key.

Issue 13, cases 3-6, on the real broker and Redis; a Redis ledger written only by the tool is the witness
of how many times an effect ran and under which keys.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.model.reducer import CallStatus, RunStatus, fold
from runjournal.producers import Journal, JournalError, RunHandle
from runjournal.producers.approvals import ApprovalInbox, await_approval
from runjournal.schemas import EventType
from tests.support.ledger import Ledger, LedgerTool
from tests.support.readback import events_of, read_committed

pytestmark = pytest.mark.integration


@pytest.fixture
def ledger(topics: Settings) -> Ledger:
    return Ledger(redis.Redis.from_url(topics.redis_url), topics.topic_prefix)


@pytest.fixture
def small_records(topics: Settings) -> Settings:
    """The events topic refuses records over 3000 bytes (the broker, not our codec, says no)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    admin = kafka.admin_client(topics)
    entry = ConfigEntry("max.message.bytes", "3000", incremental_operation=AlterConfigOpType.SET)
    res = ConfigResource("topic", topics.events_topic, incremental_configs=[entry])
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result()
    return topics


@pytest.fixture
def journal(topics: Settings) -> Iterator[Journal]:
    with Journal(topics, producer_id=f"a-{uuid.uuid4().hex[:8]}") as j:
        yield j


def folded(settings: Settings, run_id: str) -> Any:
    records = [r for r in read_committed(settings) if r.event.run_id == run_id]
    return fold((r.event, r.partition, r.offset) for r in records)


def call_with_natural_retry(run: RunHandle, tool: LedgerTool, args: dict[str, Any], tries: int = 3) -> Any:
    """What an agent does when ``call`` raises a transient error: call again."""
    for attempt in range(tries):
        try:
            return run.call(tool, args)
        except JournalError:
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


# -- case 3: the outcome publish fails after the tool returned ---------------------------------------
def test_outcome_publish_refused_by_the_broker_is_not_a_new_attempt(small_records: Settings, ledger: Ledger) -> None:
    """The broker refuses TOOL_CALL_COMMITTED (its inline result is over the topic's max.message.bytes): an
    abortable, retryable transaction error after the tool ran. The caller's natural retry must not run the tool
    again under a new key; the outcome ends durable and the caller gets the tool's value."""
    big = {"itinerary": secrets.token_hex(3900)}  # ~7.8 KB inline, incompressible: over 3000
    tool = LedgerTool(ledger, result=big)
    with Journal(small_records, producer_id=f"a-{uuid.uuid4().hex[:8]}") as journal:
        run = journal.start_run("t", "booker", {})
        with run.node("book"):
            value = call_with_natural_retry(run, tool, {"logical": "book-1"})
        run.succeed()
    assert value == big
    assert ledger.keys_of("book-1") == set(tool.seen[:1]), "one logical call, one idempotency key"
    assert ledger.executions() == 1, "the effect ran once"
    state = folded(small_records, run.run_id)
    (record,) = state.records.values()
    assert record.status is CallStatus.COMMITTED and state.status is RunStatus.SUCCEEDED


def test_a_tool_that_times_out_after_its_request_left_is_reconciled_not_re_run(topics: Settings,
                                                                               ledger: Ledger) -> None:
    """A timeout after the request left (the reply was lost) is not a definite failure: recorded as a retryable
    FAILED, resume would run it again. It must stay OUTCOME_UNKNOWN and be reconciled by key."""
    tool = LedgerTool(ledger, result={"booking": "B1"}, then="timeout_after")
    dead = Journal(topics, producer_id=f"dead-{uuid.uuid4().hex[:6]}", lease_ttl_ms=500)
    run = dead.start_run("t", "booker", {})
    with pytest.raises(Exception) as raised, run.node("book"):
        run.call(tool, {"logical": "book-1"})
    dead.close()  # the instance goes away with the run unfinished
    assert ledger.executions() == 1
    live = Journal(topics, producer_id=f"live-{uuid.uuid4().hex[:6]}")
    job = RecoveryJob(topics, max_wait_s=5)
    report = job.recover(stale=True).as_dict()
    job.close()
    with live:
        assert live.claim_assignment(timeout_s=5) == run.run_id
        resumed = live.resume(run.run_id)
        tool.then = "return"
        with resumed.node("book"):
            assert resumed.call(tool, {"logical": "book-1"}) == {"booking": "B1"}
        resumed.succeed()
    assert report["runs"][0]["calls"] == {"OUTCOME_UNKNOWN": 1}, f"{report}; the live call raised {raised.value!r}"
    assert ledger.executions() == 1, "reconciled through the provider, not run again"
    (record,) = folded(topics, run.run_id).records.values()
    assert record.status is CallStatus.RECONCILED and record.effect_committed


# -- case 4: the result does not encode ----------------------------------------------------------------
@pytest.mark.parametrize("result", [{1: "x", "total": 2}, "caf\udce9", {1: "x"}, float("nan")],
                         ids=["mixed-keys", "lone-surrogate", "int-key", "nan"])
def test_an_unrecordable_result_keeps_the_outcome_and_fails_with_a_named_error(topics: Settings, journal: Journal,
                                                                               ledger: Ledger, result: Any) -> None:
    tool = LedgerTool(ledger, result=result)
    run = journal.start_run("t", "booker", {})
    with pytest.raises(Exception) as raised, run, run.node("book"):
        run.call(tool, {"logical": "book-1"})
    assert type(raised.value).__name__ == "UnrecordableResultError", repr(raised.value)
    assert ledger.executions() == 1
    state = folded(topics, run.run_id)
    (record,) = state.records.values()
    assert record.status is CallStatus.COMMITTED, "the effect happened: its outcome is durable"
    assert state.status is RunStatus.FAILED


def test_the_live_caller_receives_what_the_journal_records(topics: Settings, journal: Journal,
                                                           ledger: Ledger) -> None:
    """A tuple, a float and non-ASCII text: the live caller gets exactly the value a resumed run reads back."""
    result = {"seats": (1, 2), "price": 0.1, "note": "café ☕", "n": 2**70}
    tool = LedgerTool(ledger, result=result)
    run = journal.start_run("t", "booker", {})
    live_value = run.call(tool, {"logical": "book-1"})
    run.succeed()
    import json

    (record,) = folded(topics, run.run_id).records.values()
    assert live_value == json.loads(record.result_json)
    assert type(live_value["seats"]) is list


# -- case 5: reusing a run_id ------------------------------------------------------------------------------------
def test_start_run_refuses_an_existing_run_id(topics: Settings, journal: Journal, ledger: Ledger) -> None:
    r = redis.Redis.from_url(topics.redis_url)
    inbox = ApprovalInbox(r, topics.topic_prefix)
    tool = LedgerTool(ledger, result={"sent": True})

    def agent(run: RunHandle) -> None:
        with run.node("send") as path:
            inbox.decide(run.run_id, path, granted=True, approver="alice")
            assert await_approval(run, inbox, path, "needs a human", timeout_s=10)
            run.call(tool, {"logical": "send"})
        raise RuntimeError("the agent failed after the send")

    run = journal.start_run("t", "mailer", {}, run_id=f"r-{uuid.uuid4().hex[:8]}")
    with pytest.raises(RuntimeError), run:
        agent(run)
    before = events_of(read_committed(topics), run.run_id)
    with pytest.raises(JournalError) as refused:
        again = journal.start_run("t", "mailer", {}, run_id=run.run_id)
        with pytest.raises(RuntimeError), again:
            agent(again)
    assert type(refused.value).__name__ == "RunExistsError"
    assert events_of(read_committed(topics), run.run_id) == before, "history is not rewritten"
    assert ledger.executions() == 1
    assert folded(topics, run.run_id).status is RunStatus.FAILED


# -- case 6: values outside an Avro int -------------------------------------------------------------------------
def test_an_int_field_refuses_a_value_outside_avro_int(topics: Settings, journal: Journal) -> None:
    run = journal.start_run("t", "a", {})
    with pytest.raises(Exception) as raised:
        run.emit("NODE_STARTED", {"node_path": "n", "attempt": 2**31})
    assert getattr(raised.value, "field", None) == "payload.attempt", repr(raised.value)
    assert run.writable and run.last_seq == 1
    run.succeed()
    assert [e.type for e in events_of(read_committed(topics), run.run_id)] == [EventType.RUN_STARTED,
                                                                             EventType.RUN_SUCCEEDED]


def test_a_failed_run_is_continued_under_a_new_epoch(topics: Settings, journal: Journal, ledger: Ledger) -> None:
    """Continuing a failed run: recorded results are returned (not re-run), the recorded approval is honoured
    (not asked again), the failed call runs again under its own key; the run ends SUCCEEDED in epoch 2."""
    from runjournal.consumers.recovery import RunNotContinuableError, continue_run
    from runjournal.producers import RunExistsError

    inbox = ApprovalInbox(redis.Redis.from_url(topics.redis_url), topics.topic_prefix)
    book = LedgerTool(ledger, name="book", result={"booking": "B1"})

    class Unavailable(RuntimeError):
        retryable = True

    def pay_down() -> None:
        raise Unavailable("payment provider down")

    pay = LedgerTool(ledger, name="pay", result={"paid": 12}, before=pay_down)

    def agent(run: RunHandle) -> Any:
        with run.node("book"):
            booking = run.call(book, {"logical": "book"})
        with run.node("pay") as path:
            if not await_approval(run, inbox, path, "payment needs a human", timeout_s=10):
                raise RuntimeError("payment not approved")
            paid = run.call(pay, {"logical": "pay"})
        return {**booking, **paid}

    run = journal.start_run("t", "travel", {}, run_id=f"r-{uuid.uuid4().hex[:8]}")
    inbox.decide(run.run_id, "pay", granted=True, approver="alice")
    with pytest.raises(Unavailable), run:
        agent(run)
    with pytest.raises(RunExistsError):
        journal.start_run("t", "travel", {}, run_id=run.run_id)
    pay.before = None
    continued = continue_run(journal, run.run_id)
    assert continued.epoch == 2
    with continued:
        assert agent(continued) == {"booking": "B1", "paid": 12}
        continued.succeed()
    assert ledger.executions() == 2 and book.seen == [book.seen[0]], "the booking ran once"
    assert pay.seen[0] == pay.seen[1], "the failed payment ran again under its own key"
    events = events_of(read_committed(topics), run.run_id)
    assert [e.type for e in events].count(EventType.APPROVAL_REQUESTED) == 1, "the approval is not asked again"
    state = folded(topics, run.run_id)
    assert state.status is RunStatus.SUCCEEDED and state.epoch == 2
    with pytest.raises(RunNotContinuableError, match="finished"):
        continue_run(journal, run.run_id)


@pytest.mark.parametrize("failures", [1, 5], ids=["then-succeeds", "keeps-failing"])
def test_a_retried_call_keeps_its_key_live_on_resume_and_in_replay(topics: Settings, journal: Journal, ledger: Ledger,
                                                                   failures: int) -> None:
    """The caller's retry of a failed call is its next attempt (attempt + 1), under the same key — live, and
    when the code is re-executed against the recording (replay), so both see the same calls."""
    from runjournal.consumers.ops.replay import replay_run

    left = {"failures": failures}

    class Unavailable(RuntimeError):
        retryable = True

    def flaky() -> None:
        if left["failures"]:
            left["failures"] -= 1
            raise Unavailable("provider busy")

    tool = LedgerTool(ledger, result={"ok": 1}, before=flaky)

    def agent(run: Any) -> Any:
        with run.node("book"):
            for _ in range(3):
                try:
                    return run.call(tool, {"logical": "book"})
                except Exception:  # noqa: BLE001,S112 - the natural retry
                    continue
        return None

    run = journal.start_run("t", "booker", {})
    live = agent(run)
    run.succeed()
    assert len(set(tool.seen)) == 1, "three attempts at most, one key"
    (record,) = folded(topics, run.run_id).records.values()
    assert record.attempts == min(failures + 1, 3)
    replayed = replay_run(topics, run.run_id, agent)
    assert replayed.value == live and {c.idempotency_key for c in replayed.calls} == set(tool.seen)
    assert ledger.executions() == (1 if failures < 3 else 0)


def test_asking_again_for_a_decided_approval_is_answered_by_the_journal_not_the_inbox(topics: Settings,
                                                                                      journal: Journal) -> None:
    """Case 5's kind inside one run: a second request for a decided call_id was published and answered at once
    by the decision left in the inbox, with no human involved. The handle now knows the journal's decision."""
    inbox = ApprovalInbox(redis.Redis.from_url(topics.redis_url), topics.topic_prefix)
    run = journal.start_run("t", "a", {})
    inbox.decide(run.run_id, "refund", granted=False, approver="carol", reason="no")
    assert await_approval(run, inbox, "refund", "refund 50 EUR?", timeout_s=10) is False
    assert await_approval(run, inbox, "refund", "refund 50 EUR, please?", timeout_s=10) is False
    run.succeed()
    types = [e.type for e in events_of(read_committed(topics), run.run_id)]
    assert types.count(EventType.APPROVAL_REQUESTED) == 1 and types.count(EventType.APPROVAL_DENIED) == 1

"""Group commit of a side effect's outcome (``Journal(outcome_commit="group")``, the default) on the real broker.

What must hold (issue 20; docs/guide/side-effect-boundary.md):

* a reconcilable tool's TOOL_CALL_COMMITTED is *not* acknowledged when ``call`` returns: it rides the next commit
  — the next durable publish of any run on the instance, or the keeper after ``outcome_linger_ms``;
* every other outcome is committed before ``call`` returns: a tool without ``reconcile()``, a FAILED outcome, and
  everything in ``strict`` mode;
* a fence that falls while a deferred outcome is in the open transaction stops the instance as a fence (never a
  rebuild that would re-initialise the fenced transactional id);
* the mode comes from ``RUNJOURNAL_OUTCOME_COMMIT`` when the code does not say.

The crash windows themselves (SIGKILL before and after the commit that carries the outcome) are in
``tests/consumers/recovery/test_recovery.py`` and ``tests/faults/test_never_twice_stateful.py``, in both modes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from confluent_kafka import TopicPartition

from runjournal.core import kafka
from runjournal.core.settings import ConfigError, Settings
from runjournal.producers import Journal, ProducerFencedError, fence_producer
from runjournal.schemas import EventType, codec_from_settings
from tests.support.ledger import Ledger, LedgerTool

pytestmark = pytest.mark.integration

NEVER_MS = 60_000  # neither the keeper's age nor its linger commit during a test


Reconcilable = LedgerTool  # its provider (the Redis ledger) can say what happened to a key


class Unreconcilable:
    """The ledger tool without ``reconcile()``: nobody can tell afterwards whether it ran."""

    def __init__(self, inner: LedgerTool) -> None:
        self.inner, self.name, self.side_effect, self.timeout_ms = inner, inner.name, True, inner.timeout_ms

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        return self.inner(args, idempotency_key)


class Failing(LedgerTool):
    """A reconcilable tool whose provider answers with a definite, non-retryable failure."""

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        super().__call__(args, idempotency_key)
        raise ValueError("card declined")


@pytest.fixture
def ledger(topics: Settings) -> Ledger:
    return Ledger(redis.Redis.from_url(topics.redis_url), topics.topic_prefix)


def committed_types(settings: Settings, run_id: str, *, listen_s: float = 2.0) -> list[EventType]:
    """The run's event types a ``read_committed`` consumer receives within ``listen_s`` seconds (records of an
    open transaction are never delivered to it)."""
    codec = codec_from_settings(settings)
    consumer = kafka.consumer(settings, **{"group.id": f"gc-{uuid.uuid4()}", "enable.auto.commit": False,
                                           "isolation.level": "read_committed"})
    try:
        parts = consumer.list_topics(settings.events_topic, timeout=10).topics[settings.events_topic].partitions
        consumer.assign([TopicPartition(settings.events_topic, p, 0) for p in parts])
        out: list[EventType] = []
        deadline = time.monotonic() + listen_s
        while time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.2):
                if msg.error() is None:
                    event = codec.decode(msg.value(), topic=msg.topic(), partition=msg.partition(),
                                         offset=msg.offset())
                    if event.run_id == run_id:
                        out.append(event.type)
        return out
    finally:
        consumer.close()


def _journal(settings: Settings, **options: Any) -> Journal:
    return Journal(settings, producer_id=f"gc-{uuid.uuid4().hex[:8]}", **options)


@pytest.fixture
def lingering(topics: Settings) -> Iterator[Journal]:
    """A group-commit journal whose keeper never commits during the test: only durable publishes do."""
    with _journal(topics, max_txn_age_ms=NEVER_MS, outcome_linger_ms=NEVER_MS) as journal:
        yield journal


def test_the_default_mode_is_group_commit(topics: Settings) -> None:
    with _journal(topics) as journal:
        assert journal.outcome_commit == "group"


def test_a_reconcilable_outcome_rides_the_next_durable_commit(lingering: Journal, topics: Settings,
                                                             ledger: Ledger) -> None:
    run = lingering.start_run("t", "a", {})
    tool = Reconcilable(ledger, result={"booking": "B1"})
    assert run.call(tool, {"x": 1}) == {"booking": "B1"}
    assert EventType.TOOL_CALL_COMMITTED not in committed_types(topics, run.run_id), \
        "not acknowledged yet: it waits in the open transaction"
    assert committed_types(topics, run.run_id, listen_s=1.0).count(EventType.TOOL_CALL_INTENDED) == 1
    run.request_approval("next", "a durable event of the run commits it")  # the next durable publish
    assert committed_types(topics, run.run_id).count(EventType.TOOL_CALL_COMMITTED) == 1


def test_another_runs_durable_publish_commits_it_too(lingering: Journal, topics: Settings, ledger: Ledger) -> None:
    """One producer, one open transaction: any durable publish of the instance acknowledges every earlier event."""
    first, other = lingering.start_run("t", "a", {}), lingering.start_run("t", "b", {})
    first.call(Reconcilable(ledger, result={"ok": 1}), {"x": 1})
    other.request_approval("c", "another run's durable event")
    assert EventType.TOOL_CALL_COMMITTED in committed_types(topics, first.run_id)


def test_the_keeper_commits_a_lingering_outcome(topics: Settings, ledger: Ledger) -> None:
    with _journal(topics, max_txn_age_ms=NEVER_MS, outcome_linger_ms=150) as journal:
        run = journal.start_run("t", "a", {})
        commits = journal.stats["commits"]
        run.call(Reconcilable(ledger, result={"ok": 1}), {"x": 1})
        deadline = time.monotonic() + 10
        while journal.stats["commits"] < commits + 2 and time.monotonic() < deadline:  # the intent's, the keeper's
            time.sleep(0.02)
        assert journal.stats["commits"] == commits + 2, "the keeper committed the outcome within its linger"
        assert EventType.TOOL_CALL_COMMITTED in committed_types(topics, run.run_id)


class MayNotTell(LedgerTool):
    """A reconcilable tool whose provider may answer "cannot tell": it opts out of group commit."""

    outcome_commit = "strict"


@pytest.mark.parametrize("case", ["no reconcile", "strict", "tool opts out"])
def test_other_outcomes_are_committed_before_call_returns(topics: Settings, ledger: Ledger, case: str) -> None:
    """A tool without reconcile() in group mode (a crash would leave an unknown only a human can settle), a tool that
    opts out (``outcome_commit = "strict"``: its reconcile may answer None), and any tool in strict mode:
    acknowledged when ``call`` returns, with nothing else committing it."""
    mode = "strict" if case == "strict" else "group"
    tool: Any = Reconcilable(ledger, result={"ok": 1})
    if case == "no reconcile":
        tool = Unreconcilable(tool)
    elif case == "tool opts out":
        tool = MayNotTell(ledger, result={"ok": 1})
    with _journal(topics, max_txn_age_ms=NEVER_MS, outcome_linger_ms=NEVER_MS, outcome_commit=mode) as journal:
        run = journal.start_run("t", "a", {})
        run.call(tool, {"x": 1})
        assert EventType.TOOL_CALL_COMMITTED in committed_types(topics, run.run_id)


def test_a_failed_outcome_is_never_deferred(lingering: Journal, topics: Settings, ledger: Ledger) -> None:
    """A deferred definite failure, lost in a crash, would be reconciled as "executed with error" and run again;
    strict would report it as a non-retryable failure. So FAILED is committed before ``call`` raises."""
    run = lingering.start_run("t", "a", {})
    with pytest.raises(ValueError, match="card declined"):
        run.call(Failing(ledger, result=None), {"x": 1})
    assert EventType.TOOL_CALL_FAILED in committed_types(topics, run.run_id)


def test_a_fence_with_a_deferred_outcome_in_flight_stops_the_instance_as_fenced(lingering: Journal,
                                                                                topics: Settings,
                                                                                ledger: Ledger) -> None:
    """The broker fences the instance while its open transaction holds a deferred outcome. librdkafka learns it
    on its next request and puts the producer in its fatal state, after which every ``produce`` raises a bare
    ``_FATAL``: the journal must read that as the fence it is — ProducerFencedError, no rebuild (a rebuild would
    re-initialise the fenced transactional id and un-fence the zombie) — not as a refused record."""
    run = lingering.start_run("t", "a", {})
    run.call(Reconcilable(ledger, result={"ok": 1}), {"x": 1})
    fence_producer(topics, lingering.producer_id)
    raised: BaseException | None = None
    deadline = time.monotonic() + 20
    while raised is None and time.monotonic() < deadline:
        try:
            run.message("assistant", "still here?")  # produces until librdkafka has seen the fence
        except Exception as exc:  # noqa: BLE001 - examined below
            raised = exc
        time.sleep(0.1)
    assert isinstance(raised, ProducerFencedError), repr(raised)
    assert lingering.stats["rebuilds"] == 0, "a fenced transactional id is never initialised again"
    with pytest.raises(ProducerFencedError):
        run.succeed()


def test_the_mode_comes_from_the_environment(topics: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {k: v for k, v in topics.as_env().items() if k != "RUNJOURNAL_OUTCOME_COMMIT"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("RUNJOURNAL_OUTCOME_COMMIT", "strict")
    with _journal(Settings.load()) as journal:
        assert journal.outcome_commit == "strict"
    monkeypatch.setenv("RUNJOURNAL_OUTCOME_COMMIT", "sometimes")
    with pytest.raises(ConfigError, match="RUNJOURNAL_OUTCOME_COMMIT"):
        Settings.load()


@pytest.mark.parametrize("bad", [{"outcome_commit": "sometimes"}, {"outcome_commit": ""},
                                 {"outcome_linger_ms": 0}, {"producer_config": {"linger.ms": "never"}}])
def test_a_journal_that_fails_to_start_leaves_no_live_looking_instance(topics: Settings,
                                                                       bad: dict[str, Any]) -> None:
    """Refused arguments (checked before the lease) or a failure after the lease was taken: no lease is left
    behind — recovery would otherwise hand dead instances' runs to an instance that does not exist."""
    from runjournal.core.redis_keys import RedisKeys

    name = f"gc-bad-{uuid.uuid4().hex[:6]}"
    with pytest.raises(Exception):  # noqa: B017,PT011 - ValueError for the arguments, a Kafka error for the config
        Journal(topics, producer_id=name, **bad)
    r = redis.Redis.from_url(topics.redis_url)
    assert not r.exists(RedisKeys(topics.topic_prefix).lease(name)), "a failed Journal left its lease behind"


def test_concurrent_durable_publishes_share_commits(topics: Settings) -> None:
    """Sixteen threads publishing a durable event at once on one journal: a committer first lets the publishers
    already waiting for the lock produce into its transaction (``TxnPublisher.commit_through``), so a few commits
    acknowledge them all — not one commit each, as when the thread that just produced took the lock straight back."""
    import threading

    with _journal(topics, max_txn_age_ms=NEVER_MS) as journal:
        runs = [journal.start_run("t", "a", {}) for _ in range(16)]
        journal.flush()
        rounds, commits_per_round = 5, []
        for _ in range(rounds):
            start = threading.Barrier(len(runs))
            before = journal.stats["commits"]

            def approve(run: Any, barrier: threading.Barrier = start) -> None:
                barrier.wait()
                run.request_approval(f"c-{uuid.uuid4().hex[:6]}", "durable")

            threads = [threading.Thread(target=approve, args=(run,)) for run in runs]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            commits_per_round.append(journal.stats["commits"] - before)
        assert sorted(commits_per_round)[rounds // 2] <= 6, f"{commits_per_round} commits for 16 durable publishes"
        for run in runs:
            assert committed_types(topics, run.run_id, listen_s=0.5).count(EventType.APPROVAL_REQUESTED) == rounds

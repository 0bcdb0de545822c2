"""Continuing an archived run (issue 30, decision 0058), on the real broker and Redis and a local archive folder:
``continue_run`` restores an archived FAILED run from the archive and resumes it — its committed calls return their
recorded results (a large one read from the archive once its records on the payloads topic are gone) and never run
again; archived again, the run keeps every result. An archived SUCCEEDED run is refused and nothing is published;
an unknown run is still ``no_facts``; two operators at once end with one continuation and no duplicate fact."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import TopicPartition

from runjournal.consumers.archive import archive_run, read_archived, replay_archived
from runjournal.consumers.recovery import RunNotContinuableError, continue_run
from runjournal.consumers.recovery.unarchive import restore_archived
from runjournal.consumers.runtime.partitions import run_partition
from runjournal.core import kafka, redis_client
from runjournal.core.settings import Settings
from runjournal.deploy.topics import create_topics
from runjournal.model.reducer import RunStatus
from runjournal.producers import Journal, RunHandle
from runjournal.producers.results import ResultStore
from runjournal.schemas import EventType, codec_from_settings
from tests.consumers.ops.test_erase import topic_records
from tests.support.ledger import Ledger, LedgerTool
from tests.support.provider import project
from tests.support.readback import events_of, read_committed

pytestmark = [pytest.mark.integration]  # each test < 15 s on the local stack: in make test

BLOB = "x" * 20_000  # > 8 KiB inline limit; with 8 KiB chunks: three records on the payloads topic


@pytest.fixture
def archived(topics: Settings, tmp_path: Path) -> Settings:
    return topics.model_copy(update={"archive_url": (tmp_path / "archive").as_uri(), "payload_chunk_bytes": 8192})


@pytest.fixture
def ledger(archived: Settings) -> Ledger:
    return Ledger(redis.Redis.from_url(archived.redis_url), archived.topic_prefix)


class Agent:
    """A fetch with a large result, then a booking with a small one; both side-effecting, counted in the ledger."""

    def __init__(self, ledger: Ledger) -> None:
        self.fetch = LedgerTool(ledger, name="fetch", result={"blob": BLOB})
        self.book = LedgerTool(ledger, name="book", result={"booking": "B1"})

    def __call__(self, run: RunHandle) -> dict[str, Any]:
        with run.node("fetch"):
            page = run.call(self.fetch, {"logical": "fetch"})
        with run.node("book"):
            booking = run.call(self.book, {"logical": "book"})
        return {"blob": page["blob"], **booking}


def _finished_run(settings: Settings, agent: Agent, *, fail: bool) -> str:
    with Journal(settings, producer_id=f"first-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("t", "travel", {}, run_id=f"r-{uuid.uuid4().hex[:8]}")
        agent(run)
        if fail:
            run.fail("payment provider down")
        else:
            run.succeed()
    return run.run_id


def _result_ref(settings: Settings, run_id: str) -> str:
    refs = [e.payload["result_ref"] for e in events_of(read_committed(settings), run_id)
            if e.type is EventType.TOOL_CALL_COMMITTED and e.payload.get("result_ref")]
    assert len(refs) == 1 and refs[0].startswith("kafka:"), refs
    return str(refs[0])


def _payloads_compacted_away(settings: Settings) -> None:
    """The payloads topic as compaction leaves an archived run's records: none left. (Compaction runs on the
    broker's schedule; the topic is deleted and created again, empty, instead.)"""
    admin = kafka.admin_client(settings)
    admin.delete_topics([settings.payloads_topic])[settings.payloads_topic].result(30)
    deadline = time.monotonic() + 60
    while True:
        try:
            create_topics(settings)
            if settings.payloads_topic in admin.list_topics(timeout=10).topics:
                return
        except Exception:  # noqa: BLE001 - "marked for deletion" until the broker finished deleting it
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)


def state_seq(settings: Settings, run_id: str) -> int:
    """The last seq of the run's live events (the restored ones and those after)."""
    codec = codec_from_settings(settings)
    latest = dict(topic_records(settings))
    return max(codec.decode(v).seq for k, v in latest.items() if v is not None and k.startswith(run_id))


def _high_watermarks(settings: Settings) -> dict[tuple[str, int], int]:
    consumer = kafka.consumer(settings, **{"group.id": f"wm-{uuid.uuid4()}", "enable.auto.commit": False})
    try:
        return {(t, p): consumer.get_watermark_offsets(TopicPartition(t, p), timeout=10, cached=False)[1]
                for t in (settings.events_topic, settings.checkpoints_topic) for p in range(settings.partitions)}
    finally:
        consumer.close()


def test_an_archived_failed_run_is_continued_from_the_archive_and_archived_again_whole(archived: Settings,
                                                                                       ledger: Ledger) -> None:
    agent = Agent(ledger)
    run_id = _finished_run(archived, agent, fail=True)
    ref = _result_ref(archived, run_id)
    first = archive_run(archived, run_id)
    assert ledger.executions() == 2
    _payloads_compacted_away(archived)  # the large result's records exist only in the archive now

    with Journal(archived, producer_id=f"op-{uuid.uuid4().hex[:6]}") as journal:
        continued = continue_run(journal, run_id, max_wait_s=5)
        assert continued.epoch == 2
        with continued:
            assert agent(continued) == {"blob": BLOB, "booking": "B1"}
            continued.succeed()
    assert ledger.executions() == 2, "no committed call ran again"
    assert len(agent.fetch.seen) == 1 and len(agent.book.seen) == 1
    projected = project(archived).get(run_partition(archived, run_id), run_id)  # original, tombstones, restore…
    assert projected is not None and projected.status is RunStatus.SUCCEEDED and projected.epoch == 2
    assert projected.last_seq == state_seq(archived, run_id)

    again = archive_run(archived, run_id)
    assert again.object_url != first.object_url
    replayed = replay_archived(archived, run_id)
    assert replayed is not None
    state = replayed[0].state
    assert state.status is RunStatus.SUCCEEDED and state.epoch == 2
    rows = read_archived(archived, run_id)
    assert rows is not None
    payloads = [r for r in rows.rows if r["source"] == "payloads"]
    assert len(payloads) == 3, "the restored run's large result is carried into its new object"
    # The new object answers the reference (Redis's cache was emptied by the archive, the topic holds nothing).
    store = ResultStore(redis_client.client(archived), archived.topic_prefix, archived)
    assert store.get(ref, run_id=run_id) == f'{{"blob":"{BLOB}"}}'
    assert not Path(first.object_url.removeprefix("file://")).exists(), "the older object is deleted"


def test_an_archived_succeeded_run_is_refused_and_nothing_is_published(archived: Settings, ledger: Ledger) -> None:
    run_id = _finished_run(archived, Agent(ledger), fail=False)
    archive_run(archived, run_id)
    before = _high_watermarks(archived)
    with Journal(archived, producer_id=f"op-{uuid.uuid4().hex[:6]}") as journal:
        with pytest.raises(RunNotContinuableError, match="finished") as refused:
            continue_run(journal, run_id, max_wait_s=5)
        assert refused.value.action == "finished" and "SUCCEEDED" in str(refused.value.detail)
        with pytest.raises(RunNotContinuableError) as unknown:
            continue_run(journal, f"r-{uuid.uuid4().hex[:8]}", max_wait_s=5)
        assert unknown.value.action == "no_facts"
    assert _high_watermarks(archived) == before, "nothing was published"


def test_two_operators_continuing_one_archived_run_end_with_one_continuation(archived: Settings,
                                                                            ledger: Ledger) -> None:
    run_id = _finished_run(archived, Agent(ledger), fail=True)
    archive_run(archived, run_id)
    kept = read_archived(archived, run_id)
    assert kept is not None
    archived_keys = {r["key"] for r in kept.rows if r["source"] == "events"}
    with Journal(archived, producer_id="op-a") as ja, Journal(archived, producer_id="op-b") as jb:
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(continue_run, j, run_id, max_wait_s=5) for j in (ja, jb)]
            outcomes: list[Any] = []
            for f in futures:
                try:
                    outcomes.append(f.result(120))
                except RunNotContinuableError as exc:
                    outcomes.append(exc)
        handles = [o for o in outcomes if isinstance(o, RunHandle)]
        refusals = [o for o in outcomes if isinstance(o, RunNotContinuableError)]
        assert len(handles) == 1 and len(refusals) == 1, outcomes
        assert handles[0].epoch == 2
    records = [(key, value) for key, value in topic_records(archived) if value is not None and key.startswith(run_id)]
    codec = codec_from_settings(archived)
    resumed = [key for key, value in records if codec.decode(value).type is EventType.RUN_RESUMED]
    assert len(resumed) == 1, resumed
    # Every archived event is in the log twice (the original, tombstoned, and its one restore), never three times.
    values = Counter(key for key, _value in records)
    assert {k for k, n in values.items() if n == 2} == archived_keys, values
    assert max(values.values()) == 2, values


def test_a_restore_done_twice_publishes_once_and_the_run_is_continued_after(archived: Settings,
                                                                          ledger: Ledger) -> None:
    """A continue_run interrupted after its restore (or a second operator after the first one's restore): the next
    restore finds the run's records live and publishes nothing; continue_run then continues the restored run."""
    agent = Agent(ledger)
    run_id = _finished_run(archived, agent, fail=True)
    archive_run(archived, run_id)
    first = restore_archived(archived, run_id)
    assert first is not None and first.events > 0 and first.status == "FAILED"
    after_first = _high_watermarks(archived)
    second = restore_archived(archived, run_id)
    assert second is not None and second.already and second.events == 0
    assert _high_watermarks(archived) == after_first, "the second restore published nothing"
    with Journal(archived, producer_id=f"op-{uuid.uuid4().hex[:6]}") as journal:
        continued = continue_run(journal, run_id, max_wait_s=5)
        with continued:
            assert agent(continued) == {"blob": BLOB, "booking": "B1"}
            continued.succeed()
    assert ledger.executions() == 2


def test_a_restorer_fenced_by_a_second_one_reports_superseded_and_the_run_is_restored_once(
        archived: Settings, ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """Restorer A reads (nothing live) and, before A commits, restorer B of the same run initialises the run's
    transactional id (fencing A), reads and commits: A reports ``superseded``, never raises, publishes nothing."""
    from runjournal.consumers.recovery import unarchive

    run_id = _finished_run(archived, Agent(ledger), fail=True)
    archive_run(archived, run_id)
    live = unarchive._live
    inner: list[Any] = []

    def b_comes_in_between(*args: Any, **kwargs: Any) -> bool:
        found = live(*args, **kwargs)
        if not inner:
            inner.append(None)
            inner[0] = restore_archived(archived, run_id)  # B: fences A's transactional id, reads, commits
        return found

    monkeypatch.setattr(unarchive, "_live", b_comes_in_between)
    a = restore_archived(archived, run_id)
    assert a is not None and a.superseded and a.events == 0
    b = inner[0]
    assert b is not None and b.events > 0 and not b.superseded
    values = Counter(key for key, value in topic_records(archived) if value is not None and key.startswith(run_id))
    assert max(values.values()) == 2, "one restore only"

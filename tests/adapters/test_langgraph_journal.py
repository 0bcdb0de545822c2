"""What makes the LangGraph checkpointer the journal's (beyond the conformance suite): the journal's records are
the authority (Redis is rebuilt from them), a fenced instance writes no checkpoint, a thread belongs to the
instance that owns its run."""

from __future__ import annotations

import pytest
import redis

pytest.importorskip("langgraph")

from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402

from runjournal.adapters._checkpoints import KINDS  # noqa: E402
from runjournal.adapters.langgraph import JournalCheckpointSaver, JournalRuns, ThreadNotOwnedError  # noqa: E402
from runjournal.core.settings import Settings  # noqa: E402
from runjournal.producers import Journal, ProducerFencedError, fence_producer  # noqa: E402

pytestmark = [pytest.mark.integration]


def _put(saver: JournalCheckpointSaver, thread: str, parent: dict | None, step: int, text: str) -> dict:
    cp = empty_checkpoint()
    cp["channel_values"] = {"messages": [text], "step": step}
    cp["channel_versions"] = {"messages": step + 1, "step": step + 1}
    config = parent or {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    return saver.put(config, cp, {"source": "loop", "step": step, "parents": {}}, {"messages": step + 1,
                                                                                    "step": step + 1})


def test_the_projection_is_rebuilt_from_the_journal(topics: Settings) -> None:
    with Journal(topics, producer_id="lg-a") as journal:
        runs = JournalRuns(journal)
        saver = JournalCheckpointSaver(runs)
        first = _put(saver, "thread-1", None, 0, "hello")
        second = _put(saver, "thread-1", first, 1, "world")
        saver.put_writes(second, [("messages", "pending"), ("__error__", "boom")], "task-1", "path")
        before = saver.get_tuple({"configurable": {"thread_id": "thread-1", "checkpoint_ns": ""}})
        r = redis.Redis.from_url(topics.redis_url)
        r.delete(*(runs.store.key("thread-1", k) for k in KINDS))  # Redis lost the thread
        assert saver.get_tuple({"configurable": {"thread_id": "thread-1"}}) is None
        assert runs.store.rebuild("thread-1") == 8  # 2 checkpoints, 2 blobs each, 2 pending writes
        after = saver.get_tuple({"configurable": {"thread_id": "thread-1", "checkpoint_ns": ""}})
    assert after == before and after.checkpoint["channel_values"] == {"messages": ["world"], "step": 1}
    assert [(w[1], w[2]) for w in after.pending_writes] == [("__error__", "boom"), ("messages", "pending")]


def test_a_fenced_instance_writes_no_checkpoint(topics: Settings) -> None:
    with Journal(topics, producer_id="lg-zombie") as journal:
        saver = JournalCheckpointSaver(JournalRuns(journal))
        first = _put(saver, "thread-z", None, 0, "before")
        fence_producer(topics, journal.producer_id)  # the recovery job's fence
        with pytest.raises(ProducerFencedError):
            _put(saver, "thread-z", first, 1, "after the fence")
        latest = saver.get_tuple({"configurable": {"thread_id": "thread-z", "checkpoint_ns": ""}})
        assert latest.checkpoint["channel_values"]["messages"] == ["before"]
    with Journal(topics, producer_id="lg-fresh") as fresh:
        runs = JournalRuns(fresh)
        assert runs.store.rebuild("thread-z") == 3  # the fenced write never reached the topic
        with pytest.raises(ThreadNotOwnedError):  # the thread's run is the zombie's until recovery hands it over
            JournalCheckpointSaver(runs).put({"configurable": {"thread_id": "thread-z", "checkpoint_ns": ""}},
                                             empty_checkpoint(), {}, {})

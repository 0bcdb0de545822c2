"""LangGraph checkpoints with encryption on (decision 0059): every record's data on ``{prefix}.checkpoints`` and in its
Redis projection is a token under the thread's run's key — the conversation is nowhere in clear — and the saver
reads its checkpoints back, from Redis and after a rebuild from the topic."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import redis

pytest.importorskip("langgraph")

from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402

from runjournal.adapters._checkpoints import KINDS, PART  # noqa: E402
from runjournal.adapters.langgraph import JournalCheckpointSaver, JournalRuns  # noqa: E402
from runjournal.core.crypto import KeyScope, is_encrypted, parse_token  # noqa: E402
from runjournal.core.settings import Settings  # noqa: E402
from runjournal.producers import Journal  # noqa: E402
from tests.cli.test_erase_keys import raw_records  # noqa: E402

pytestmark = [pytest.mark.integration]


def _put(saver: JournalCheckpointSaver, thread: str, parent: dict | None, step: int, text: str) -> dict:
    cp = empty_checkpoint()
    cp["channel_values"] = {"messages": [text], "step": step}
    cp["channel_versions"] = {"messages": step + 1, "step": step + 1}
    config = parent or {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    return saver.put(config, cp, {"source": "loop", "step": step, "parents": {}}, {"messages": step + 1,
                                                                                    "step": step + 1})


@pytest.mark.parametrize("on", [True, False], ids=["encryption-on", "encryption-off"])
def test_checkpoints_are_sealed_in_the_topic_and_redis_and_read_back(topics: Settings, tmp_path: Path,
                                                                     on: bool) -> None:
    s = topics.model_copy(update={"encryption": "on" if on else "off", "keys_dir": tmp_path / "keys"})
    thread = f"thread-{uuid.uuid4().hex[:8]}"
    with Journal(s, producer_id="lg-enc") as journal:
        runs = JournalRuns(journal)
        saver = JournalCheckpointSaver(runs)
        first = _put(saver, thread, None, 0, "my card is 4111")
        second = _put(saver, thread, first, 1, "and my address")
        saver.put_writes(second, [("messages", "pending secret")], "task-1", "path")
        config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        before = saver.get_tuple(config)
        r = redis.Redis.from_url(s.redis_url)
        stored = [v.decode() for k in KINDS if k != PART for v in r.hvals(runs.store.key(thread, k))]
        r.delete(*(runs.store.key(thread, k) for k in KINDS))  # Redis lost the thread: rebuilt from the topic
        assert runs.store.rebuild(thread) == 7  # 2 checkpoints, 2 blobs each, 1 pending write
        after = saver.get_tuple(config)
    assert before is not None and after == before
    assert after.checkpoint["channel_values"] == {"messages": ["and my address"], "step": 1}
    records = [json.loads(v) for v in raw_records(s, s.checkpoints_topic)]
    datas = [rec["data"] for rec in records if "data" in rec]
    assert len(stored) == 7 and len(datas) == 7
    if on:
        kek = KeyScope(runs.tenant_id).kek_id
        assert all(is_encrypted(d) and parse_token(d).kek_id == kek for d in stored + datas)
    else:
        assert not any(is_encrypted(d) for d in stored + datas)

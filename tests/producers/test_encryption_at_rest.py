"""Issue 33's acceptance: with encryption on, a run's content is nowhere in clear at rest — not in the broker's log
segment files (read raw from its data directory, every topic of the test's prefix: events, payloads …) and not in
Redis's RDB dump (``BGSAVE``, the file read raw). With encryption off the same run's marker is found in both, so the
check can fail. Compression is off in both arms (lz4 would hide the plain text without encrypting it)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from runjournal.core.settings import Settings
from runjournal.producers import Journal
from tests.conftest import Endpoints
from tests.support.at_rest import rdb_dump, segment_bytes
from tests.support.provider import project

pytestmark = pytest.mark.integration


class Echo:
    name = "echo"
    side_effect = True
    timeout_ms = 2000

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        return {"echo": args["text"], "pad": "y" * args.get("pad", 0)}


@pytest.mark.parametrize("on", [True, False], ids=["encryption-on", "encryption-off"])
def test_no_plain_text_in_the_brokers_segments_or_the_redis_dump(topics: Settings, endpoints: Endpoints,
                                                                 tmp_path: Path, on: bool) -> None:
    if not any(endpoints.stack_dir.rglob("meta.properties")):
        pytest.skip("the broker's data directory is not on this host (given endpoints)")
    mark = f"MARKER-{uuid.uuid4().hex}".encode()
    text = mark.decode()
    s = topics.model_copy(update={"encryption": "on" if on else "off", "keys_dir": tmp_path / "keys"})
    with Journal(s, producer_id="at-rest", compression="none", inline_result_bytes=256) as journal:
        run = journal.start_run("acme", "agent", {"ask": text}, user_id="carol")
        run.call(Echo(), {"text": text})
        run.call(Echo(), {"text": text, "pad": 1000})  # by reference: {prefix}.payloads
        run.message("user", f"my card is {text}")
        with run.stream("answer") as stream:  # {prefix}.streams: chunks sealed too (the journal's compression)
            stream.write(f"token {text}")
            stream.write({"progress": text})
        run.succeed({"out": text})
    project(topics)  # the projection in Redis: the run's hash, its records
    segments = segment_bytes(endpoints.stack_dir, topics.topic_prefix)
    assert any(".events-" in name for name in segments) and any(".payloads-" in name for name in segments)
    assert any(".streams-" in name for name in segments)
    holding = sorted(name for name, data in segments.items() if mark in data)
    dump = rdb_dump(topics)
    assert run.run_id.encode() in dump  # the run is in the dump: the check below looks at it
    if on:
        assert holding == [] and mark not in dump
    else:
        assert any(".events-" in n for n in holding) and any(".payloads-" in n for n in holding)
        assert any(".streams-" in n for n in holding)
        assert mark in dump

"""``runjournal fork`` as a user runs it (a subprocess, the real stack; issue 31, decision 0049): the dry run names the
effects the fork may perform again, the fork is handed to a live instance, and only those effects run again."""

from __future__ import annotations

import json
import uuid

import pytest

from runjournal.core.settings import Settings
from runjournal.producers import Journal
from runjournal.schemas import EventType
from tests.cli.test_paths import json_error, rj
from tests.consumers.ops.test_control import LEASE_MS, Ledger
from tests.consumers.ops.test_fork import agent
from tests.support.readback import events_of, read_committed

pytestmark = pytest.mark.integration


def test_fork_from_the_command_line(topics: Settings, service_env: dict[str, str]) -> None:
    tool = Ledger()
    with Journal(topics, producer_id=f"a-{uuid.uuid4().hex[:8]}", lease_ttl_ms=LEASE_MS) as journal:
        source = journal.start_run("t", "payer", {"order": 1})
        agent(source, tool, 3)
        source.succeed()
        events = events_of(read_committed(topics), source.run_id)
        point = next(e for e in events if e.type is EventType.TOOL_CALL_COMMITTED)  # right after the first call
        proc, _ = rj(service_env, "fork", source.run_id, "--at", str(point.seq), "--dry-run", "--json")
        assert proc.returncode == 0, proc.stderr[-2000:]
        dry = json.loads(proc.stdout)
        assert dry["outcome"] == "would_fork" and len(dry["preview"]["may_repeat"]) == 2
        plain, _ = rj(service_env, "fork", source.run_id, "--at", point.event_id, "--dry-run")
        assert plain.returncode == 0 and plain.stderr.count("MAY BE PERFORMED AGAIN") == 2, plain.stderr
        fork_id = f"{source.run_id}-retry"
        proc, _ = rj(service_env, "fork", source.run_id, "--at", str(point.seq), "--run-id", fork_id, "--reason",
                     "retry with a fix", "--by", "ops@test", "--assign-to", journal.producer_id, "--json")
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(proc.stdout)["outcome"] == "forked"
        assert journal.claim_assignment(10) == fork_id
        fork = journal.resume(fork_id)
        agent(fork, tool, 3)
        fork.succeed()
        assert len(tool.ran) == 5 and all(n == 1 for n in tool.ran.values())
        again, _ = rj(service_env, "fork", source.run_id, "--run-id", fork_id, "--json")
        assert again.returncode == 1 and "exists" in json_error(again)["message"]
        started = next(e for e in events_of(read_committed(topics), fork_id) if e.type is EventType.RUN_STARTED)
        assert started.payload["forked_from"] == source.run_id and started.payload["requested_by"] == "ops@test"
        assert started.payload["request_reason"] == "retry with a fix"

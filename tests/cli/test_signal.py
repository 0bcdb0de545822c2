"""``runjournal signal`` as a user runs it (a subprocess, the real stack; issue 31, decision 0050): delivered once, a
second delivery refused, a payload that is not JSON a usage error, and the run's wait returns the payload."""

from __future__ import annotations

import json
import uuid

import pytest

from runjournal.core.settings import Settings
from runjournal.producers import Journal
from tests.cli.test_paths import json_error, rj

pytestmark = pytest.mark.integration


def test_signal_from_the_command_line(topics: Settings, service_env: dict[str, str]) -> None:
    with Journal(topics, producer_id=f"s-{uuid.uuid4().hex[:8]}", lease_ttl_ms=1200) as journal:
        run = journal.start_run("t", "waiter", {})
        proc, _ = rj(service_env, "signal", run.run_id, "approved", "--payload", '{"ok": true}', "--by", "alice",
                     "--json")
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(proc.stdout)["outcome"] == "delivered"
        again, _ = rj(service_env, "signal", run.run_id, "approved", "--payload", '{"ok": false}')
        assert again.returncode == 0 and "already_delivered" in again.stderr
        bad, _ = rj(service_env, "signal", run.run_id, "other", "--payload", "{nope", "--json")
        assert bad.returncode == 2
        assert run.wait_signal("approved") == {"ok": True}
        run.succeed()
        ended, _ = rj(service_env, "signal", run.run_id, "late", "--json")
        assert ended.returncode == 1 and "already ended" in json_error(ended)["message"]

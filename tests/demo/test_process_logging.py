"""librdkafka's lines go through Python logging in every process the product starts, and in a program that embeds
the journal (issue 35): the demo's agent never called ``setup_logging``, so a librdkafka warning (a fresh broker's
``GETPID``, a ``CONFWARN``) came out bare and non-JSON beside its JSON lines. A consumer property passed through to
every client (``RUNJOURNAL_LIBRDKAFKA_FETCH_WAIT_MAX_MS``) makes each producer log one ``CONFWARN`` at start."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from runjournal.core import redis_client
from runjournal.core.settings import Settings
from runjournal.demo.agent import DemoKeys

pytestmark = pytest.mark.integration

RAW_LIBRDKAFKA = re.compile(r"^%\d+\|")
#: A consumer property: a producer warns that it ignores it (librdkafka ``CONFWARN``, level 4).
CONFWARN = {"RUNJOURNAL_LIBRDKAFKA_FETCH_WAIT_MAX_MS": "100"}


def test_the_demo_agent_logs_json_lines_librdkafkas_included(topics: Settings, service_env: dict[str, str],
                                                             tmp_path: Path) -> None:
    workload = tmp_path / "workload.json"
    workload.write_text("[]")
    redis_client.client(topics).set(DemoKeys(topics.topic_prefix).done, "1")  # nothing to do: start, then stop
    proc = subprocess.run([sys.executable, "-m", "runjournal.demo.agent", "--producer-id", "quiet", "--workload",
                           str(workload), "--provider", "http://127.0.0.1:1", "--advice", "off"],
                          env={**service_env, **CONFWARN}, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert not [line for line in lines if RAW_LIBRDKAFKA.match(line)], proc.stderr
    assert all(line.startswith("{") for line in lines), proc.stderr  # every line a JSON record
    records = [json.loads(line) for line in lines]
    assert any(r["logger"] == "runjournal.kafka" and "CONFWARN" in r["msg"] for r in records), proc.stderr


EMBEDDED = """
import logging
logging.basicConfig(format="app|%(name)s|%(levelname)s|%(message)s")
from runjournal import Journal, Settings
with Journal(Settings.load(), producer_id="embedded") as journal:
    journal.start_run("t", "a", {}).succeed(None)
"""


def test_a_program_embedding_the_journal_gets_librdkafkas_lines_through_its_own_logging(
        topics: Settings, service_env: dict[str, str]) -> None:
    proc = subprocess.run([sys.executable, "-c", EMBEDDED], env={**service_env, **CONFWARN}, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines and all(line.startswith("app|") for line in lines), proc.stderr  # the app's format, no raw line
    assert any(line.startswith("app|runjournal.kafka|WARNING|CONFWARN") for line in lines), proc.stderr

"""Readers in many processes while the memory extractor writes (embedded Qdrant, the default setup).

Embedded Qdrant locks its directory to one process. The extractor owns it and serves reads over its API;
``memory search``, ``knowledge ingest|search`` and four agent-like processes building contexts all answer
from other processes while it runs — on the old code ``memory search`` failed with "in use by another process".
When the owner is gone (SIGTERM, or SIGKILL leaving a stale discovery file), readers open the directory.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runjournal.consumers.cognition import read_discovery
from runjournal.core.settings import Settings
from tests.consumers.knowledge.test_knowledge import POLICY
from tests.consumers.memory.test_extractor import conversation
from tests.support.provider import project
from tests.support.workload import publish

pytestmark = [pytest.mark.integration, pytest.mark.slow]
BIN = str(Path(__file__).resolve().parents[3] / ".venv" / "bin" / "runjournal")


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BIN, *args], env=env, capture_output=True, text=True, timeout=180)


def memory_hits(env: dict[str, str], query: str, *, want: str, timeout_s: float = 90) -> list[dict]:
    """``memory search`` from another process until a hit's text contains ``want`` (the extractor may lag)."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = cli(env, "memory", "search", "--tenant", "acme", "--user", "u1", "--json", query)
        assert done.returncode == 0, done.stderr[-2000:]
        hits = json.loads(done.stdout)
        if any(want in h["text"] for h in hits) or time.monotonic() > deadline:
            return hits
        time.sleep(0.5)


def test_memory_and_knowledge_answer_other_processes_while_the_extractor_writes(
        topics: Settings, service_env: dict[str, str]) -> None:
    publish(topics, conversation("conv-1", ["I prefer window seats"], outcome=None))
    project(topics)  # the contexts' facts
    extractor = subprocess.Popen([BIN, "memory-extractor"], env=service_env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while read_discovery(topics.effective_qdrant_path) is None:
            assert extractor.poll() is None, extractor.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the extractor never served its reads"
            time.sleep(0.1)
        ingest = cli(service_env, "knowledge", "ingest", str(POLICY), "--json")
        assert ingest.returncode == 0, ingest.stderr[-2000:]
        assert json.loads(ingest.stdout)["documents"][0]["added"] == 6  # written through the owner

        assert memory_hits(service_env, "window seat", want="window")[0]["text"] == "I prefer window seats"
        found = cli(service_env, "knowledge", "search", "how much does travel insurance cost", "--json")
        assert found.returncode == 0 and json.loads(found.stdout)["evidence"][0]["section"] == "Book flight"

        agents = [subprocess.Popen([sys.executable, "-m", "tests.support.context_child", "conv-1", "5",
                                    "seat preference and travel insurance"], env=service_env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
        publish(topics, conversation("conv-2", ["I never want red-eye flights"], outcome=None, at_s=5))
        results = []
        for agent in agents:
            out, err = agent.communicate(timeout=180)
            assert agent.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
        assert results == [{"built": 5, "with_memory": 5, "with_knowledge": 5, "notes": [], "facts_known": 5}] * 4
        # the extractor kept writing while everyone read
        assert any("red-eye" in h["text"] for h in memory_hits(service_env, "red-eye flights", want="red-eye"))
    finally:
        extractor.send_signal(signal.SIGTERM)
        extractor.wait(60)
    assert extractor.returncode == 0 and read_discovery(topics.effective_qdrant_path) is None
    assert memory_hits(service_env, "window seat", want="window")  # nobody owns it now: read directly


def test_a_killed_owner_leaves_readers_a_stale_file_they_survive(topics: Settings, service_env: dict[str, str]) -> None:
    owner = subprocess.Popen([BIN, "memory", "serve"], env=service_env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while read_discovery(topics.effective_qdrant_path) is None:
        assert owner.poll() is None and time.monotonic() < deadline, owner.stderr.read()[-3000:]
        time.sleep(0.1)
    assert cli(service_env, "knowledge", "ingest", str(POLICY)).returncode == 0
    owner.send_signal(signal.SIGKILL)
    owner.wait(30)
    assert read_discovery(topics.effective_qdrant_path) is not None  # stale: its API is gone
    found = cli(service_env, "knowledge", "search", "basic economy flights cannot be modified", "--json")
    assert found.returncode == 0, found.stderr[-2000:]
    assert json.loads(found.stdout)["evidence"][0]["section"] == "Modify flight"

"""``runjournal inspect RUN_ID`` shows what a run did (issue 35): a LangGraph run's graph nodes with status and
attempt beside its input and output, as a user runs the command (a subprocess on the real stack)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid

import pytest

pytest.importorskip("langgraph")

from runjournal.core.settings import Settings  # noqa: E402
from tests.support.graph_run import NODES, run_graph  # noqa: E402
from tests.support.provider import project  # noqa: E402

pytestmark = pytest.mark.integration


def test_inspect_lists_a_langgraph_runs_nodes(topics: Settings, service_env: dict[str, str]) -> None:
    run_id = f"lg-inspect-{uuid.uuid4().hex[:8]}"
    answer = run_graph(topics, run_id)
    project(topics)

    def inspect(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "runjournal", "inspect", run_id, *args], capture_output=True,
                              text=True, timeout=120, env={**service_env, "COLUMNS": "160"}, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    text = inspect("--no-timeline")
    table = text[text.index("graph nodes"):text.index("execution records")]
    rows = {m[0]: (m[1], int(m[2])) for m in re.findall(r"│\s*(\S+)\s*│\s*(\w+)\s*│\s*(\d+)\s*│", table)}
    assert rows == NODES
    assert f'output: {{"answer":"{answer}"}}' in text
    nodes = json.loads(inspect("--json", "--no-timeline"))["state"]["nodes"]
    assert {path: (n["status"], n["attempt"]) for path, n in nodes.items()} == NODES

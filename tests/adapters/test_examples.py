"""Every example in ``examples/`` runs to exit 0 against the real stack, offline, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runjournal.core.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _nodes(topics: Settings, run_id: str) -> dict[str, tuple[str, int]]:
    """The graph nodes in the run's state (a fold of its events): path -> (status, attempt)."""
    from runjournal.model.reducer import fold
    from tests.support.readback import events_of, read_committed

    state = fold((e, 0, i) for i, e in enumerate(events_of(read_committed(topics), run_id)))
    assert state is not None
    return {path: (node.status.value, node.attempt) for path, node in state.nodes.items()}


@pytest.mark.parametrize("argv", [
    ["async_calls.py", "--runs", "10", "--calls", "3"],
    ["langgraph_agent.py"],
    ["langgraph_agent.py", "--async"],
    ["openai_agents_approval.py", "--auto-approve"],
], ids=lambda argv: " ".join(argv))
def test_example_runs_to_exit_0(argv: list[str], topics: Settings, service_env: dict[str, str]) -> None:
    env = {**service_env, "OPENAI_API_KEY": ""}  # offline: nothing may need a key
    done = subprocess.run([sys.executable, str(EXAMPLES / argv[0]), *argv[1:]], env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    if argv[0] == "langgraph_agent.py":
        assert summary["emails_sent"] == 1 and summary["messages"] == 4 and summary["checkpoints"] >= 4
        assert _nodes(topics, summary["run_id"]) == {"agent": ("SUCCEEDED", 2), "tools": ("SUCCEEDED", 1)}
    if argv[0] == "openai_agents_approval.py":
        assert summary["final"] == "Bob has his email." and summary["session_items"] >= 3

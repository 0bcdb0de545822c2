"""``knowledge stats`` and ``memory stats`` for people: one ``name: value`` line each, no Python repr (issue 35: the
documents and corpora were printed as ``{'/path': 2}`` dicts). Run as a user runs them, on an embedded Qdrant folder
of their own (no broker, no Redis)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def rj(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "runjournal", *args], env=env, capture_output=True, text=True,
                          timeout=180, check=False, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, (args, proc.stderr[-3000:])
    return proc


def test_stats_for_people_are_lines_not_reprs(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNJOURNAL_")}
    env.update(RUNJOURNAL_STACK_DIR=str(tmp_path / "stack"), RUNJOURNAL_QDRANT_PATH=str(tmp_path / "qdrant"))
    doc = tmp_path / "policy.md"
    doc.write_text("# Baggage\n\nEach passenger may check two bags.\n\n# Seats\n\nWindow seats cost extra.\n")
    rj(env, "knowledge", "ingest", str(doc), "--corpus", "cli", "--json")
    assert json.loads(rj(env, "knowledge", "stats", "--json").stdout)["corpora"] == {"cli": 2}
    text = rj(env, "knowledge", "stats").stdout
    assert not any(c in text for c in "{}[]'"), text
    lines = text.splitlines()
    assert "corpora:" in lines and "  cli: 2 active passages" in lines, text
    assert "documents:" in lines and f"  {doc.resolve()}: 2 active sections" in lines, text
    memory = rj(env, "memory", "stats").stdout
    assert not any(c in memory for c in "{}[]'") and "active: 0" in memory.splitlines(), memory


def test_human_lines_nests_mappings_and_joins_lists() -> None:
    from runjournal.cli._advisory import human_lines

    out = human_lines({"mode": "local", "documents": {"/a.md": 2}, "corpora": {}, "tags": ["x", "y"], "url": None},
                      units={"documents": "sections"})
    assert out.splitlines() == ["mode: local", "documents:", "  /a.md: 2 sections", "corpora: none", "tags: x, y",
                                "url: -"]

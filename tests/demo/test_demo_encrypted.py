"""Issue 33's acceptance: the main job runs with encryption on — its agents seal every content field, SIGKILLed
agents are recovered and resumed (their journals open the recorded content with the keys), the projector, recovery
job and memory extractor hold no key — and every check of the demo is ``ok``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.slow]


def test_the_demo_under_kills_is_ok_with_encryption_on(service_env: dict[str, str], tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    env = {**service_env, "RUNJOURNAL_ENCRYPTION": "on", "RUNJOURNAL_KEYS_DIR": str(keys)}
    proc = subprocess.run(
        [sys.executable, "-m", "runjournal", "demo", "--runs", "6", "--agents", "2", "--kills", "2", "--seed", "3",
         "--json"], env=env, capture_output=True, text=True, timeout=900, check=False)
    summary = json.loads(proc.stdout) if proc.stdout.strip() else {}
    failed = [c for c in summary.get("checks", []) if not c.get("held")]
    assert proc.returncode == 0 and summary.get("ok") is True, (failed, proc.stderr[-3000:])
    assert any(keys.glob("kek/*.json")), "the agents made no key: nothing was encrypted"

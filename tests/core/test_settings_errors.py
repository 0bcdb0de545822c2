"""A setting that holds JSON (a dict or a list: spend prices, budgets, …) given malformed is a ``ConfigError``
naming the variable and the fix — exit 2, one line (one JSON document under ``--json``), never pydantic-settings'
traceback. Run as a user runs it: ``runjournal settings`` in a subprocess, for every such field of ``Settings``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing

import pytest

from runjournal.core.settings import Settings

INTERNAL = {"kafka_properties"}  # set through RUNJOURNAL_KAFKA_* properties, not one variable


def _json_fields() -> list[str]:
    hints = typing.get_type_hints(Settings)
    out = [name for name in Settings.model_fields
           if name not in INTERNAL and typing.get_origin(hints[name]) in (dict, list)]
    assert out, "no JSON-valued setting found: the test would check nothing"
    return out


@pytest.mark.parametrize("field", _json_fields())
@pytest.mark.parametrize("as_json", [False, True])
def test_a_malformed_json_setting_is_named_with_the_fix(field: str, as_json: bool) -> None:
    var = f"RUNJOURNAL_{field.upper()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNJOURNAL_")}
    env[var] = "{not json"
    command = ["inspect", "some-run", "--json"] if as_json else ["settings"]  # both load settings first
    args = [sys.executable, "-m", "runjournal", *command]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stdout.strip() == ""
    last = proc.stderr.strip().splitlines()[-1]
    message = json.loads(last)["message"] if as_json else last
    assert f"{var}: not valid JSON" in message and "give a JSON object" in message, message
    assert "not json" not in message  # the value is not echoed (it may hold a secret)

"""``--version``, ``--log-level`` / ``RUNJOURNAL_LOG_LEVEL``, and librdkafka's lines through Python logging —
each run the way a user runs it (a subprocess)."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from runjournal.core import logs
from runjournal.deploy.procs import free_port

RAW_LIBRDKAFKA = re.compile(r"^%\d+\|")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNJOURNAL_")}
    env.update(COLUMNS="250", **extra)
    return env


def _run(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runjournal", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_log_level_option_and_variable_are_accepted_and_checked(tmp_path: Path) -> None:
    env = _env(RUNJOURNAL_STACK_DIR=str(tmp_path))
    assert _run(["--log-level", "debug", "settings"], env).returncode == 0
    shown = _run(["settings"], {**env, "RUNJOURNAL_LOG_LEVEL": "ERROR"})
    assert shown.returncode == 0 and json.loads(shown.stdout)["log_level"] == "ERROR"
    bad = _run(["--log-level", "LOUD", "settings"], env)
    assert bad.returncode == 2 and "--log-level" in bad.stderr
    bad_env = _run(["settings"], {**env, "RUNJOURNAL_LOG_LEVEL": "LOUD"})
    assert bad_env.returncode == 2 and "RUNJOURNAL_LOG_LEVEL" in bad_env.stderr


CHILD = """
import logging, sys, time
from runjournal.core import kafka, logs
logs.set_level_override(sys.argv[2])
logs.setup_logging("WARNING")
p = kafka.producer(None, bootstrap=sys.argv[1], **{"socket.connection.setup.timeout.ms": 1000,
                                                    "reconnect.backoff.ms": 100})
deadline = time.monotonic() + 4
while time.monotonic() < deadline:
    p.poll(0.2)
"""


def test_librdkafka_lines_become_json_log_records_filtered_by_level() -> None:
    """A producer pointed at a closed port: librdkafka logs connection failures (level 3 = ERROR)."""
    bootstrap = f"127.0.0.1:{free_port()}"
    shown = subprocess.run([sys.executable, "-c", CHILD, bootstrap, "DEBUG"], env=_env(), capture_output=True,
                           text=True, timeout=60, check=False)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stderr.splitlines()
    assert not [ln for ln in lines if RAW_LIBRDKAFKA.match(ln)]
    records = [json.loads(ln) for ln in lines if ln.startswith("{")]
    kafka_records = [r for r in records if r["logger"] == "runjournal.kafka"]
    assert kafka_records, shown.stderr[-2000:]
    assert any("Connection refused" in r["msg"] or "Connect to" in r["msg"] for r in kafka_records)
    quiet = subprocess.run([sys.executable, "-c", CHILD, bootstrap, "CRITICAL"], env=_env(), capture_output=True,
                           text=True, timeout=60, check=False)
    assert quiet.returncode == 0 and quiet.stderr.strip() == ""


def test_a_broker_that_stays_away_is_one_line_not_one_per_reconnect() -> None:
    """Issue 35 case 5: librdkafka's repeats collapse (``runjournal.core.logs.RepeatFilter`` on ``runjournal.kafka``):
    4 s of reconnects every 100 ms to a closed port give one "Connect to … failed" line."""
    bootstrap = f"127.0.0.1:{free_port()}"
    shown = subprocess.run([sys.executable, "-c", CHILD, bootstrap, "WARNING"], env=_env(), capture_output=True,
                           text=True, timeout=60, check=False)
    assert shown.returncode == 0, shown.stderr
    records = [json.loads(ln) for ln in shown.stderr.splitlines() if ln.startswith("{")]
    refused = [r for r in records if r["logger"] == "runjournal.kafka" and "Connection refused" in r["msg"]]
    assert len(refused) == 1, [r["msg"] for r in refused]


def test_repeat_filter_counts_what_it_dropped_and_lets_a_kind_through_after_the_window() -> None:
    import time

    from runjournal.core.logs import RepeatFilter

    def record(msg: str, level: int = logging.ERROR) -> logging.LogRecord:
        return logging.LogRecord("runjournal.kafka", level, __file__, 1, msg, None, None)

    f = RepeatFilter(window_s=0.3)
    assert f.filter(record("FAIL b:1 Connect failed (after 0ms in state CONNECT)"))
    for n in range(5):  # the same line but for librdkafka's counters: dropped, counted
        assert not f.filter(record(f"FAIL b:1 Connect failed (after {n}ms in state CONNECT, {n} identical error(s) "
                                   "suppressed)"))
    assert f.filter(record("FAIL b:2 Connect failed (after 0ms in state CONNECT)"))  # another broker: its own kind
    assert f.filter(record("FAIL b:1 Connect failed (after 0ms in state APIVERSION_QUERY)"))  # another state too
    assert f.filter(record("FAIL [rdkafka#producer-1] gone"))
    assert not f.filter(record("FAIL [rdkafka#producer-2] gone"))  # a per-operation client: the same line
    assert f.filter(record("FAIL b:1 Connect failed (after 0ms in state CONNECT)", logging.WARNING))  # another level
    time.sleep(0.35)
    again = record("FAIL b:1 Connect failed (after 9ms in state CONNECT)")
    assert f.filter(again) and again.repeated == 5 and again.repeated_over_s >= 0.3  # type: ignore[attr-defined]
    small = RepeatFilter(window_s=60, max_kinds=2)  # the least recently seen kind is forgotten first
    assert small.filter(record("a")) and small.filter(record("b")) and not small.filter(record("a"))
    assert small.filter(record("c")) and not small.filter(record("a")) and small.filter(record("b"))  # b forgotten
    try:
        RepeatFilter(window_s=0)
    except ValueError as exc:
        assert "window_s" in str(exc)
    else:
        raise AssertionError("a window of 0 s was accepted")


def test_a_process_started_without_the_command_line_takes_its_level_from_settings() -> None:
    """``setup_logging(level=Settings.log_level)`` (the demo's processes): RUNJOURNAL_LOG_LEVEL over the default,
    ``--log-level`` over both."""
    log = logging.getLogger("runjournal")
    saved = (log.handlers[:], log.level, log.propagate)
    try:
        assert logs.setup_logging("WARNING", level="debug") == "DEBUG"
        assert logs.setup_logging("WARNING") == "WARNING"
        logs.set_level_override("ERROR")
        assert logs.setup_logging("WARNING", level="DEBUG") == "ERROR"
        with pytest.raises(ValueError, match="LOUD"):
            logs.setup_logging("WARNING", level="LOUD")
    finally:
        logs.set_level_override(None)
        log.handlers[:], log.level, log.propagate = saved

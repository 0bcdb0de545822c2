"""``runjournal stream RUN_ID [--from-offset N] [--follow] [--json]`` as a subprocess: a run's stream with the gap a
dead owner left, resumed by offset with no duplicate, followed while the new owner writes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest

from runjournal.core.settings import Settings
from runjournal.producers import Journal
from tests.support.readback import take_over

pytestmark = pytest.mark.integration


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "runjournal", "stream", *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_stream_command_prints_the_gap_resumes_by_offset_and_follows(topics: Settings,
                                                                     service_env: dict[str, str]) -> None:
    dead = Journal(topics, producer_id=f"dead-{uuid.uuid4().hex[:6]}")
    run = dead.start_run("t", "a", {})
    s = run.stream("answer")
    for tok in ("one ", "two "):
        s.write(tok)
    dead.streams.flush(10)
    dead.close()
    with Journal(topics, producer_id=f"live-{uuid.uuid4().hex[:6]}") as live:
        resumed = take_over(live, topics, run.run_id)
        with resumed.stream("answer") as s2:
            s2.write("three")
        live.streams.flush(10)
        records = [json.loads(line) for line in _cli(service_env, run.run_id, "--json").stdout.splitlines()]
        assert [(r["kind"], r["epoch"], r["data"] if r["kind"] != "gap" else r["data"]["dead_epoch"])
                for r in records] == [("chunk", 1, "one "), ("chunk", 1, "two "), ("gap", 2, 1),
                                      ("chunk", 2, "three"), ("end", 2, None)]
        rest = _cli(service_env, run.run_id, "--from-offset", str(records[1]["offset"] + 1), "--json")
        resumed_records = [json.loads(line) for line in rest.stdout.splitlines()]
        assert resumed_records[1:] == records[3:] and resumed_records[0]["offset"] == records[2]["offset"]
        # a reader that resumed after the dead owner's chunks did not see them: the gap says so (no last offset)
        assert resumed_records[0]["data"]["segments"] == [{"segment": "answer#1.1", "epoch": 1, "last_offset": None,
                                                           "last_n": None}]
        assert records[2]["data"]["segments"][0]["last_n"] == 2
        text = _cli(service_env, run.run_id).stdout
        assert text.startswith("one two \n⋯ gap: epoch 1 stopped here") and "three" in text
        follower = subprocess.Popen([sys.executable, "-m", "runjournal", "stream", run.run_id, "--follow",
                                     "--from-offset", str(records[-1]["offset"] + 1), "--json"], env=service_env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(3)  # the follower is reading the partition's end
        with resumed.stream("more") as s3:
            s3.write("four")
        live.streams.flush(10)
        out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err[-3000:]
    assert [(r["kind"], r["data"]) for r in map(json.loads, out.splitlines())] == [("chunk", "four"), ("end", None)]

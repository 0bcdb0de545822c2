"""Issue 20 (memory isolated): ``runjournal memory-extractor`` yields the CPU by default, every one of its threads.

The old extractor ran at the niceness it was started with (0), and its tokenizer started a thread pool the size
of the machine: beside the projector on 2 cores it took 14-22 % of the projector's throughput (bench/README.md,
pair 5). Now the process raises its niceness to ``RUNJOURNAL_MEMORY_NICE`` (default 19) before it starts any
thread, so librdkafka's, onnxruntime's and the read server's threads all inherit it; ``RUNJOURNAL_MEMORY_NICE=0``
leaves it as started; and it moves every thread to ``SCHED_IDLE`` (``RUNJOURNAL_MEMORY_SCHED``, default
``idle``). Run the way a user runs it: the command in a subprocess on the real stack.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runjournal.consumers.cognition import read_discovery
from runjournal.core.settings import Settings
from tests.support.workload import publish, run_events

pytestmark = pytest.mark.integration

BIN = str(Path(sys.executable).with_name("runjournal"))


def _thread_nices(pid: int, field: int = 19) -> dict[str, int]:
    """niceness (field 19; 41: scheduling policy) of every thread of ``pid`` from /proc/<pid>/task/<tid>/stat,
    by thread name."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        out[f"{name}/{tid}"] = int(rest[field - 3])
    return out


def _running_extractor_nices(env: dict[str, str], settings: Settings, field: int = 19) -> dict[str, int]:
    proc = subprocess.Popen([BIN, "memory-extractor"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 90
        while read_discovery(settings.effective_qdrant_path) is None:  # consumer, embedder and server started
            assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else ""
            assert time.monotonic() < deadline, "the extractor never came up"
            time.sleep(0.1)
        time.sleep(1.0)  # a poll or two: the consumer's and the tokenizer's threads exist by now
        return _thread_nices(proc.pid, field)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def test_the_extractor_runs_every_thread_at_nice_19_by_default_and_as_started_with_0(
        topics: Settings, service_env: dict[str, str]) -> None:
    publish(topics, run_events("prio-run"))
    nices = _running_extractor_nices(service_env, topics)
    assert len(nices) > 3 and set(nices.values()) == {19}, nices
    nices = _running_extractor_nices({**service_env, "RUNJOURNAL_MEMORY_NICE": "0"}, topics)
    assert set(nices.values()) == {os.getpriority(os.PRIO_PROCESS, 0)}, nices


def test_every_thread_takes_the_scheduling_policy_it_is_given(topics: Settings, service_env: dict[str, str]) -> None:
    """``RUNJOURNAL_MEMORY_SCHED=idle``: every thread (librdkafka's, onnxruntime's, the read server's) runs under
    SCHED_IDLE — only on CPU time no normal thread wants; ``other``: the time-sharing policy, niceness alone."""
    publish(topics, run_events("sched-run"))
    env = {k: v for k, v in service_env.items() if k != "RUNJOURNAL_MEMORY_SCHED"}
    policies = _running_extractor_nices(env, topics, field=41)  # the default
    assert len(policies) > 3 and set(policies.values()) == {os.SCHED_IDLE}, policies
    policies = _running_extractor_nices({**service_env, "RUNJOURNAL_MEMORY_SCHED": "other"}, topics, field=41)
    assert set(policies.values()) == {os.SCHED_OTHER}, policies


def test_an_out_of_range_niceness_is_refused_naming_the_variable(service_env: dict[str, str]) -> None:
    done = subprocess.run([BIN, "memory-extractor", "--until-caught-up", "--json"],
                          env={**service_env, "RUNJOURNAL_MEMORY_NICE": "40"}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0 and "RUNJOURNAL_MEMORY_NICE" in done.stderr, done.stderr[-2000:]


_EMBED_THREADS = """
import os
from runjournal.consumers.vectors.embed import MiniLMEmbedder
embedder = MiniLMEmbedder()
before = len(os.listdir("/proc/self/task"))
embedder.embed([f"tool call {i} wrote " + "a longer text " * (i % 9) for i in range(200)])
print(before, len(os.listdir("/proc/self/task")))
"""


def test_the_default_embedder_starts_no_thread_pool_of_its_own() -> None:
    """The old embedder's tokenizer started a thread per core in its first ``encode_batch`` (3 → 5 threads on 2
    cores); bounded, embedding runs on the caller's thread and onnxruntime's single intra-op thread."""
    env = {k: v for k, v in os.environ.items() if k != "TOKENIZERS_PARALLELISM"}  # as a user's shell has it
    done = subprocess.run([sys.executable, "-c", _EMBED_THREADS], env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    before, after = map(int, done.stdout.split())
    assert after == before, f"embedding started {after - before} threads"

"""Pair 9 — startup of the command line: how long a command keeps a user waiting, in a fresh process each time.

* **Ours** (the venv's console script, as a user runs it; wall time from spawn to exit, output discarded):
  ``runjournal --help``; ``runjournal inspect --help`` (a command's help: the root's options are processed too);
  ``runjournal inspect RUN_ID`` of a real run — its projected state from Redis and its history read from its
  partition, rendered as tables (the whole command: settings, the stack check, the reads, the output).
* **Anchors**: ``python -c "import typer"`` with the same interpreter — what any typer command line pays;
  ``python -c "import typer, typer.rich_utils, runjournal"`` — the floor of the help (typer's rich help and the
  ``runjournal`` package), so the ratio to it is what the command modules, typer's command tree and the help's
  rendering add; and for ``inspect RUN_ID`` the same reads with the raw clients — ``python -c`` building them with
  runjournal's one client builder (``core.kafka``, ``core.redis_client``: no settings, no pydantic), one GET of
  the run's state key and the run's partition read to its end (by position, as ``read_ranges`` decides it) with a
  plain consumer — so the ratio is what the command adds to the reads it has to make (the anchor reaches a plain
  Redis URL: the bench's stack).

The run: one agent run journaled by ``Journal`` in the pair's own prefix (RUN_STARTED, a planning node with two
messages, a booking node with a side-effecting and a read-only call, RUN_SUCCEEDED: 13 events) and projected by
the projector. One round runs each side once, in that order; the headline is the median over the rounds (after
one warm-up round, discarded: a cold page cache). Goals (absolute, the time a user waits): ``runjournal --help``
≤ 300 ms, ``runjournal inspect --help`` ≤ 400 ms, ``runjournal inspect RUN_ID`` ≤ 1,000 ms.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from bench._env import BenchEnv, child_env
from bench._model import Row, goal_met, paired_ratios, summarise
from bench._rounds import Side, interleave, progress

__all__ = ["run_startup"]

PAIR = "9 startup"
GOAL_HELP_MS = "≤ 300"
GOAL_INSPECT_HELP_MS = "≤ 400"
GOAL_INSPECT_MS = "≤ 1000"

#: The anchor of ``inspect RUN_ID``: the reads the command has to make, with the raw clients (no runjournal).
RAW_INSPECT = """
import json, os, time
from confluent_kafka import TopicPartition
from runjournal.core import kafka, redis_client  # the clients' one builder (no settings, no pydantic)
env = os.environ
assert redis_client.client(None, url=env["RJ_BENCH_REDIS_URL"]).hgetall(env["RJ_BENCH_STATE_KEY"]), "no state"
tp = TopicPartition(env["RJ_BENCH_TOPIC"], int(env["RJ_BENCH_PARTITION"]))
consumer = kafka.consumer(None, bootstrap=env["RJ_BENCH_BOOTSTRAP"], **{
    **json.loads(env["RJ_BENCH_KAFKA"]), "group.id": "bench-raw-inspect", "enable.auto.commit": False,
    "isolation.level": "read_committed"})
low, high = consumer.get_watermark_offsets(tp, timeout=10)
tp.offset = low
consumer.assign([tp])
records, deadline = 0, time.monotonic() + 10
while consumer.position([tp])[0].offset < high:  # to the end by position (commit markers deliver nothing)
    assert time.monotonic() < deadline, "the partition's end was not reached in 10 s"
    batch = consumer.consume(1000, timeout=0) or [m for m in [consumer.poll(0.2)] if m is not None]
    records += sum(1 for m in batch if m.error() is None)
consumer.close()
assert records, "no records"
"""


def _runjournal() -> str:
    """The ``runjournal`` console script next to this interpreter (the venv's), else the one on ``PATH``."""
    script = Path(sys.executable).with_name("runjournal")
    return str(script) if script.exists() else "runjournal"


def _wall_ms(argv: list[str], env: Mapping[str, str] | None = None) -> float:
    """Wall time of one run of ``argv``, spawn to exit, in ms.

    Raises:
        RuntimeError: the command exited non-zero (its stderr tail in the message).
    """
    started = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False,  # noqa: S603
                          env=None if env is None else dict(env))
    elapsed = (time.perf_counter() - started) * 1000
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode()[-2000:]}")
    return elapsed


def _real_run(env: BenchEnv) -> tuple[dict[str, str], dict[str, str], str]:
    """Journal and project one agent run in a fresh prefix (module docstring).

    Returns:
        ``(runjournal's environment, the raw anchor's environment, run_id)``.
    """
    from bench.boundary import NoopTool
    from runjournal.consumers.projector.service import Projector
    from runjournal.core.redis_keys import RedisKeys
    from runjournal.producers import Journal
    from runjournal.producers.tools import Outcome
    from runjournal.schemas.keys import partition_for

    class Lookup(NoopTool):
        name = "lookup_fare"
        side_effect = False

        def __call__(self, args: dict[str, object], idempotency_key: str) -> object:
            return {"fare": 129.0, "currency": "EUR"}

        def reconcile(self, idempotency_key: str) -> Outcome | None:
            return None

    settings = env.pair_settings("startup", partitions=6)
    run_id = f"bench-inspect-{uuid.uuid4().hex[:8]}"
    with Journal(settings, producer_id=f"bench-startup-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("acme", "booking-agent", {"ask": "book HAT123 on Friday"}, run_id=run_id,
                                user_id="u1")
        with run.node("plan"):
            run.message("user", "Please book HAT123 on Friday, aisle seat.")
            run.message("assistant", "Looking up the fare, then booking.")
        with run.node("book"):
            fare = run.call(Lookup(), {"flight": "HAT123"})
            run.call(NoopTool(), {"flight": "HAT123", "seat": "aisle", "fare": fare})
        run.succeed({"booked": "HAT123", "seat": "14C"})
    projector = Projector(settings)
    projector.run(until_caught_up=True, idle_timeout_s=60)
    partition = partition_for(run_id, settings.partitions)
    raw = {**child_env(settings), "RJ_BENCH_REDIS_URL": settings.redis_url, "RJ_BENCH_TOPIC": settings.events_topic,
           "RJ_BENCH_STATE_KEY": RedisKeys(settings.topic_prefix).run(partition, run_id),
           "RJ_BENCH_PARTITION": str(partition), "RJ_BENCH_BOOTSTRAP": settings.bootstrap,
           "RJ_BENCH_KAFKA": json.dumps(settings.kafka_security_config())}  # a child's environment, as child_env
    return child_env(settings, COLUMNS="120"), raw, run_id


def run_startup(env: BenchEnv, runs: int) -> list[Row]:
    """Run pair 9: ``runs`` measured rounds of each side (see the module docstring); returns its rows."""
    rj = _runjournal()
    floor = "import typer, typer.rich_utils, runjournal"
    rj_env, raw_env, run_id = _real_run(env)
    progress(f"{PAIR}: run {run_id} journaled and projected")
    res = interleave(PAIR, [
        Side("runjournal --help", lambda: _wall_ms([rj, "--help"])),
        Side("runjournal inspect --help", lambda: _wall_ms([rj, "inspect", "--help"])),
        Side("runjournal inspect RUN_ID", lambda: _wall_ms([rj, "inspect", run_id], rj_env)),
        Side("import typer", lambda: _wall_ms([sys.executable, "-c", "import typer"])),
        Side("floor", lambda: _wall_ms([sys.executable, "-c", floor])),
        Side("raw reads", lambda: _wall_ms([sys.executable, "-c", RAW_INSPECT], raw_env)),
    ], rounds=runs)

    def row(label: str, anchor: str, anchor_label: str, *, note: str, goal: str | None = None) -> Row:
        ours = summarise(res[label])
        return Row(PAIR, "wall ms, fresh process", label, ours, anchor_label, summarise(res[anchor]), goal=goal,
                   met=goal_met(ours.value, goal) if goal else None, note=note,
                   ratio_rounds=paired_ratios(res[label], res[anchor]))

    return [row("runjournal --help", "import typer", 'python -c "import typer"', goal=GOAL_HELP_MS,
                note=f"median of {runs} runs, sides interleaved; goal on ours (absolute)"),
            row("runjournal --help", "floor", f'python -c "{floor}"',
                note="what the command modules, typer's command tree and the help's rendering add"),
            row("runjournal inspect --help", "import typer", 'python -c "import typer"', goal=GOAL_INSPECT_HELP_MS,
                note="a command's help: typer also processes the root's options, which imports pydantic "
                     "(typer._adapters) — typer's own cost, not the command's; goal on ours (absolute)"),
            row("runjournal inspect RUN_ID", "raw reads", "the same reads, raw clients (python -c)",
                goal=GOAL_INSPECT_MS,
                note="a real run (13 events, projected): state from Redis, history from its partition, tables "
                     "printed; anchor: the raw clients (core.kafka, core.redis_client), GET the state, read the "
                     "partition to its end; goal on ours (absolute)")]

"""Pair 6 — memory footprint: peak RSS of the projector and of an agent instance; Redis bytes per run.

* projector: ``bench._children projector`` rebuilding pair 3's topic (until caught up) vs the
  ceiling loop (``bench._children ceiling``: raw consume + decode of the same topic), each a fresh
  process; peak RSS = the child's own ``VmHWM`` read as it ends (``wait4``'s ``ru_maxrss`` would
  also count the pages of the bench process it was forked from).
* agent instance: ``bench._children agent S`` (one Journal, 4 threads of runs with two no-op calls
  each, for S seconds) vs ``bench._children raw-producer N`` (a raw transactional producer writing
  the same number of events, committing every 2: the interpreter + librdkafka baseline).
* Redis: ``MEMORY USAGE`` of every run key of pair 3's projection (the run's hash) vs the length of its state's
  canonical JSON (``RunState.to_json_bytes``), per run.
"""

from __future__ import annotations

from typing import Any

from bench._env import BenchEnv, run_child
from bench._model import Row, paired_ratios, summarise
from bench._rounds import Side, interleave
from bench.projection import publish_workload
from runjournal.consumers.projector.store import ProjectionStore
from runjournal.core import redis_client

__all__ = ["run_footprint"]

PAIR = "6 footprint"
MIB = 1024 * 1024


def _redis_rows(settings: Any, runs: int) -> list[Row]:
    client = redis_client.client(settings)
    store = ProjectionStore(client, settings.topic_prefix)
    ids = {p: store.run_ids(p) for p in range(settings.partitions)}
    keys = [store.run_key(p, r) for p, rs in ids.items() for r in rs]
    if len(keys) != runs:
        raise RuntimeError(f"expected {runs} projected runs, found {len(keys)}")
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.memory_usage(k, samples=0)
    usage = sum(pipe.execute()) / runs
    length = sum(len(s.to_json_bytes()) for p, rs in ids.items() for s in store.load(p, rs).values()) / runs
    return [Row(PAIR, "Redis bytes per run", "MEMORY USAGE of the run key (hash)", summarise([usage]),
                "its state's JSON (to_json_bytes)", summarise([length]),
                note=f"{runs} complete runs of pair 3 (50 events, 12 tool calls each); the partition's run set "
                     "and offset keys add a few bytes per run")]


def run_footprint(env: BenchEnv, shared: dict[str, Any], seconds: int, rounds: int = 2) -> list[Row]:
    """Run pair 6; uses pair 3's topic and projection when it ran, else publishes its own."""
    proj = shared.get("projection")
    if proj is None:
        settings = env.pair_settings("footprint")
        proj = {"settings": settings, "runs": 400, "events": publish_workload(settings, 400, 50)}
    settings = proj["settings"]
    rows = [] if "projection" not in shared else _redis_rows(settings, proj["runs"])
    agent_events: list[int] = []

    agent_settings = env.pair_settings("footprint-agent")  # the agent must not write into pair 3's topic
    raw_topic = env.topic("footprint-raw", partitions=settings.partitions)

    def child(args: list[str]) -> float:
        out = run_child(agent_settings if args[0] in ("agent", "raw-producer") else settings, args)
        if args[0] == "agent":
            agent_events.append(out["events"])
        return out["peak_rss_bytes"] / MIB

    res = interleave(PAIR, [Side("projector", lambda: child(["projector"])),
                            Side("ceiling", lambda: child(["ceiling", str(proj["events"])])),
                            Side("agent", lambda: child(["agent", str(seconds)])),
                            Side("raw producer", lambda: child(["raw-producer", str(agent_events[-1]), raw_topic]))],
                     rounds=rounds, warmup=0)
    rows.insert(0, Row(PAIR, "peak RSS MiB", "projector process", summarise(res["projector"]),
                       "raw consume + decode process", summarise(res["ceiling"]),
                       note=f"{proj['events']} events, {proj['runs']} runs; fresh process each, VmHWM",
                       ratio_rounds=paired_ratios(res["projector"], res["ceiling"])))
    rows.insert(1, Row(PAIR, "peak RSS MiB", "agent instance (Journal, 4 threads)", summarise(res["agent"]),
                       "raw transactional producer, same events", summarise(res["raw producer"]),
                       note=f"{seconds} s of load, {agent_events} events per round",
                       ratio_rounds=paired_ratios(res["agent"], res["raw producer"])))
    return rows

"""Processes the bench starts to measure one thing each (peak RSS, or load beside the projector).

``python -m bench._children KIND [N]`` with the pair's ``RUNJOURNAL_*`` environment; prints one
JSON line. Kinds:

* ``projector``: rebuild the projection of the events topic (Redis prefix wiped, fresh group),
  until caught up — the projector as deployed (``runjournal projector --rebuild --until-caught-up``);
* ``ceiling N``: raw consume + decode of the topic's N records (the projector's anchor);
* ``agent N``: an agent instance under load for N seconds — one Journal, 4 threads each running
  runs of: node, user MESSAGE, two no-op side-effecting ``call``s, assistant MESSAGE, RUN_SUCCEEDED;
* ``raw-producer N TOPIC``: a raw transactional producer writing N 300-byte records to TOPIC,
  committing every 2 records (the agent's commit rate) — the agent's anchor.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from typing import Any

from runjournal.core import kafka
from runjournal.core.settings import Settings

__all__ = ["main"]


def _agent(settings: Settings, seconds: float) -> dict[str, Any]:
    from bench.boundary import NoopTool
    from runjournal.producers import Journal

    stop, counts = threading.Event(), [0] * 4
    text = "Please move me to the morning flight and keep the aisle seat. " * 3

    with Journal(settings, producer_id=f"bench-agent-{uuid.uuid4().hex[:6]}") as journal:
        def work(i: int) -> None:
            tool = NoopTool()
            while not stop.is_set():
                run = journal.start_run("acme", "bench", {"t": i})
                with run.node("book"):
                    run.message("user", text)
                    run.call(tool, {"flight": "HAT123"})
                    run.call(tool, {"seat": "14C"})
                    run.message("assistant", text[:100])
                run.succeed({"ok": True})
                counts[i] += 10

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join()
    return {"events": sum(counts), "seconds": seconds}


def _raw_producer(settings: Settings, events: int, topic: str) -> dict[str, Any]:

    producer = kafka.producer(settings, **{"enable.idempotence": True, "acks": "all",
                         "compression.type": "lz4", "linger.ms": 5,
                         "transactional.id": f"{settings.topic_prefix}.raw-{uuid.uuid4().hex[:6]}"})
    producer.init_transactions(30)
    value = b"v" * 300
    started = time.monotonic()
    for i in range(0, events, 2):
        producer.begin_transaction()
        for j in (i, i + 1):
            producer.produce(topic, key=f"raw:{j}".encode(), value=value, partition=j % settings.partitions)
        producer.commit_transaction(30)
    return {"events": events, "seconds": time.monotonic() - started}


def main() -> None:
    """Entry point (see the module docstring)."""
    kind, arg = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "0")
    settings = Settings.load()
    if kind == "projector":
        from runjournal.consumers.projector import Projector
        from runjournal.consumers.projector.store import ProjectionStore
        from runjournal.core import redis_client

        ProjectionStore(redis_client.client(settings), settings.topic_prefix).wipe()
        stats = Projector(settings, group_id=f"{settings.topic_prefix}.rss-{uuid.uuid4().hex[:6]}").run(
            until_caught_up=True)
        out: dict[str, Any] = {"events": stats.events, "seconds": stats.elapsed_s}
    elif kind == "ceiling":
        from bench.projection import ceiling_rate

        out = {"events": int(arg), "events_per_s": ceiling_rate(settings, int(arg))}
    elif kind == "agent":
        out = _agent(settings, float(arg))
    elif kind == "raw-producer":
        out = _raw_producer(settings, int(arg), sys.argv[3])
    else:
        raise SystemExit(f"unknown kind {kind}")
    from bench._env import peak_rss_bytes

    out["peak_rss_bytes"] = peak_rss_bytes()  # VmHWM of this process (wait4's ru_maxrss counts the parent's pages)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

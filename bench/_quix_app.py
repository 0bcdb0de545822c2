"""The Quix Streams anchor of pair 3, run as a subprocess in its own venv (bench/out/quix-venv).

A Quix Streams ``Application`` (RocksDB state, changelog topics on, at-least-once, read_committed)
folds each run's events with runjournal's own pure reducer (``runjournal.model.reducer.apply``, imported
from the repository) into per-key state: the same per-run fold the projector does, over the same
events as JSON, keyed by run_id. State values are the same canonical state JSON the projector
writes to Redis. Stops after ``--count`` messages; prints one JSON line with its timing.

Usage: ``python _quix_app.py --repo DIR --bootstrap B --topic T --group G --state-dir D --count N``
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any


def main() -> None:
    """Run the app (arguments in the module docstring)."""
    ap = argparse.ArgumentParser()
    for name in ("--repo", "--bootstrap", "--topic", "--group", "--state-dir"):
        ap.add_argument(name, required=True)
    ap.add_argument("--count", type=int, required=True)
    args = ap.parse_args()
    sys.path.insert(0, args.repo)
    from quixstreams import Application, message_context

    from runjournal.model.reducer import RunState, apply
    from runjournal.schemas.events import Event, EventType

    app = Application(broker_address=args.bootstrap, consumer_group=args.group, auto_offset_reset="earliest",
                      state_dir=args.state_dir, processing_guarantee="at-least-once", loglevel="WARNING",
                      consumer_extra_config={"isolation.level": "read_committed"})
    topic = app.topic(args.topic, value_deserializer="json", key_deserializer="str")
    times: dict[str, Any] = {"first": None, "last": None, "n": 0}

    def fold(value: dict[str, Any], state: Any) -> None:
        if times["first"] is None:
            times["first"] = time.perf_counter()
        ctx = message_context()
        prev = state.get("run")
        current = RunState.from_json(prev) if prev is not None else None
        event = Event(event_id=value["event_id"], run_id=value["run_id"], tenant_id=value["tenant_id"],
                      seq=value["seq"], epoch=value["epoch"], producer_id=value["producer_id"],
                      type=EventType(value["type"]),
                      occurred_at=datetime.fromtimestamp(value["occurred_at_ms"] / 1000, UTC),
                      payload=value["payload"], node_id=value["node_id"], traceparent=value["traceparent"])
        new = apply(current, event, partition=ctx.partition, offset=ctx.offset)
        if new is not current:
            state.set("run", new.to_json())
        times["n"] += 1
        times["last"] = time.perf_counter()

    sdf = app.dataframe(topic)
    sdf = sdf.update(fold, stateful=True)
    app.run(count=args.count, timeout=60)
    elapsed = (times["last"] or 0) - (times["first"] or 0)
    print(json.dumps({"events": times["n"], "elapsed_s": elapsed,
                      "events_per_s": times["n"] / elapsed if elapsed > 0 else 0.0}), flush=True)


if __name__ == "__main__":
    main()

"""Child agent for the durable-stream crash tests: one run that streams tokens, killed (or stopped) mid-stream.

Usage: ``python -m tests.support.stream_child RUN_ID PRODUCER_ID TOKENS [PAUSE_S [STOP_FILE]]`` with the service env.
Starts the run, opens ``run.stream("answer")`` and writes ``TOKENS`` chunks (``tok-1 `` …) acknowledged by the
broker, prints ``{"ready": RUN_ID}``, then keeps writing a chunk every ``PAUSE_S`` seconds (default: sleeps) — the
test kills it, or creates ``STOP_FILE``: then the segment ends, the journal closes (flushing the stream) and it
prints ``{"written": N, "lost": L}`` (``StreamWriter.lost``: records the broker never acknowledged).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from runjournal.core.settings import Settings
from runjournal.producers import Journal


def main() -> None:
    run_id, producer_id, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
    pause_s = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    stop = Path(sys.argv[5]) if len(sys.argv) > 5 else None
    with Journal(Settings.load(), producer_id=producer_id, lease_ttl_ms=1500) as journal:
        run = journal.start_run("tenant-a", "streamer", {"ask": "stream"}, run_id=run_id, user_id="u1")
        journal.flush()
        with run.stream("answer") as s:
            for i in range(1, tokens + 1):
                s.write(f"tok-{i} ")
            journal.streams.flush(10)
            print(json.dumps({"ready": run_id}), flush=True)
            i = tokens
            while stop is None or not stop.exists():
                if pause_s:
                    i += 1
                    s.write(f"tok-{i} ")
                    time.sleep(pause_s)
                else:
                    time.sleep(3600)
        run.succeed()
    print(json.dumps({"written": i, "lost": journal.streams.lost}), flush=True)


if __name__ == "__main__":
    main()

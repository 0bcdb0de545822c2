"""Child agent for the traces crash test: a traced run killed inside its side-effecting call.

Usage: ``python -m tests.support.traced_child RUN_ID PRODUCER_ID SIGNAL_FILE SPANS_FILE`` with the service env.
Tracing is configured with :class:`tests.support.spans.JsonLinesExporter` behind a ``SimpleSpanProcessor``, so
every span that ends is in SPANS_FILE before the parent's SIGKILL. Steps: node ``plan`` (``lookup``, no side
effect), node ``send`` (``send_email``: records its key in ``{prefix}:sent:{run_id}``, writes SIGNAL_FILE, hangs).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from runjournal.core import otel, redis_client
from runjournal.core.settings import Settings
from runjournal.producers import Journal
from tests.support.spans import JsonLinesExporter


def main() -> None:
    run_id, producer_id, signal_file, spans_file = sys.argv[1:5]
    otel.configure_tracing(SimpleSpanProcessor(JsonLinesExporter(Path(spans_file))))
    settings = Settings.load()
    r = redis_client.client(settings)

    class Lookup:
        name = "lookup"
        side_effect = False
        timeout_ms = 1000

        def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
            return {"found": args["q"]}

    class Send:
        name = "send_email"
        side_effect = True
        timeout_ms = 500

        def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
            r.sadd(f"{settings.topic_prefix}:sent:{run_id}", idempotency_key)
            Path(signal_file).write_text("ready")
            while True:
                time.sleep(60)

    journal = Journal(settings, producer_id=producer_id, lease_ttl_ms=2500)
    run = journal.start_run("tenant-a", "mailer", {"to": "bob"}, run_id=run_id)
    with run.node("plan"):
        run.call(Lookup(), {"q": "bob"})
    with run.node("send"):
        run.call(Send(), {"to": "bob"})
    run.succeed()


if __name__ == "__main__":
    main()

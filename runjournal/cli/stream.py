"""``runjournal stream``: a run's durable stream of partial output (``run.stream()``, decision 0055), from an offset."""

from __future__ import annotations

import json
from typing import Annotated

import typer

__all__ = ["stream_command"]


def stream_command(
    run_id: Annotated[str, typer.Argument(help="The run whose stream to read.")],
    from_offset: Annotated[int | None, typer.Option("--from-offset", min=0,
                                                    help="First offset to read (default: the beginning); resume "
                                                         "with the last offset printed + 1.")] = None,
    follow: Annotated[bool, typer.Option("--follow", help="Keep printing new records until 10 s pass "
                                                          "without one.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per record (offset, kind, epoch, "
                                                         "segment, n, data, at_ms).")] = False,
) -> None:
    """Print a run's stream from {prefix}.streams: chunks, ends and the gaps a crash left, fenced (a dead owner's late
    chunks are dropped). Without --json the chunks' text, with a marked line per gap. Sealed chunks (encryption on,
    decision 0059) are opened with RUNJOURNAL_KEYS_DIR's keys; one that cannot be opened (no key, an erased subject)
    is shown as ⟨encrypted: <error>⟩ (--json: data "encrypted" and "encrypted": the error's name).
    """
    from runjournal.cli._errors import cli_errors
    from runjournal.consumers.runtime.topic_identity import preflight
    from runjournal.consumers.streams import read_stream
    from runjournal.core.ids import RUN_ID
    from runjournal.core.settings import Settings

    settings = Settings.load()
    with cli_errors(as_json):
        RUN_ID.check_lookup(run_id)
        preflight(settings, need_topic=False, need_redis=False)  # no broker: named at once, not after 10 s
        for _offset, event in read_stream(settings, run_id, from_offset, follow=follow):
            if as_json:
                print(json.dumps(event.as_dict(), ensure_ascii=False), flush=True)
            elif event.kind == "chunk" and event.encrypted is not None:  # never the token (decision 0059)
                print(f"⟨encrypted: {event.encrypted}⟩", end="", flush=True)
            elif event.kind == "chunk":
                print(event.data if isinstance(event.data, str) else json.dumps(event.data), end="", flush=True)
            elif event.kind == "gap":
                print(f"\n⋯ gap: epoch {event.data.get('dead_epoch')} stopped here (offset {event.offset}) ⋯",
                      flush=True)
            else:
                print(flush=True)

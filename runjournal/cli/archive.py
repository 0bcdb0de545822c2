"""``runjournal archiver``: the retention service (decision 0056); and the archive fallback of ``inspect`` and
``replay`` (an archived run is read from its object)."""

from __future__ import annotations

import csv
import json
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from runjournal.cli._errors import cli_errors, fail, printable
from runjournal.cli._tables import folding_table
from runjournal.cli._values import PORT

if TYPE_CHECKING:
    from runjournal.core.settings import Settings

__all__ = ["archived_report", "archiver_command", "erase_archived", "query_command"]

console = Console()


def archiver_command(
    until_caught_up: Annotated[bool, typer.Option("--until-caught-up", help="Exit once every partition is read to "
                                                  "its end and one sweep of the due runs is done.")] = False,
    sweep_interval_s: Annotated[float, typer.Option("--sweep-interval", min=0.1,
                                                    help="Seconds between two sweeps of the due runs.")] = 10.0,
    metrics_port: Annotated[int | None, typer.Option(**PORT, help="Serve Prometheus /metrics on this port.")] = None,
    metrics_addr: Annotated[str, typer.Option(help="Bind address of /metrics.")] = "0.0.0.0",
    as_json: Annotated[bool, typer.Option("--json", help="Print the final stats as JSON.")] = False,
) -> None:
    """Run the archiver (the ``{prefix}.archiver`` consumer group) until SIGINT/SIGTERM, or until caught up.

    Notes when runs finish (by Redis's clock) and archives each finished run past its retention
    (RUNJOURNAL_RETENTION_S, RUNJOURNAL_RETENTION_OVERRIDES) to RUNJOURNAL_ARCHIVE_URL as Parquet, verifies it,
    then tombstones its keys and removes its Redis state (its memory stays). Exits 1 naming the cause when the
    stack, the topic or the archive's backend is missing, or a dependency stays away past the outage budget.
    """
    from runjournal.cli._signals import stop_on_signals
    from runjournal.consumers.archive.service import Archiver
    from runjournal.consumers.runtime.topic_identity import preflight
    from runjournal.core.logs import setup_logging
    from runjournal.core.settings import Settings
    from runjournal.stores.object_store import filesystem

    setup_logging("INFO")
    settings = Settings.load()
    with cli_errors(as_json):
        preflight(settings)
        filesystem(settings)  # an unknown scheme or a missing extra: said now, not at the first due run
        archiver = Archiver(settings, sweep_interval_s=sweep_interval_s)
        stop = stop_on_signals()  # before /metrics is announced: a SIGTERM from then on withdraws it (finally)
        failed: BaseException | None = None
        try:
            if metrics_port is not None:
                archiver.metrics.serve(metrics_port, addr=metrics_addr, redis_client=archiver.redis,
                                       prefix=settings.topic_prefix)
            stats = archiver.run(until_caught_up=until_caught_up, stop=stop)
        except BaseException as exc:
            failed = exc
            raise
        finally:
            if archiver.metrics.server is not None:  # the console: withdrawn, or "stopped since …, why"
                archiver.metrics.server.close(failed)
    out = stats.as_dict()
    if as_json:
        print(json.dumps(out))
    else:
        console.print(f"read {out['events']} events, noted {out['finished_noted']} finished run(s), archived "
                      f"{len(out['archived'])} run(s) to {settings.effective_archive_url}")


def archived_report(settings: Settings, run_id: str, *, until_seq: int | None = None) -> dict[str, Any] | None:
    """``replay``'s report of an archived run with ``"archived": "<object url>"``; None when the archive does not hold
    it (or the archive extra is not installed: nothing can have been archived by this install).

    Raises:
        ObjectStoreError: RUNJOURNAL_ARCHIVE_URL cannot be used (an unknown scheme, no bucket, s3fs missing) — said,
            never taken for an archive that does not hold the run.
    """
    try:
        from runjournal.consumers.archive.store import replay_archived
    except ImportError:
        return None
    found = replay_archived(settings, run_id, until_seq=until_seq)
    if found is None:
        return None
    replayed, url = found
    return {**replayed.as_dict(), "archived": url}


def erase_archived(settings: Settings, run_id: str) -> list[str]:
    """``erase`` of an archived run: delete its archive object and manifest; the URLs deleted ([] when the archive
    does not hold it, or the archive extra is not installed: nothing can have been archived by this install).

    Raises:
        ObjectStoreError: RUNJOURNAL_ARCHIVE_URL cannot be used — an erase must not report success while an archived
            copy may remain.
    """
    try:
        from runjournal.consumers.archive.store import delete_archived
    except ImportError:
        return []
    return delete_archived(settings, run_id)


def query_command(
    sql: Annotated[str, typer.Argument(help="One DuckDB statement over the tables runs, calls and events.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as a JSON list of objects.")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print the rows as CSV (a header line first).")] = False,
    no_live: Annotated[bool, typer.Option("--no-live", help="Leave out the live projection (Redis).")] = False,
    no_archive: Annotated[bool, typer.Option("--no-archive", help="Leave out the archive.")] = False,
) -> None:
    """Run SQL (DuckDB) over the archive and the live projection: tables runs, calls and events (events: archived
    runs only).

    Each table is an in-memory copy made for this query: a statement may change the copy, never the journal, Redis
    or the archive. Exits 1 naming the error (QueryError: DuckDB's message) for bad SQL or a missing stack or
    archive backend, 2 for a usage error.
    """
    from runjournal.core.settings import Settings

    if as_json and as_csv:
        raise fail("give --json or --csv, not both", as_json=as_json, code=2, kind="UsageError")
    if no_live and no_archive:
        raise fail("--no-live and --no-archive leave nothing to query", as_json=as_json, code=2, kind="UsageError")
    settings = Settings.load()
    with cli_errors(as_json):
        from runjournal.consumers.archive.sql import query
        from runjournal.consumers.runtime.topic_identity import preflight

        if not no_live:  # the live projection needs the stack (the archive alone does not): named at once
            preflight(settings)
        columns, rows = query(settings, sql, live=not no_live, archive=not no_archive)
    if as_json:
        print(json.dumps([dict(zip(columns, row, strict=True)) for row in rows], default=str))
    elif as_csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(["" if v is None else v for v in row] for row in rows)
    else:
        table = folding_table(*columns)
        for row in rows:
            table.add_row(*(Text("" if v is None else printable(v)) for v in row))  # no markup
        console.print(table)
        console.print(f"{len(rows)} row(s)")

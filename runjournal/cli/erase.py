"""``runjournal erase``: tombstone a run's events, delete its Redis state and its memory; or, with ``--tenant``
(and ``--subject``), crypto-shred a tenant's or one user's content by destroying its key (decision 0059)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

if TYPE_CHECKING:
    from runjournal.core.settings import Settings

__all__ = ["erase_command"]

console = Console(stderr=True, soft_wrap=True)


def erase_command(
    run_id: Annotated[str | None, typer.Argument(help="The run to erase (or give --tenant).")] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Crypto-shred this tenant: destroy its key and its "
                                               "subjects' keys (with --subject: only that subject's).")] = None,
    subject: Annotated[str | None, typer.Option("--subject", help="Crypto-shred this user of --tenant: destroy "
                                                "the user's key.")] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Erase even an unfinished run whose owner is alive.")]
    = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as one JSON object.")] = False,
) -> None:
    """Erase a run: a tombstone for every event key and framework-record key, its Redis state and records, its memory;
    an archived run's archive object and manifest too.

    Exits 1 when the run is live (without --force), a tombstone was not acknowledged, or the topic
    never held the run. A local Qdrant held by a running memory extractor is reported, not an error:
    the extractor erases the run's items when it reads the tombstones.

    With --tenant (and --subject) instead of a run: destroy the tenant's (the user's) encryption keys in the key
    service (RUNJOURNAL_KMS): every copy of their encrypted content, anywhere, becomes unreadable; runs, ids and
    digests stay. Exits 2 when both or neither of a run and --tenant are given, or --subject without --tenant.
    """
    from runjournal.cli._errors import cli_errors, fail
    from runjournal.cli.archive import erase_archived
    from runjournal.consumers.ops.erase import erase_run
    from runjournal.consumers.runtime.topic_identity import preflight
    from runjournal.core.settings import Settings

    if (run_id is None) == (tenant is None) or (subject is not None and tenant is None):
        raise fail("give a RUN_ID, or --tenant (with --subject for one user), not both", as_json=as_json, code=2,
                   kind="UsageError")
    settings = Settings.load()
    if run_id is None:
        _shred(settings, str(tenant), subject, yes=yes, as_json=as_json)
        return
    with cli_errors(as_json):
        preflight(settings)
        _archive_usable(settings)  # before anything is erased: an archive that cannot be read is named first
    if not yes:
        typer.confirm(f"Erase run {run_id} (events, Redis state, memory)? This cannot be undone", abort=True)
    with cli_errors(as_json):  # EraseError included
        report = erase_run(settings, run_id, force=force,
                           progress=None if as_json else lambda text: console.print(f"… {text}", highlight=False))
        archived = erase_archived(settings, run_id)  # an archived run: its object and manifest too (decision 0056)
    out = {**report.as_dict(), "archive_objects_deleted": archived}
    if as_json:
        print(json.dumps(out))
    else:
        memory = "?" if report.memory_points_deleted is None else str(report.memory_points_deleted)
        console.print(f"erased run {run_id}: {report.tombstones} tombstone(s) written to partition {report.partition} "
                      f"({report.records_seen} record(s) read), {report.checkpoint_tombstones} to its framework "
                      f"records ({report.checkpoint_records_seen} read), {report.payload_tombstones} to its large "
                      f"results' records ({report.payload_records_seen} read), {report.redis_keys_deleted} Redis "
                      f"key(s) and {report.redis_entries_removed} entr(ies) deleted, {memory} memory point(s) deleted")
        if report.memory_note:
            console.print(f"memory: {report.memory_note}")
        for url in archived:
            console.print(f"archive: deleted {url}", highlight=False)
    if report.records_seen == 0 and not archived:
        raise fail(f"the topic never held run {run_id}", as_json=as_json, kind="RunNotFound")


def _shred(settings: Settings, tenant: str, subject: str | None, *, yes: bool, as_json: bool) -> None:
    """``erase --tenant T [--subject U]``: destroy the keys (``runjournal.consumers.ops.erase.shred_keys``)."""
    from runjournal.cli._errors import cli_errors
    from runjournal.consumers.ops.erase import shred_keys

    what = f"user {subject} of tenant {tenant}" if subject else f"tenant {tenant} and every user of it"
    if not yes:
        typer.confirm(f"Destroy the encryption keys of {what}? Their content becomes unreadable everywhere, for good",
                      abort=True)
    with cli_errors(as_json):
        report = shred_keys(settings, tenant, subject)
    if as_json:
        print(json.dumps(report.as_dict()))
        return
    destroyed = sum(1 for k in report.shredded if k["destroyed"])
    console.print(f"shredded {what}: {destroyed} key(s) destroyed, {len(report.shredded) - destroyed} already "
                  f"destroyed; {report.note}", highlight=False)
    for line in report.deleted:
        console.print(f"deleted {line}", highlight=False)
    if report.memory_note:
        console.print(f"memory: {report.memory_note}", highlight=False)


def _archive_usable(settings: Settings) -> None:
    """Raise ``ObjectStoreError`` when RUNJOURNAL_ARCHIVE_URL cannot be used (only with the archive extra installed:
    without it nothing can have been archived by this install)."""
    import importlib.util

    if importlib.util.find_spec("pyarrow") is None or importlib.util.find_spec("fsspec") is None:
        return
    from runjournal.stores.object_store import filesystem

    filesystem(settings)

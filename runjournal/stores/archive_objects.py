"""The archive's objects, read at the lowest layer that needs them (decision 0056; continuing an archived run: 0058).

An archived run is one Parquet object plus a manifest ``<root>/runs/<sha256(run_id)>.json`` (written by
``runjournal.consumers.archive.store.archive_run``). This module holds what every reader of them shares — the
manifest's path, the Parquet read of the rows, the rows' digest — so that layers below the archive room read an
archived run too: the recovery room restores an archived FAILED run before continuing it
(``runjournal.consumers.recovery.unarchive``), and ``ResultStore`` reads a large result's chunks from the archive when
its records on ``{prefix}.payloads`` are gone (``runjournal.producers.results``). Writing stays in the archive room.

Needs the ``archive`` extra (pyarrow, fsspec; s3fs for ``s3://``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runjournal.core.errors import RunjournalError
from runjournal.stores.errors import ObjectStoreError
from runjournal.stores.object_store import EXTRA, filesystem

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from runjournal.core.settings import Settings

__all__ = ["COLUMNS", "ArchivedObjectMismatchError", "ArchivedRows", "manifest_path", "read_checked",
           "read_manifest", "read_rows", "rows_digest"]

COLUMNS = ("source", "partition", "offset", "key", "type", "seq", "epoch", "value")
"""The Parquet columns: ``source`` (``events``, ``checkpoints`` or ``payloads``: the topic the row came from),
its ``partition`` and ``offset``, the record ``key`` (text), the event ``type``, ``seq`` and ``epoch`` (null for the
other sources) and ``value``: the record's encoded bytes as the topic held them (the codec decodes an event)."""


class ArchivedObjectMismatchError(RunjournalError):
    """An archived object read back does not match its manifest (row count or digest): it is not used."""


@dataclass(frozen=True)
class ArchivedRows:
    """A run's manifest and its object's rows, checked against each other (:func:`read_checked`)."""

    manifest: dict[str, Any]
    """``run_id``, ``object_url``, ``object_path``, ``rows``, ``digest``, ``status``, ``partition``, offsets…"""
    rows: list[dict[str, Any]]
    """Every row, with the columns of :data:`COLUMNS`."""


def manifest_path(root: str, run_id: str) -> str:
    """``<root>/runs/<sha256(run_id) hex>.json``: a run found by its id."""
    return f"{root}/runs/{hashlib.sha256(run_id.encode()).hexdigest()}.json"


def rows_digest(rows: Iterable[dict[str, Any]]) -> str:
    """SHA-256 (hex) over every row's columns, each length-prefixed, in order: the same rows, the same digest."""
    h = hashlib.sha256()
    for row in rows:
        for col in COLUMNS:
            value = row[col]
            data = value if isinstance(value, bytes) else b"\x00" if value is None else str(value).encode()
            h.update(len(data).to_bytes(8, "big"))
            h.update(data)
    return h.hexdigest()


def read_manifest(fs: AbstractFileSystem, root: str, run_id: str) -> dict[str, Any] | None:
    """The run's manifest, or None when the archive has none."""
    path = manifest_path(root, run_id)
    if not fs.exists(path):
        return None
    with fs.open(path, "rb") as src:
        manifest: dict[str, Any] = json.loads(src.read())
    return manifest


def read_rows(fs: AbstractFileSystem, path: str) -> list[dict[str, Any]]:
    """Every row of the Parquet object at ``path`` (pyarrow), as dicts of :data:`COLUMNS`.

    Raises:
        ObjectStoreError: pyarrow is not installed (the ``archive`` extra).
    """
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ObjectStoreError(f"reading the archive needs pyarrow, which is not installed: {EXTRA}") from exc
    with fs.open(path, "rb") as src:
        rows: list[dict[str, Any]] = pq.read_table(src).to_pylist()
    return rows


def read_checked(settings: Settings, run_id: str) -> ArchivedRows | None:
    """The run's manifest and rows from the archive of ``settings`` (``RUNJOURNAL_ARCHIVE_URL``), or None when the
    archive holds no manifest for ``run_id``.

    Raises:
        ArchivedObjectMismatchError: the object's rows do not match the manifest's count and digest (or it is gone).
        ObjectStoreError: the archive's backend is unknown or not installed.
    """
    fs, root = filesystem(settings)
    manifest = read_manifest(fs, root, run_id)
    if manifest is None:
        return None
    if not fs.exists(manifest["object_path"]):
        raise ArchivedObjectMismatchError(f"archive of run {run_id}: its object {manifest['object_url']} is gone")
    rows = read_rows(fs, manifest["object_path"])
    if len(rows) != manifest["rows"] or rows_digest(rows) != manifest["digest"]:
        raise ArchivedObjectMismatchError(f"archive of run {run_id} at {manifest['object_url']} does not match its "
                                          f"manifest ({len(rows)} rows, manifest {manifest['rows']})")
    return ArchivedRows(manifest=manifest, rows=rows)

"""Retention and the archive (issue 30, decision 0056): finished runs past their retention move from Kafka and Redis
to Parquet objects (a local folder or ``s3://``), and stay readable there.

* :mod:`~runjournal.consumers.archive.store` — :func:`archive_run` (write, verify, then remove from the hot stores),
  :func:`read_archived`, :func:`delete_archived`; object names and the per-run manifest.
* :mod:`~runjournal.consumers.archive.service` — :class:`Archiver`, the ``{prefix}.archiver`` consumer group that
  notes finished runs by Redis's clock and archives those past ``Settings.retention_for``.
* :mod:`~runjournal.consumers.archive.sql` — :func:`query`: DuckDB over the archive and the live projection
  (``runjournal query``).

Needs the ``archive`` extra (``pip install 'runjournal[archive]'``: pyarrow, fsspec, s3fs).
"""

from runjournal.core.lazy import lazy_exports

_HOMES = {
    **dict.fromkeys(["ArchiveError", "ArchiveReport", "ArchiveVerifyError", "ArchivedRun", "RunNotFinishedError",
                     "archive_run", "delete_archived", "read_archived", "replay_archived"],
                    "runjournal.consumers.archive.store"),
    **dict.fromkeys(["Archiver", "ArchiverStats", "archiver_group"], "runjournal.consumers.archive.service"),
    **dict.fromkeys(["QueryError", "query"], "runjournal.consumers.archive.sql"),
}
__all__ = sorted(_HOMES)
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

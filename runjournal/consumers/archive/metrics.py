"""Prometheus metrics of the archiver, in base units, on a registry of its own (``runjournal.core.metrics``).

``runjournal archiver --metrics-port P`` serves them (and the one failure policy's
``runjournal_dependency_retries_total`` / ``runjournal_dependency_waiting`` with ``service="archiver"``: an object
store that does not answer shows there as ``dependency="object_store"``). docs/guide/archive.md lists them.
"""

from __future__ import annotations

from typing import Any

from runjournal.core import metrics as m

__all__ = ["ArchiverMetrics"]


class ArchiverMetrics:
    """The archiver's families; :meth:`serve` exposes them on ``/metrics``.

    Args:
        registry: where to register (default: a new one with the process collector).
    """

    def __init__(self, registry: Any = None) -> None:
        self.registry = registry if registry is not None else m.new_registry("archiver")
        r = self.registry
        self.events = m.counter(r, "runjournal_archive_events", "Records of the events topic read by the archiver")
        self.noted = m.counter(r, "runjournal_archive_finished_noted",
                               "Terminal events noted in the due set (scored by Redis's clock)")
        self.archived = m.counter(r, "runjournal_archive_runs_archived",
                                  "Runs archived (object written and verified) and removed from the hot stores")
        self.rows = m.counter(r, "runjournal_archive_rows_written",
                              "Rows written to archive objects (events, framework records, large results' chunks)")
        self.refused = m.counter(r, "runjournal_archive_runs_refused",
                                 "Runs that left the due set unarchived, by reason (not_finished, erased, id_reused)",
                                 ["reason"])
        self.retried = m.counter(r, "runjournal_archive_runs_retried",
                                 "Runs left due for the next sweep after a failure of their own, by cause (error "
                                 "class)", ["cause"])
        self.due = m.gauge(r, "runjournal_archive_due_runs", "Finished runs in the due set after the last sweep")
        self.overdue = m.gauge(r, "runjournal_archive_overdue_runs",
                               "Runs past their retention still in the due set after the last sweep")
        self.sweep_seconds = m.histogram(r, "runjournal_archive_sweep_seconds", "One sweep of the due set, seconds")
        self.server: m.MetricsServer | None = None

    def serve(self, port: int, *, addr: str = "0.0.0.0", redis_client: Any = None,
              prefix: str | None = None) -> m.MetricsServer:
        """Expose ``/metrics`` on ``addr:port`` (announced for the console when given Redis).

        Raises:
            PortInUseError: the port is taken (the message names ``--metrics-port``).
        """
        self.server = m.serve(self.registry, port, service="archiver", addr=addr, redis_client=redis_client,
                              prefix=prefix)
        return self.server

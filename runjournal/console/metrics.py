"""Prometheus metrics of the console itself (served on its own ``/metrics``), in base units."""

from __future__ import annotations

from typing import Any

from runjournal.core import metrics as m

__all__ = ["ConsoleMetrics"]


class ConsoleMetrics:
    """The console's families, on a registry of its own with the process collector.

    Args:
        registry: where to register (default: a new one).
    """

    def __init__(self, registry: Any = None) -> None:
        self.registry = registry if registry is not None else m.new_registry("console")
        r = self.registry
        self.requests = m.histogram(r, "runjournal_console_request_duration_seconds",
                                    "Time to answer one request, by route template, method and status, seconds",
                                    ["route", "method", "status"])
        self.decisions = m.counter(r, "runjournal_console_decisions",
                                   "Approval decisions submitted, by decision and result (written, refused, "
                                   "unauthorized, unavailable)", ["decision", "result"])
        self.controls = m.counter(r, "runjournal_console_controls",
                                  "Operator cancel / pause / resume from the console, by action and result (the "
                                  "outcome — cancelled, paused, resumed, requested, withdrawn … — or refused, "
                                  "unauthorized, unavailable)", ["action", "result"])
        self.scrape_errors = m.counter(r, "runjournal_console_scrape_errors",
                                       "Failed scrapes of a service's /metrics, by service", ["service"])
        self.runs_listed = m.gauge(r, "runjournal_console_runs_in_projection",
                                   "Runs in the projection at the last runs-list request")

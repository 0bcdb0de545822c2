"""Prometheus metrics of the projector (own registry, so several projectors can live in one test process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["ProjectorMetrics"]


class ProjectorMetrics:
    """The projector's counters, gauges and histograms; ``serve(port)`` exposes them over HTTP."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.events = Counter("runjournal_projector_events", "Events applied (incl. no-ops)", ["partition"],
                              registry=r)
        self.batch_seconds = Histogram("runjournal_projector_batch_apply_seconds",
                                       "Fold + atomic Redis write per partition batch, seconds", registry=r,
                                       buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
        self.lag = Gauge("runjournal_projector_lag_records", "High watermark minus position", ["partition"],
                         registry=r)
        self.lag_ms = Histogram("runjournal_projector_lag_ms", "Now minus the oldest record's CreateTime per poll, ms",
                                registry=r, buckets=(5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000))
        self.parked = Counter("runjournal_projector_runs_parked", "Runs parked on a seq gap", registry=r)
        self.blocked = Counter("runjournal_projector_runs_blocked", "Runs blocked by an undecodable event",
                               registry=r)
        self.fenced = Counter("runjournal_projector_stale_epoch_rejected",
                              "Control-flow events rejected from a lower epoch", registry=r)
        self.dead_lettered = Counter("runjournal_projector_dead_lettered", "Records sent to the DLQ", registry=r)
        self.erased = Counter("runjournal_projector_runs_erased", "Runs erased by tombstones", registry=r)
        self.conflicts = Counter("runjournal_projector_conflicts",
                                 "Batches refused by Redis (stale view: reloaded and re-seeked)", registry=r)

    def serve(self, port: int) -> None:
        """Expose ``/metrics`` on ``port`` (0.0.0.0) in a daemon thread."""
        start_http_server(port, registry=self.registry)

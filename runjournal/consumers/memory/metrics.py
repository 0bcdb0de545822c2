"""Prometheus metrics of the memory extractor, in base units, on a registry of its own (``runjournal.core.metrics``).

Lag as the projector's: ``runjournal_memory_lag_records`` per partition and ``runjournal_memory_lag_seconds``
(now minus the CreateTime of the oldest record of the last poll; 0 after an empty poll).
"""

from __future__ import annotations

from typing import Any

from runjournal.core import metrics as m

__all__ = ["ExtractorMetrics"]


class ExtractorMetrics:
    """The memory extractor's families; :meth:`serve` exposes them on ``/metrics``.

    Args:
        registry: where to register (default: a new one with the process collector).
    """

    def __init__(self, registry: Any = None) -> None:
        self.registry = registry if registry is not None else m.new_registry("memory")
        r = self.registry
        self.events = m.counter(r, "runjournal_memory_events", "Records handled (no-ops included)", ["partition"])
        self.items = m.counter(r, "runjournal_memory_items_written", "Memory items upserted to Qdrant")
        self.erased = m.counter(r, "runjournal_memory_items_erased", "Memory items erased by tombstones")
        self.batch_seconds = m.histogram(r, "runjournal_memory_batch_seconds",
                                         "Decode + extract + embed + upsert of one poll's records, seconds")
        self.embed_seconds = m.histogram(r, "runjournal_memory_embed_seconds", "Embedding one segment, seconds")
        self.commit_seconds = m.histogram(r, "runjournal_memory_commit_seconds",
                                          "The idempotent upsert of one segment's items (wait=True), seconds")
        self.lag = m.gauge(r, "runjournal_memory_lag_records", "End offset minus position, per partition",
                           ["partition"])
        self.lag_seconds = m.gauge(r, "runjournal_memory_lag_seconds",
                                   "Now minus the CreateTime of the oldest record of the last poll (0 after an "
                                   "empty poll), seconds")
        self.event_age = m.histogram(r, "runjournal_memory_event_age_seconds",
                                     "Now minus the oldest record's CreateTime, per non-empty poll, seconds",
                                     buckets=m.LAG_BUCKETS_S)
        self.retries = m.counter(r, "runjournal_memory_retries",
                                 "Retries of a step (decode, extract, embed, upsert, erase), by cause (error class)",
                                 ["op", "cause"])
        self.dead_lettered = m.counter(r, "runjournal_memory_dead_letters",
                                       "Records copied to the memory DLQ, by cause (error class)", ["cause"])
        self.headroom_wait = m.counter(r, "runjournal_memory_headroom_wait_seconds",
                                       "Time the extractor waited for idle CPU before a batch "
                                       "(RUNJOURNAL_MEMORY_HEADROOM_CORES), seconds")
        self.server: m.MetricsServer | None = None

    def observe_poll(self, stamps_ms: list[int], now_ms: int) -> None:
        """Lag of one poll from its records' CreateTimes (ms since the epoch); an empty list means caught up."""
        if not stamps_ms:
            self.lag_seconds.set(0)
            return
        age_s = max(0, now_ms - min(stamps_ms)) / 1000
        self.lag_seconds.set(age_s)
        self.event_age.observe(age_s)

    def serve(self, port: int, *, addr: str = "0.0.0.0", redis_client: Any = None,
              prefix: str | None = None) -> m.MetricsServer:
        """Expose ``/metrics`` on ``addr:port`` (announced for the console when given Redis).
        Raises PortInUseError (the port is taken)."""
        self.server = m.serve(self.registry, port, service="memory", addr=addr, redis_client=redis_client,
                              prefix=prefix)
        return self.server

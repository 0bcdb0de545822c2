"""Opt-in Prometheus metrics of the journal inside an agent (:class:`JournalMetrics`).

Off by default: a :class:`~runjournal.producers.journal.Journal` built without ``metrics=`` exports nothing and
never imports prometheus-client (the core install does not ship it). Two ways in::

    from prometheus_client import REGISTRY
    Journal(settings, metrics=JournalMetrics(REGISTRY))     # the host application's registry (it has its own
                                                           # process collector and /metrics route)
    Journal(settings, metrics=JournalMetrics.serve(9464))  # a registry of its own with the process collector,
                                                           # served on :9464/metrics

Families (label ``producer_id``; several journals may share one registry): ``runjournal_journal_events_total``
by event type, ``runjournal_journal_durable_publish_seconds`` (a durable event from produce to the broker's
acknowledgement of its transaction), ``runjournal_journal_tool_call_outcomes_total`` by outcome class
(committed, failed, reconciled_committed, reconciled_not_executed, reconciled_failed) and, read from each
journal's counters at scrape time, ``runjournal_journal_transactions_committed_total``, ``…_aborted_total``,
``runjournal_journal_producer_rebuilds_total``, ``runjournal_journal_fences_total`` and
``runjournal_journal_lease_lapses_total``, ``runjournal_journal_runs_surrendered_total`` and
``runjournal_journal_runs_over_event_budget_total`` (README § Limits).

Spend (docs/guide/spend.md § See it), in base units — tokens, model calls, and micro-units of
``Settings.spend_currency`` for dim ``cost_micros``: ``runjournal_spend_reserved_total{model,dim}`` (estimates
charged by reserves this process ran), ``runjournal_spend_settled_total{model,dim}`` (actual usage settled) and
``runjournal_spend_refused_total{dim,scope_kind}`` (reserves refused by a budget; ``scope_kind`` run, tenant or
user). A step the journal answered (a resumed run's recorded reservation) charges nothing and counts nothing.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from runjournal.core import metrics as m

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from runjournal.schemas import Event

__all__ = ["NO_METRICS", "JournalMetrics"]

_OUTCOMES = {"TOOL_CALL_COMMITTED": "committed", "TOOL_CALL_FAILED": "failed"}
_STATS = (("commits", "runjournal_journal_transactions_committed", "Transactions committed"),
          ("aborts", "runjournal_journal_transactions_aborted", "Transactions aborted"),
          ("rebuilds", "runjournal_journal_producer_rebuilds", "Producers rebuilt after a fatal/abortable error"),
          ("fences", "runjournal_journal_fences", "Times the instance was found fenced"),
          ("lease_lapses", "runjournal_journal_lease_lapses", "Lease renewals that found the lease lapsed"),
          ("surrendered", "runjournal_journal_runs_surrendered",
           "Runs handed to the recovery job after a handle lost an event (Journal.surrender)"),
          ("runs_over_event_budget", "runjournal_journal_runs_over_event_budget",
           "Runs that reached their event budget (Settings.run_events_warn) in this journal"))
_collectors: weakref.WeakKeyDictionary[Any, _StatsCollector] = weakref.WeakKeyDictionary()
_collectors_lock = threading.Lock()


class _NoMetrics:
    """What a journal without metrics calls: nothing happens, nothing is imported."""

    def attach(self, journal: Any) -> None:
        """No-op."""

    def published(self, producer_id: str, event: Event, *, durable: bool, seconds: float) -> None:
        """No-op."""

    def spend_reserved(self, model: str, amounts: Mapping[str, int]) -> None:
        """No-op."""

    def spend_settled(self, model: str, amounts: Mapping[str, int]) -> None:
        """No-op."""

    def spend_refused(self, dim: str, scope_kind: str) -> None:
        """No-op."""

    def spend_budget_use(self, tenant: str | None, scope_kind: str, dim: str, used: int, limit: int) -> None:
        """No-op."""


#: The default of ``Journal(metrics=None)``.
NO_METRICS = _NoMetrics()


class _StatsCollector:
    """Reads the attached journals' counters (``Journal.stats``) when the registry is scraped."""

    def __init__(self) -> None:
        self.journals: weakref.WeakSet[Any] = weakref.WeakSet()

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily

        journals = list(self.journals)
        for key, name, doc in _STATS:
            family = CounterMetricFamily(name, doc, labels=["producer_id"])
            for journal in journals:
                family.add_metric([journal.producer_id], float(journal.stats[key]))
            yield family


class JournalMetrics:
    """Prometheus families of the journals of one process (see the module docstring).

    Args:
        registry: the host application's registry (nothing else is added to it), or None for a registry of
            its own with the process collector (served by :meth:`serve`).

    Raises:
        ImportError: prometheus-client is not installed (``pip install prometheus-client``).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else m.new_registry("journal")
        r = self.registry
        self.events = m.counter(r, "runjournal_journal_events", "Events published, by type",
                                ("producer_id", "type"))
        self.durable_seconds = m.histogram(r, "runjournal_journal_durable_publish_seconds",
                                           "A durable event from produce to its transaction's acknowledgement, "
                                           "seconds", ("producer_id",))
        self.outcomes = m.counter(r, "runjournal_journal_tool_call_outcomes", "Tool call outcomes journaled, by class",
                                  ("producer_id", "outcome"))
        self.spend_reserved_total = m.counter(r, "runjournal_spend_reserved", "Spend reserved (estimates charged), "
                                              "base units: tokens, model calls, cost_micros", ("model", "dim"))
        self.spend_settled_total = m.counter(r, "runjournal_spend_settled", "Spend settled (actual usage), base "
                                             "units: tokens, model calls, cost_micros", ("model", "dim"))
        self.spend_refused_total = m.counter(r, "runjournal_spend_refused", "Reserves refused by a budget",
                                             ("dim", "scope_kind"))
        self.spend_budget_ratio = m.gauge(r, "runjournal_spend_budget_used_ratio",
                                          "Used / limit of a budget after this process's last reserve (1 = at the "
                                          "limit): tenant budgets by tenant, run and user budgets their highest",
                                          ("tenant", "scope_kind", "dim"))
        with _collectors_lock:
            collector = _collectors.get(r)
            if collector is None:
                collector = _collectors[r] = _StatsCollector()
                r.register(collector)
        self._stats = collector
        self.server: m.MetricsServer | None = None

    @classmethod
    def serve(cls, port: int, *, addr: str = "0.0.0.0") -> JournalMetrics:
        """A registry of its own, with the process collector, served on ``addr:port`` ``/metrics``.

        Raises:
            PortInUseError: the port is taken (runjournal.core.errors).
        """
        out = cls()
        out.server = m.serve(out.registry, port, service="journal", addr=addr)
        return out

    def attach(self, journal: Any) -> None:
        """Export ``journal.stats`` (read at scrape time; the journal is held weakly)."""
        self._stats.journals.add(journal)

    def published(self, producer_id: str, event: Event, *, durable: bool, seconds: float) -> None:
        """Count one published event; ``seconds`` is produce-to-acknowledgement for a durable one."""
        kind = str(event.type)
        self.events.labels(producer_id, kind).inc()
        if durable:
            self.durable_seconds.labels(producer_id).observe(seconds)
        outcome = _OUTCOMES.get(kind)
        if kind == "TOOL_CALL_RECONCILED":
            outcome = f"reconciled_{str(event.payload.get('outcome', 'unknown')).lower()}"
        if outcome is not None:
            self.outcomes.labels(producer_id, outcome).inc()

    def spend_reserved(self, model: str, amounts: Mapping[str, int]) -> None:
        """Count a reservation's estimate ``{dim: amount}`` (base units) charged to the ledger."""
        for dim, amount in amounts.items():
            self.spend_reserved_total.labels(model, dim).inc(int(amount))

    def spend_settled(self, model: str, amounts: Mapping[str, int]) -> None:
        """Count a settle's actual usage ``{dim: amount}`` (base units)."""
        for dim, amount in amounts.items():
            self.spend_settled_total.labels(model, dim).inc(int(amount))

    def spend_budget_use(self, tenant: str | None, scope_kind: str, dim: str, used: int, limit: int) -> None:
        """Set ``runjournal_spend_budget_used_ratio``: for a tenant budget, labelled by the tenant; for run and user
        budgets (unbounded label sets) the ratio of the scope just charged, unlabelled (``tenant=""``) — alert on it
        near 1."""
        ratio = used / limit if limit > 0 else (1.0 if used > 0 else 0.0)
        self.spend_budget_ratio.labels(tenant or "", scope_kind, dim).set(ratio)

    def spend_refused(self, dim: str, scope_kind: str) -> None:
        """Count one reserve refused by the budget of ``scope_kind`` (run, tenant, user) in ``dim``."""
        self.spend_refused_total.labels(dim, scope_kind).inc()

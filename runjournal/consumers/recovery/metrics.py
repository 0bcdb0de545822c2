"""Prometheus metrics of the recovery sweep (``runjournal recover --watch``), and the recovery backlog.

Each pass is observed from its :class:`~runjournal.consumers.recovery.job.RecoveryReport` (outside the job, so
the job stays free of metrics plumbing). **Recovery lag** is the backlog left after a pass: runs owned by
instances that hold no lease (:func:`recovery_backlog`) and the age of the oldest one — now minus the time of
its last projected event — in ``runjournal_recovery_lag_seconds``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from runjournal.consumers.projector.store import ProjectionStore
from runjournal.consumers.recovery.instances import Instances
from runjournal.core import metrics as m
from runjournal.schemas.keys import partition_for

__all__ = ["Backlog", "RecoveryMetrics", "recovery_backlog"]


@dataclass(frozen=True)
class Backlog:
    """Runs waiting for recovery: owned (or incoming) by instances that hold no lease, and runs the projection shows
    in flight whose owner holds no lease although no set lists them (a lost set, a hand-over that died)."""

    runs: int
    """How many (terminal runs still listed in a dead owner's set included: the next pass disowns them)."""
    oldest_age_s: float
    """Now minus the last projected event time of the oldest waiting non-terminal run, seconds (0: none)."""
    instances: tuple[str, ...]
    """The dead instances that own them."""


def recovery_backlog(redis_client: Any, prefix: str, partitions: int, *, now_ms: int | None = None) -> Backlog:
    """The recovery backlog of ``prefix`` as Redis shows it now (leases, owned sets, projected states).

    Args:
        redis_client: a redis-py client.
        prefix: the topic prefix (key prefix).
        partitions: the events topic's partition count (to find each run's projected state).
        now_ms: the clock, ms since the epoch (default now).

    Raises:
        redis.RedisError: Redis unreachable.
    """
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    instances = Instances(redis_client, prefix)
    stale = instances.stale()
    store = ProjectionStore(redis_client, prefix)
    waiting = {r for view in stale for r in view.owned}
    live = store.live(range(partitions))  # runs the journal shows in flight: a dead owner counts, listed or not
    alive = instances.alive_many({owner for run_id, (_e, owner) in live.items() if run_id not in waiting})
    orphans = {run_id for run_id, (_e, owner) in live.items() if run_id not in waiting and not alive.get(owner, True)}
    runs = sorted(waiting | orphans)
    dead = {v.producer_id for v in stale} | {live[r][1] for r in orphans}
    by_partition: dict[int, list[str]] = {}
    for run_id in runs:
        by_partition.setdefault(partition_for(run_id, partitions), []).append(run_id)
    oldest = 0.0
    for partition, ids in by_partition.items():
        for state in store.load(partition, ids).values():
            if not state.terminal and state.updated_at_ms is not None:
                oldest = max(oldest, (now_ms - state.updated_at_ms) / 1000)
    return Backlog(runs=len(runs), oldest_age_s=oldest, instances=tuple(sorted(dead)))


class RecoveryMetrics:
    """The recovery sweep's families; :meth:`serve` exposes them on ``/metrics``.

    Args:
        registry: where to register (default: a new one with the process collector).
    """

    def __init__(self, registry: Any = None) -> None:
        self.registry = registry if registry is not None else m.new_registry("recovery")
        r = self.registry
        self.passes = m.counter(r, "runjournal_recovery_passes", "Recovery passes, by result (ok, error)", ["result"])
        self.pass_seconds = m.histogram(r, "runjournal_recovery_pass_duration_seconds",
                                        "One recovery pass: fence, end offsets, fold tails, classify, resume, seconds",
                                        buckets=m.LAG_BUCKETS_S)
        self.last_pass = m.gauge(r, "runjournal_recovery_last_pass_timestamp_seconds",
                                 "Unix time the last pass ended, seconds")
        self.errors = m.counter(r, "runjournal_recovery_errors", "Failed passes, by cause (error class)", ["cause"])
        self.runs = m.counter(r, "runjournal_recovery_runs",
                              "Runs handled, by action (resumed, deferred, parked, finished, no_facts, …)", ["action"])
        self.calls = m.counter(r, "runjournal_recovery_calls",
                               "Tool calls classified, by outcome class (COMMITTED, OUTCOME_UNKNOWN, NOT_STARTED, "
                               "FAILED …)", ["outcome"])
        self.fences = m.counter(r, "runjournal_recovery_fences", "Dead instances fenced at the broker")
        self.stale_runs = m.gauge(r, "runjournal_recovery_stale_runs",
                                  "Runs owned by instances without a lease after the last pass (waiting)")
        self.lag_seconds = m.gauge(r, "runjournal_recovery_lag_seconds",
                                   "Now minus the last event time of the oldest run waiting for recovery (0: none), "
                                   "seconds")
        self.server: m.MetricsServer | None = None

    def observe_pass(self, report: dict[str, Any], duration_s: float) -> None:
        """Count one finished pass from its report (``RecoveryReport.as_dict()``)."""
        self.passes.labels("ok").inc()
        self.pass_seconds.observe(duration_s)
        self.last_pass.set(time.time())
        for action, n in report.get("actions", {}).items():
            self.runs.labels(action).inc(n)
        for outcome, n in report.get("calls", {}).items():
            self.calls.labels(outcome).inc(n)
        self.fences.inc(len(report.get("fenced", [])))

    def observe_failure(self, exc: BaseException, duration_s: float) -> None:
        """Count one failed pass."""
        self.passes.labels("error").inc()
        self.errors.labels(type(exc).__name__).inc()
        self.pass_seconds.observe(duration_s)
        self.last_pass.set(time.time())

    def observe_backlog(self, backlog: Backlog) -> None:
        """Export what is still waiting for recovery."""
        self.stale_runs.set(backlog.runs)
        self.lag_seconds.set(backlog.oldest_age_s)

    def serve(self, port: int, *, addr: str = "0.0.0.0", redis_client: Any = None,
              prefix: str | None = None) -> m.MetricsServer:
        """Expose ``/metrics`` on ``addr:port`` (announced for the console when given Redis).
        Raises PortInUseError (the port is taken)."""
        self.server = m.serve(self.registry, port, service="recovery", addr=addr, redis_client=redis_client,
                              prefix=prefix)
        return self.server

"""Prometheus metrics of the projector, in base units, on a registry of its own (``runjournal.core.metrics``).

Its own registry (with the process collector), so several projectors can live in one test process. Lag is
exported two ways: ``runjournal_projector_lag_records`` (per partition: end offset minus position) and
``runjournal_projector_lag_seconds`` (now minus the CreateTime of the oldest record of the last poll; 0 after
an empty poll), plus the distribution ``runjournal_projector_event_age_seconds``. These replace the former
``runjournal_projector_lag_ms`` histogram (milliseconds; docs/operations/metrics.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import redis
from confluent_kafka import Message

from runjournal.core import metrics as m
from runjournal.model.reducer import CallStatus

__all__ = ["ProjectorMetrics", "count_outcomes", "poll_lag_ms", "store_lag_sample"]

_NO_RECORDS: Mapping[str, Any] = {}
_timestamp = Message.timestamp


class ProjectorMetrics:
    """The projector's families; :meth:`serve` exposes them on ``/metrics``.

    Args:
        registry: where to register (default: a new one with the process collector).
    """

    def __init__(self, registry: Any = None) -> None:
        self.registry = registry if registry is not None else m.new_registry("projector")
        r = self.registry
        self.events = m.counter(r, "runjournal_projector_events", "Records handled (no-ops included)", ["partition"])
        self.batches = m.counter(r, "runjournal_projector_batches", "Partition batches written to Redis")
        self.batch_seconds = m.histogram(r, "runjournal_projector_batch_apply_seconds",
                                         "Decode + fold of one partition batch and the hand-off of its write (the "
                                         "wait for the write before it included), seconds")
        self.commit_seconds = m.histogram(r, "runjournal_projector_commit_seconds",
                                          "The atomic Redis write of a batch's states and the partition's applied "
                                          "offset (the projection's commit; on the write-behind thread), seconds")
        self.lag = m.gauge(r, "runjournal_projector_lag_records", "End offset minus position, per partition",
                           ["partition"])
        self.lag_seconds = m.gauge(r, "runjournal_projector_lag_seconds",
                                   "Now minus the CreateTime of the oldest record of the last poll (0 after an "
                                   "empty poll), seconds")
        self.event_age = m.histogram(r, "runjournal_projector_event_age_seconds",
                                     "Now minus the oldest record's CreateTime, per non-empty poll, seconds",
                                     buckets=m.LAG_BUCKETS_S)
        self.parked = m.counter(r, "runjournal_projector_runs_parked", "Runs parked on a seq gap")
        self.blocked = m.counter(r, "runjournal_projector_runs_blocked", "Runs blocked by an undecodable event")
        self.fenced = m.counter(r, "runjournal_projector_stale_epoch_rejected",
                                "Control-flow events rejected from a lower epoch (epoch fencing)")
        self.dead_lettered = m.counter(r, "runjournal_projector_dead_letters",
                                       "Records copied to the events DLQ, by cause (error class)", ["cause"])
        self.erased = m.counter(r, "runjournal_projector_runs_erased", "Runs erased by tombstones")
        self.conflicts = m.counter(r, "runjournal_projector_conflicts",
                                   "Batches refused by Redis (stale view: reloaded and re-seeked)")
        self.outcomes = m.counter(r, "runjournal_projector_call_outcomes",
                                  "Tool calls reaching an outcome class in the projection (committed, failed, "
                                  "outcome_unknown, reconciled)", ["outcome"])
        self.server: m.MetricsServer | None = None

    def serve(self, port: int, *, addr: str = "0.0.0.0", redis_client: Any = None,
              prefix: str | None = None) -> m.MetricsServer:
        """Expose ``/metrics`` on ``addr:port`` in a daemon thread (announced for the console when given Redis).

        Raises:
            PortInUseError: the port is taken (runjournal.core.errors).
        """
        self.server = m.serve(self.registry, port, service="projector", addr=addr, redis_client=redis_client,
                              prefix=prefix)
        return self.server


def count_outcomes(metrics: ProjectorMetrics, before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
    """Count what one batch changed in its runs (``before[run_id]`` → ``after[run_id]``, ``RunState`` or None): each
    execution record entering a new status, as an outcome class, and stale-epoch rejections. A run absent from
    ``before`` (or None there) is new; None in ``after`` (erased) counts nothing.

    Records the reducer did not touch are the same objects (copy-on-write), so this costs one identity check per
    unchanged record (none for a run whose records mapping is unchanged); each metric child is incremented once
    per batch with the batch's total.
    """
    outcomes: dict[str, int] = {}
    fenced = 0
    for run_id, new in after.items():
        if new is None:
            continue
        old = before.get(run_id)
        old_records = old.records if old is not None else _NO_RECORDS
        if new.records is not old_records:
            for call_id, record in new.records.items():
                previous = old_records.get(call_id)
                if previous is record or (previous is not None and previous.status is record.status):
                    continue
                if record.status is not CallStatus.INTENDED:
                    outcomes[record.status.value] = outcomes.get(record.status.value, 0) + 1
        fenced += max(0, new.rejected_stale_epoch - (old.rejected_stale_epoch if old is not None else 0))
    for status, n in outcomes.items():
        metrics.outcomes.labels(status.lower()).inc(n)
    if fenced:
        metrics.fenced.inc(fenced)


def poll_lag_ms(metrics: ProjectorMetrics, msgs: list[Any]) -> int | None:
    """Lag of one poll: now minus the oldest record's CreateTime, ms (None: no record has one), observed in
    ``metrics`` (``runjournal_projector_event_age_seconds``, ``runjournal_projector_lag_seconds``)."""
    oldest = min((t for _kind, t in map(_timestamp, msgs) if t > 0), default=0)  # an error has none (-1)
    if not oldest:
        return None
    lag_ms = max(0, int(time.time() * 1000) - oldest)
    metrics.event_age.observe(lag_ms / 1000)
    metrics.lag_seconds.set(lag_ms / 1000)
    return lag_ms


def store_lag_sample(client: Any, key: str, lag_ms: int, log: logging.Logger) -> None:
    """Push ``"<unix ms now>:<lag ms>"`` to the Redis list ``key`` (newest first, the last 10,000 kept) for dashboards
    and the demo. A Redis failure is logged and passed over: a dashboard sample is never worth a wait."""
    pipe = client.pipeline(transaction=False)
    pipe.lpush(key, f"{int(time.time() * 1000)}:{lag_ms}")
    pipe.ltrim(key, 0, 9999)
    try:
        pipe.execute()
    except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:  # the cluster's own: not RedisErrors
        log.warning("lag sample not stored", extra={"error": str(exc)})

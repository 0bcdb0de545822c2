"""Projector, memory and recovery lag as the services export it: their ``/metrics``, scraped by the console.

A service that stopped announcing without withdrawing (killed) stays on the page as missing, with since when, for
:data:`MISSING_SHOWN_S`; so does one that stopped on an error (fenced, a dependency away past its budget), as
stopped, with since when and why; one that stopped cleanly (SIGTERM, Ctrl-C) withdrew its entry.

Where the endpoints come from: the services started with ``--metrics-port`` announce themselves in Redis
(``runjournal.core.metrics.announced_endpoints``), plus any ``--scrape URL`` given to ``runjournal console``.
Each endpoint is fetched with a short timeout and parsed with prometheus-client's own text parser; results are
kept for ``ttl_s`` so pages stay fast. The recovery backlog (runs whose owner lost its lease) is also read
directly from Redis, so it shows even when no recovery sweep exports metrics.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from runjournal.consumers.recovery.metrics import Backlog, recovery_backlog
from runjournal.core.metrics import announced_endpoints

__all__ = ["MISSING_SHOWN_S", "Endpoint", "LagBoard", "LagView"]

MISSING_SHOWN_S = 3600.0
"""How long a service that stopped announcing without withdrawing is shown as missing, or one that stopped on an error
as stopped (s); older entries are not."""

#: The figures shown per service: (metric, how to fold its samples, label on the page, unit).
FIGURES: dict[str, list[tuple[str, str, str, str]]] = {
    "projector": [("runjournal_projector_lag_seconds", "max", "lag", "s"),
                  ("runjournal_projector_lag_records", "sum", "records behind", ""),
                  ("runjournal_projector_events_total", "sum", "events handled", "")],
    "memory": [("runjournal_memory_lag_seconds", "max", "lag", "s"),
               ("runjournal_memory_lag_records", "sum", "records behind", ""),
               ("runjournal_memory_items_written_total", "sum", "items written", "")],
    "recovery": [("runjournal_recovery_lag_seconds", "max", "lag (oldest waiting run)", "s"),
                 ("runjournal_recovery_stale_runs", "sum", "runs waiting", ""),
                 ("runjournal_recovery_last_pass_timestamp_seconds", "age", "last pass", "s ago"),
                 ("runjournal_recovery_passes_total", "sum", "passes", "")],
}


@dataclass
class Endpoint:
    """One scraped ``/metrics`` endpoint."""

    service: str
    """``projector``, ``memory``, ``recovery`` … (from the announcement; ``scraped`` for a ``--scrape`` URL
    until its build info names it)."""
    url: str
    """Where it was scraped."""
    up: bool = False
    """It answered with parsable metrics."""
    error: str | None = None
    """Why not, when not."""
    figures: list[tuple[str, float | None, str]] = field(default_factory=list)
    """``(label, value, unit)`` of the service's :data:`FIGURES`."""
    missing_s: float | None = None
    """Seconds since a service that stopped announcing without withdrawing last did (killed, or cut off from
    Redis): shown as missing, not scraped; None for a service that announces."""
    stopped: str | None = None
    """Why a service that stopped on an error stopped (the error, one line): shown as stopped, not scraped; None
    otherwise."""
    stopped_s: float | None = None
    """Seconds since it stopped on that error."""


@dataclass
class LagView:
    """The lag panel: every endpoint's figures and the recovery backlog."""

    endpoints: list[Endpoint]
    backlog: Backlog | None
    backlog_error: str | None
    at: float
    """Unix time of the scrape, seconds."""

    def figure(self, service: str, label: str) -> float | None:
        """The first value of ``label`` among ``service``'s endpoints that are up (None: none)."""
        for ep in self.endpoints:
            if ep.service == service and ep.up:
                for name, value, _unit in ep.figures:
                    if name == label:
                        return value
        return None


def _fold(samples: list[Any], how: str, now: float) -> float | None:
    values = [s.value for s in samples]
    if not values:
        return None
    if how == "max":
        return max(values)
    if how == "age":
        return max(0.0, now - max(values))
    return sum(values)


def _stopped(entry: dict[str, Any]) -> Endpoint:
    """The row of a service that stopped on an error: since when (UTC, and how long ago) and why."""
    since = datetime.fromtimestamp(float(entry["stopped_at_ms"]) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
    return Endpoint(service=str(entry["service"]), url=str(entry["url"]), stopped=str(entry["stopped"]),
                    stopped_s=float(entry["stopped_s"]),
                    error=f"stopped since {since} UTC ({entry['stopped_s']:.0f} s ago), pid {entry.get('pid')} on "
                          f"{entry.get('host')}: {entry['stopped']}")


def _service_of(families: dict[str, list[Any]], given: str) -> str:
    for sample in families.get("runjournal_build_info", []):
        return str(sample.labels.get("service", given))
    return given


class LagBoard:
    """Scrapes the endpoints of one prefix, caching the view for ``ttl_s`` seconds.

    Args:
        redis_client: to read the announcements and the backlog.
        prefix: the topic prefix.
        partitions: a callable returning the events topic's partition count (for the backlog).
        extra_urls: ``--scrape`` URLs.
        timeout_s: per-endpoint timeout, seconds (default 1).
        ttl_s: cache lifetime, seconds (default 2).
        on_error: called with the service name when a scrape fails (the console's error counter).
    """

    def __init__(self, redis_client: Any, prefix: str, partitions: Any, *, extra_urls: tuple[str, ...] = (),
                 timeout_s: float = 1.0, ttl_s: float = 2.0, on_error: Any = None) -> None:
        self.redis = redis_client
        self.prefix = prefix
        self.partitions = partitions
        self.extra_urls = extra_urls
        self.ttl_s = ttl_s
        self.on_error = on_error
        self._http = httpx.Client(timeout=timeout_s)
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="console-scrape")
        self._lock = threading.Lock()
        self._cached: LagView | None = None

    def view(self) -> LagView:
        """The current view (scraped now if the cached one is older than ``ttl_s``)."""
        with self._lock:
            if self._cached is not None and time.time() - self._cached.at < self.ttl_s:
                return self._cached
            announced = announced_endpoints(self.redis, self.prefix, missing_for_s=MISSING_SHOWN_S)
            targets = [(str(e["service"]), str(e["url"])) for e in announced if not e["missing"] and not e["stopped"]]
            targets += [("scraped", url) for url in self.extra_urls if url not in {u for _s, u in targets}]
            endpoints = list(self._pool.map(lambda t: self._scrape(*t), targets))
            endpoints += [Endpoint(service=str(e["service"]), url=str(e["url"]), missing_s=float(e["age_s"]),
                                   error=f"missing: last announced {e['age_s']:.0f} s ago by pid {e.get('pid')} on "
                                         f"{e.get('host')} — it stopped without withdrawing (killed, or cut off from "
                                         "Redis)") for e in announced if e["missing"]]
            endpoints += [_stopped(e) for e in announced if e["stopped"]]
            try:
                backlog, error = recovery_backlog(self.redis, self.prefix, self.partitions()), None
            except Exception as exc:  # noqa: BLE001 - shown on the page instead
                backlog, error = None, f"{type(exc).__name__}: {exc}"
            self._cached = LagView(endpoints=endpoints, backlog=backlog, backlog_error=error, at=time.time())
            return self._cached

    def _scrape(self, service: str, url: str) -> Endpoint:
        out = Endpoint(service=service, url=url)
        try:
            res = self._http.get(url)
            res.raise_for_status()
            families: dict[str, list[Any]] = {}
            for family in text_string_to_metric_families(res.text):
                for sample in family.samples:
                    families.setdefault(sample.name, []).append(sample)
        except (httpx.HTTPError, ValueError) as exc:
            out.error = f"{type(exc).__name__}: {exc}"
            if self.on_error is not None:
                self.on_error(service)
            return out
        out.up = True
        out.service = _service_of(families, service)
        now = time.time()
        out.figures = [(label, _fold(families.get(name, []), how, now), unit)
                       for name, how, label, unit in FIGURES.get(out.service, [])]
        return out

    def close(self) -> None:
        """Close the HTTP client and the scrape threads."""
        self._pool.shutdown(wait=False)
        self._http.close()

"""The one metrics module of every runjournal process: Prometheus registries, families, ``/metrics`` endpoints.

Every long-running process (projector, memory extractor, recovery sweep, console) and, when enabled, the
journal inside an agent export Prometheus metrics through this module, so names, units and the process
collector are the same everywhere:

* **Names** are ``runjournal_<service>_<what>_<base unit>``: ``_seconds``, ``_bytes``, ``_records``; a counter
  is declared without ``_total`` and exposed with it (prometheus-client appends it). Milliseconds and other
  scaled units are refused here (:func:`check_name`), and ``promtool check metrics`` runs on every service's
  output in the tests (``tests/core/test_metrics.py``).
* **Registries** are per process (or per service object), never the global default one, and carry the process
  collector (``process_cpu_seconds_total``, ``process_resident_memory_bytes`` …), the platform and the GC
  collector, and ``runjournal_build_info{service, version}`` (:func:`new_registry`).
* **Families are get-or-create** (:func:`counter`, :func:`gauge`, :func:`histogram`): two callers naming the
  same family in one registry share it (e.g. a failure policy and the service counting retries, or two
  journals in one host application's registry), and a second declaration with another type or other labels
  raises ``ValueError`` instead of exporting two meanings under one name.
* **Endpoints**: :func:`serve` exposes a registry on ``/metrics`` in a daemon thread; with a Redis client it
  also announces itself under ``rj:{prefix}:metrics:endpoints`` (refreshed every few seconds; removed when the
  service stops cleanly, turned into a "stopped since …, why" marker when it stops on an error) so
  ``runjournal console`` can find and scrape the services of a prefix (:func:`announced_endpoints`).

prometheus-client is imported lazily, inside these functions: the core install (an agent embedding the
journal) does not need it until metrics are enabled.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import threading
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["LATENCY_BUCKETS_S", "LAG_BUCKETS_S", "MetricsServer", "announced_endpoints", "check_name", "counter",
           "endpoints_key", "gauge", "histogram", "new_registry", "serve", "stop_reason"]

#: Buckets of latency histograms (batch apply, commit, publish), seconds: 0.5 ms … 10 s.
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Buckets of lag histograms (event age when handled, recovery pass), seconds: 5 ms … 10 min.
LAG_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0)

_NAME = re.compile(r"runjournal_[a-z0-9_]+")
_SCALED_UNITS = re.compile(r"_(ms|msec|millis|milliseconds|us|microseconds|ns|nanoseconds|minutes|hours|days"
                           r"|kb|kib|mb|mib|gb|gib|kilobytes|megabytes|percent)(_|$)")
_ANNOUNCE_EVERY_S = 5.0
_families: weakref.WeakKeyDictionary[Any, dict[str, tuple[str, tuple[str, ...], Any]]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def check_name(name: str) -> str:
    """Refuse a family name that is not ``runjournal_…`` snake case in base units.

    Returns:
        ``name``.

    Raises:
        ValueError: another prefix, upper case, a scaled unit (``_ms``, ``_kb`` …) or a ``_total`` suffix
            (counters get it on exposition).
    """
    if not _NAME.fullmatch(name):
        raise ValueError(f"metric {name!r}: names are runjournal_<service>_<what>_<unit>, lower snake case")
    if _SCALED_UNITS.search(name):
        raise ValueError(f"metric {name!r}: use base units (_seconds, _bytes), not scaled ones")
    if name.endswith("_total"):
        raise ValueError(f"metric {name!r}: declare counters without _total (it is appended on exposition)")
    return name


def new_registry(service: str, *, process: bool = True) -> CollectorRegistry:
    """A fresh registry for one service, with the process, platform and GC collectors and build info.

    Args:
        service: ``projector``, ``memory``, ``recovery``, ``console`` or ``journal`` (the build-info label).
        process: add the process/platform/GC collectors (False for a registry that is merged into a host
            application's, which has its own).

    Raises:
        ImportError: prometheus-client is not installed (``pip install 'runjournal[cli]'``).
    """
    from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

    registry = CollectorRegistry()
    if process:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    info = gauge(registry, "runjournal_build_info", "runjournal version and service of this process (always 1)",
                 ("service", "version"))
    info.labels(service, _version()).set(1)
    return registry


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("runjournal")
    except PackageNotFoundError:
        return "0.0.0+unknown"


def _family(kind: str, registry: CollectorRegistry, name: str, documentation: str, labelnames: Sequence[str],
            build: Any) -> Any:
    labels = tuple(labelnames)
    with _lock:
        known = _families.setdefault(registry, {})
        if name in known:
            have_kind, have_labels, family = known[name]
            if (have_kind, have_labels) != (kind, labels):
                raise ValueError(f"metric {name!r} is already a {have_kind}{list(have_labels)} in this registry, "
                                 f"not a {kind}{list(labels)}")
            return family
        family = build(check_name(name), documentation, labels)
        known[name] = (kind, labels, family)
        return family


def counter(registry: CollectorRegistry, name: str, documentation: str, labelnames: Sequence[str] = ()) -> Counter:
    """The counter ``name`` of ``registry`` (created on first use; exposed as ``name_total``).

    Raises:
        ValueError: a bad name (:func:`check_name`), or ``name`` exists with another type or labels.
    """
    from prometheus_client import Counter

    return _family("counter", registry, name, documentation, labelnames,  # type: ignore[no-any-return]
                   lambda n, d, lab: Counter(n, d, lab, registry=registry))


def gauge(registry: CollectorRegistry, name: str, documentation: str, labelnames: Sequence[str] = ()) -> Gauge:
    """The gauge ``name`` of ``registry`` (created on first use). Raises ValueError as :func:`counter`."""
    from prometheus_client import Gauge

    return _family("gauge", registry, name, documentation, labelnames,  # type: ignore[no-any-return]
                   lambda n, d, lab: Gauge(n, d, lab, registry=registry))


def histogram(registry: CollectorRegistry, name: str, documentation: str, labelnames: Sequence[str] = (), *,
              buckets: Sequence[float] = LATENCY_BUCKETS_S) -> Histogram:
    """The histogram ``name`` of ``registry`` (created on first use); ``name`` ends in its unit (``_seconds``).

    Raises:
        ValueError: as :func:`counter`, or the name does not end in ``_seconds`` / ``_bytes`` / ``_records``.
    """
    from prometheus_client import Histogram

    if not name.endswith(("_seconds", "_bytes", "_records")):
        raise ValueError(f"histogram {name!r} must end in its base unit (_seconds, _bytes, _records)")
    return _family("histogram", registry, name, documentation, labelnames,  # type: ignore[no-any-return]
                   lambda n, d, lab: Histogram(n, d, lab, registry=registry, buckets=tuple(buckets)))


def endpoints_key(prefix: str) -> str:
    """``rj:{prefix}:metrics:endpoints``: Redis hash of announced ``/metrics`` endpoints (field → JSON)."""
    from runjournal.core.redis_keys import RedisKeys

    return RedisKeys(prefix).metrics_endpoints()


class MetricsServer:
    """A registry served on ``/metrics`` (from :func:`serve`); :meth:`close` stops it and withdraws it.

    Attributes:
        port: the port it listens on (the one asked for, or the one the OS gave for port 0).
        addr: the bind address.
        service: the service it exports.
    """

    def __init__(self, server: Any, *, addr: str, service: str, redis_client: Any = None,
                 prefix: str | None = None) -> None:
        self.port = int(server.server_port)
        self.addr = addr
        self.service = service
        self._server = server
        self._stop = threading.Event()
        self._lock = threading.Lock()  # an announcement never lands after the stop's withdrawal or marker
        self._redis: Any = redis_client if prefix is not None else None
        self._prefix = prefix or ""
        self._field = f"{service}@{socket.gethostname()}:{os.getpid()}:{self.port}"
        if self._redis is not None:
            self._announce()
            threading.Thread(target=self._keep_announcing, name=f"metrics-announce-{service}", daemon=True).start()

    @property
    def url(self) -> str:
        """``http://<host>:<port>/metrics`` (loopback when bound to every address)."""
        host = "127.0.0.1" if self.addr in ("0.0.0.0", "", "::") else self.addr
        return f"http://{host}:{self.port}/metrics"

    def _entry(self, **extra: Any) -> str:
        return json.dumps({"service": self.service, "url": self.url, "host": socket.gethostname(),
                           "pid": os.getpid(), "seen_at_ms": int(time.time() * 1000), **extra})

    def _announce(self) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            with contextlib.suppress(Exception):  # a missed refresh only ages the entry; metrics are still served
                self._redis.hset(endpoints_key(self._prefix), self._field, self._entry())

    def _keep_announcing(self) -> None:
        while not self._stop.wait(_ANNOUNCE_EVERY_S):
            self._announce()

    def close(self, error: BaseException | None = None) -> None:
        """Stop serving. A clean stop (``error`` None, Ctrl-C, an exit with status 0) removes the announcement; a
        stop on an error (fenced, a dependency away past its budget, any exception leaving the service) replaces it
        with a marker ``stopped_at_ms`` + ``stopped`` (the error, one line), which the console shows as "stopped
        since …, why" for as long as it shows a missing service (:func:`announced_endpoints`). Best effort (an
        unremoved entry ages out); idempotent.

        Args:
            error: the exception the service is leaving with, if any; a ``SystemExit`` or a CLI exit carrying
                another exception as its cause is read through to that cause.
        """
        why = stop_reason(error)
        with self._lock:
            already = self._stop.is_set()
            self._stop.set()
            if self._redis is not None and not already:
                with contextlib.suppress(Exception):
                    if why is None:
                        self._redis.hdel(endpoints_key(self._prefix), self._field)
                    else:
                        self._redis.hset(endpoints_key(self._prefix), self._field,
                                         self._entry(stopped_at_ms=int(time.time() * 1000), stopped=why))
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def stop_reason(error: BaseException | None) -> str | None:
    """Why a service stopped, as the one line :meth:`MetricsServer.close` records; None for a clean stop (no error,
    ``KeyboardInterrupt``, ``SystemExit`` or a CLI exit with status 0). An exit that carries another exception as its
    cause (the ``typer.Exit`` a command raises after reporting an error) is read through to the cause."""
    for _ in range(5):
        if error is None or isinstance(error, KeyboardInterrupt):
            return None
        code = error.code if isinstance(error, SystemExit) else getattr(error, "exit_code", _NOT_AN_EXIT)
        if code is not _NOT_AN_EXIT:  # SystemExit, click's (typer's) Exit
            if error.__cause__ is not None:
                error = error.__cause__
                continue
            return None if code in (0, None) else f"exited with status {code}"
        text = " ".join(str(error).split())
        line = f"{type(error).__name__}: {text}" if text else type(error).__name__
        return line if len(line) <= _REASON_CHARS else line[:_REASON_CHARS - 1] + "…"
    return None


_NOT_AN_EXIT = object()
#: The longest stop reason recorded, characters.
_REASON_CHARS = 500


def serve(registry: CollectorRegistry, port: int, *, service: str, addr: str = "0.0.0.0",
          redis_client: Any = None, prefix: str | None = None) -> MetricsServer:
    """Serve ``registry`` on ``http://addr:port/metrics`` in a daemon thread; announce it when given Redis.

    Args:
        registry: what to export.
        port: TCP port (0: any free one; see ``MetricsServer.port``).
        service: the service's name (in the announcement).
        addr: bind address (default every interface, as Prometheus scrapes from elsewhere).
        redis_client, prefix: announce the endpoint under :func:`endpoints_key` for the console, refreshed
            every 5 s by a daemon thread (entries not refreshed for 20 s are ignored by readers).

    Raises:
        PortInUseError: the port is taken (or not allowed); the message names ``--metrics-port`` and the fix.
    """
    from prometheus_client import start_http_server

    from runjournal.core.errors import bind_error

    try:
        server, _thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        raise bind_error(exc, port, addr, "--metrics-port") from exc
    return MetricsServer(server, addr=addr, service=service, redis_client=redis_client, prefix=prefix)


def announced_endpoints(redis_client: Any, prefix: str, *, max_age_s: float = 20.0,
                        missing_for_s: float = 0.0) -> list[dict[str, Any]]:
    """The ``/metrics`` endpoints announced for ``prefix`` and refreshed within ``max_age_s`` seconds — and, with
    ``missing_for_s``, for that many seconds after they went: those that stopped refreshing without withdrawing (a
    service killed, or cut off from Redis), marked ``"missing": True`` with their ``"age_s"``, and those that stopped
    on an error (fenced, a dependency away past its budget: :meth:`MetricsServer.close`), with ``"stopped"`` (why)
    and ``"stopped_s"``. The console shows both instead of letting them vanish. A service that stops cleanly
    withdraws its entry.

    Returns:
        ``[{"service", "url", "host", "pid", "seen_at_ms", "missing", "age_s", "stopped", "stopped_s"}]`` sorted by
        service then url (``stopped`` and ``stopped_s`` None unless it stopped on an error; ``missing`` False then);
        an endpoint on this host is given with a loopback URL. ``age_s`` and ``stopped_s``: seconds since its last
        refresh or its stop by this host's clock against the announcer's (display only: nothing is decided from it).
    """
    now_ms = time.time() * 1000
    here = socket.gethostname()
    out = []
    for raw in redis_client.hvals(endpoints_key(prefix)):
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        age_s = max(0.0, (now_ms - float(entry.get("seen_at_ms", 0))) / 1000)
        stopped_at = entry.get("stopped_at_ms")
        stopped_s = None if stopped_at is None else max(0.0, (now_ms - float(stopped_at)) / 1000)
        entry["age_s"], entry["missing"] = age_s, stopped_s is None and age_s > max_age_s
        entry["stopped"] = (entry.get("stopped") or "stopped on an error") if stopped_s is not None else None
        entry["stopped_s"] = stopped_s
        gone_s = stopped_s if stopped_s is not None else (age_s if entry["missing"] else None)
        if gone_s is not None and not gone_s < missing_for_s:
            continue
        if entry.get("host") != here and "://127.0.0.1:" in str(entry.get("url")):
            entry["url"] = str(entry["url"]).replace("127.0.0.1", str(entry.get("host")), 1)
        out.append(entry)
    return sorted(out, key=lambda e: (str(e.get("service")), str(e.get("url"))))

"""The one failure policy of the long-lived consumers: projector, recovery job, memory extractor.

docs/design/protocol.md § Decisions after the first build, *One failure policy*: every failure of a dependency
is classified once, here, by what it means — never by its exception class alone — and each service reacts the
same way to the same kind:

* ``transient`` — waiting can fix it: schema registry unreachable; Redis refused, reset, timed out, its pool
  exhausted, ``LOADING``, ``READONLY`` (failover), ``MASTERDOWN``, ``OOM``, a script ``BUSY``, and a Redis Cluster
  changing shape (``CLUSTERDOWN``, ``TRYAGAIN``, ``MOVED``/``ASK`` escaping, a slot not covered, redis-py's own
  retries exhausted: ``ClusterError`` "TTL exhausted"); a broker, leader or coordinator away or moving, a
  rebalance, a request timed out, the local produce queue full; Qdrant unreachable / 5xx / 429; the archive's object
  store not answering (``ObjectStoreUnavailableError``); the key service not answering (``KeyUnavailableError``,
  decision 0059: content is never read or written without its key, so waiting loses nothing). The Redis and
  Kafka clients' errors are read by :mod:`runjournal.core.dependency_errors`, the one table of both. Wait with
  capped exponential backoff (tenacity) and try the same work again — nothing moves past it; each wait is a
  WARNING log line and a metric (``runjournal_dependency_retries_total``, ``runjournal_dependency_waiting``); after
  ``max_wait_s`` of one outage: :class:`DependencyUnavailableError` (the process exits non-zero naming
  the dependency, a supervisor restarts it).
* ``record`` — an undecodable record (:class:`~runjournal.schemas.errors.SchemaError` other than a
  registry transport failure). Quarantine the record with its offset (DLQ, BLOCKED run) and go on.
* ``fatal`` — fenced (producer or static group member), unauthorised / unauthenticated (a Redis login, ACL or TLS
  handshake refused, wherever in the chain of causes), topic gone, a setting the server refuses, any error
  librdkafka marks fatal, a bug (a cross-slot script, a call the client refuses). Stop:
  :class:`FatalDependencyError` naming the cause and, where there is one, the command or setting that repairs it
  (a bug is raised as it is: its own traceback is clearer).

A registry transport failure is never a bad record: the bytes are fine, the registry is away.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception, wait_exponential

from runjournal.core import dependency_errors
from runjournal.core.errors import RunjournalError
from runjournal.schemas.errors import RegistryError, SchemaError

if TYPE_CHECKING:  # prometheus-client is the [cli] extra's: an agent continuing a run (core install) runs a policy
    from confluent_kafka import KafkaError
    from prometheus_client import CollectorRegistry

__all__ = ["TRANSIENT", "RECORD", "FATAL", "DependencyUnavailableError", "FailurePolicy", "FatalDependencyError",
           "Verdict", "classify", "kafka_error_verdict", "stops_consumer"]

T = TypeVar("T")
TRANSIENT, RECORD, FATAL = dependency_errors.TRANSIENT, "record", dependency_errors.FATAL


class FatalDependencyError(RunjournalError):
    """A failure no waiting can fix (fenced, unauthorised, topic gone, a fatal client error): the service stops.

    Attributes:
        dependency: ``kafka``, ``redis``, ``registry``, ``qdrant`` or ``runjournal``.
        cause: the classified cause, with its repair when there is one.
    """

    def __init__(self, dependency: str, cause: str) -> None:
        self.dependency = dependency
        self.cause = cause
        super().__init__(f"{dependency}: {cause}")


class DependencyUnavailableError(RunjournalError):
    """A transient failure lasted longer than the policy's ``max_wait_s``: the service stops (non-zero exit) so
    a supervisor restarts it; nothing was skipped (offsets did not move past the work).

    Attributes:
        dependency: which dependency stayed away.
        waited_s: how long it was waited for, seconds.
    """

    def __init__(self, dependency: str, cause: str, waited_s: float) -> None:
        self.dependency = dependency
        self.waited_s = waited_s
        super().__init__(f"{dependency} unavailable for {waited_s:.0f} s, giving up: {cause}")


@dataclass(frozen=True)
class Verdict:
    """How the policy classifies one exception."""

    kind: str
    """``transient`` (wait and retry), ``record`` (quarantine the record) or ``fatal`` (stop)."""
    dependency: str
    """``registry``, ``redis``, ``kafka``, ``qdrant``, ``object_store``, ``kms``, ``record`` or ``runjournal``."""
    cause: str
    """One line naming the cause (and, for fatal ones, the repair when known)."""


def stops_consumer(err: KafkaError) -> bool:
    """True for an error a consumer's ``error_cb`` must stop on (fatal, fenced, unauthorised, unauthenticated, topic
    gone: :func:`runjournal.core.dependency_errors.kafka_stops`); the rest (a broker down, a coordinator moving …)
    librdkafka retries by itself. Never raises."""
    return dependency_errors.kafka_stops(err)


def kafka_error_verdict(err: KafkaError) -> Verdict:
    """Classify one librdkafka error by what it means: the fatal flag, then its code, unknown codes by
    ``retriable()`` (:func:`runjournal.core.dependency_errors.kafka_meaning`). Never raises."""
    return Verdict(*dependency_errors.kafka_meaning(err))


def _is(exc: BaseException, module: str, name: str) -> bool:
    """``isinstance(exc, module.name)`` without importing ``module``: an exception of a module nobody imported
    cannot be one of its classes (the producers package is heavy to import, and an agent's policy needs none of
    it)."""
    cls = getattr(sys.modules.get(module), name, None)
    return isinstance(cls, type) and isinstance(exc, cls)


def classify(exc: BaseException) -> Verdict:
    """Classify ``exc`` by what it means (the module table; an error of the Redis or Kafka client by
    :mod:`runjournal.core.dependency_errors`, whatever its class). Never raises."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, (FatalDependencyError, DependencyUnavailableError)):
        return Verdict(FATAL, getattr(exc, "dependency", "runjournal"), str(exc))
    if isinstance(exc, RegistryError):
        return Verdict(TRANSIENT, "registry", text)
    if isinstance(exc, SchemaError):
        return Verdict(RECORD, "record", text)
    found = dependency_errors.meaning(exc)
    if found is not None:
        return Verdict(*found)
    if _is(exc, "runjournal.consumers.runtime.dlq", "DeadLetterError"):
        # the DLQ's broker did not acknowledge: an outage, not the record — unless a delivery error says no waiting
        # fixes it (the DLQ topic gone, writes to it not allowed)
        refused = [m for m in map(dependency_errors.kafka_meaning, getattr(exc, "errors", ())) if m.kind == FATAL]
        return Verdict(FATAL, "kafka", f"{text} ({refused[0].cause})") if refused else Verdict(TRANSIENT, "kafka", text)
    if _is(exc, "runjournal.producers.errors", "JournalError"):
        if _is(exc, "runjournal.producers.errors", "ProducerFencedError"):  # fenced, or its lease lapsed
            return Verdict(FATAL, "kafka", text)
        # the producer library wraps a client error (fence_producer: ``JournalError`` from the KafkaException):
        # it means what the wrapped error means
        inner = dependency_errors.meaning(exc.__cause__) if exc.__cause__ is not None else None
        if inner is not None:
            return Verdict(inner.kind, inner.dependency, f"{text} ({inner.cause})")
    if _is(exc, "runjournal.stores.errors", "ObjectStoreUnavailableError"):  # the archive's object store away
        return Verdict(TRANSIENT, "object_store", text)
    if _is(exc, "runjournal.core.crypto.errors", "KeyUnavailableError"):  # the key service away (decision 0059)
        return Verdict(TRANSIENT, "kms", text)
    if getattr(exc, "retryable", False):  # the memory plane marks outages on the class (StoreUnavailableError)
        return Verdict(TRANSIENT, "qdrant", text)
    if hasattr(exc, "retryable"):  # a memory-plane fault of one item (a rejected write, an embedding failure)
        return Verdict(RECORD, "record", text)
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return Verdict(TRANSIENT, "runjournal", text)
    return Verdict(FATAL, "runjournal", text)


class _Metrics:
    """The policy's families in ``registry`` (prometheus-client imported here, only when a registry is given)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        from runjournal.core import metrics as m

        labels = ("service", "dependency")
        self.retries = m.counter(registry, "runjournal_dependency_retries", "Waits on a transient dependency failure",
                                 labels)
        self.waiting = m.gauge(registry, "runjournal_dependency_waiting",
                               "1 while the service waits out a dependency outage", labels)
        self.failures = m.counter(registry, "runjournal_dependency_failures",
                                  "Failures by kind (transient, record, fatal)", (*labels, "kind"))


class _NoMetrics:
    """Stands in for :class:`_Metrics` when no registry is given: nothing is exported, nothing is imported."""

    class _Child:
        def inc(self, amount: float = 1) -> None:
            """Count nothing."""

        def set(self, value: float) -> None:
            """Hold nothing."""

    class _Family:
        def labels(self, *values: str) -> _NoMetrics._Child:
            return _NoMetrics._Child()

    retries = waiting = failures = _Family()


class FailurePolicy:
    """Runs work under the policy of the module table.

    Args:
        service: ``projector``, ``recovery`` or ``memory`` (log field and metric label).
        log: the service's logger (each wait is one WARNING line with ``dependency``, ``attempt``, ``error``).
        registry: Prometheus registry for the metrics (default: none — no metrics, and prometheus-client, the
            ``[cli]`` extra's, is not needed: ``continue_run`` runs a policy inside an agent on a core install).
        max_wait_s: longest one outage is waited out before :class:`DependencyUnavailableError`, seconds
            (default 240: below Kafka's ``max.poll.interval.ms`` of 300 s, so a consumer keeps its partitions).
        backoff_base_s, backoff_cap_s: exponential backoff start and cap, seconds (0.1, 5.0).
        stop: when set, waiting ends and the last error is raised (a service shutting down).
        on_wait: called before each wait (a service's own counter).
    """

    def __init__(self, service: str, log: logging.Logger, *, registry: CollectorRegistry | None = None,
                 max_wait_s: float = 240.0, backoff_base_s: float = 0.1, backoff_cap_s: float = 5.0,
                 stop: threading.Event | None = None, on_wait: Callable[[], None] | None = None) -> None:
        self.service = service
        self.on_wait = on_wait
        self.log = log
        self.max_wait_s = max_wait_s
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s
        self.stop = stop or threading.Event()
        self.registry = registry
        self.metrics: Any = _Metrics(registry) if registry is not None else _NoMetrics()
        self.retries = 0
        """Waits so far (all dependencies)."""

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``, retried while it fails transiently (bounded by ``max_wait_s`` and ``stop``).

        Raises:
            DependencyUnavailableError: a transient failure outlasted ``max_wait_s``.
            FatalDependencyError: a fatal failure of a dependency (cause chained).
            Exception: a ``record`` failure, an unclassified one (a bug: its own traceback is clearer), or any
                failure once ``stop`` is set, is re-raised as is.
        """
        started = time.monotonic()

        def should_stop(state: RetryCallState) -> bool:
            return self.stop.is_set() or time.monotonic() - started >= self.max_wait_s

        retrying = Retrying(retry=retry_if_exception(lambda e: classify(e).kind == TRANSIENT), stop=should_stop,
                            wait=wait_exponential(multiplier=self.backoff_base_s, max=self.backoff_cap_s),
                            sleep=self.stop.wait, before_sleep=lambda rs: self._waiting(what, rs), reraise=True)
        try:
            return retrying(fn)
        except Exception as exc:
            verdict = classify(exc)
            self.metrics.failures.labels(self.service, verdict.dependency, verdict.kind).inc()
            if verdict.kind == TRANSIENT and not self.stop.is_set():
                raise DependencyUnavailableError(verdict.dependency, verdict.cause,
                                                 time.monotonic() - started) from exc
            if verdict.kind == FATAL and verdict.dependency != "runjournal" and \
                    not isinstance(exc, (FatalDependencyError, DependencyUnavailableError)):
                raise FatalDependencyError(verdict.dependency, verdict.cause) from exc
            raise
        finally:
            for dep in ("registry", "redis", "kafka", "qdrant", "runjournal"):
                self.metrics.waiting.labels(self.service, dep).set(0)

    def _waiting(self, what: str, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        verdict = classify(exc) if exc is not None else Verdict(TRANSIENT, "runjournal", "?")
        self.retries += 1
        if self.on_wait is not None:
            self.on_wait()
        self.metrics.retries.labels(self.service, verdict.dependency).inc()
        self.metrics.waiting.labels(self.service, verdict.dependency).set(1)
        self.log.warning("dependency unavailable; waiting", extra={
            "service": self.service, "op": what, "dependency": verdict.dependency, "attempt": state.attempt_number,
            "error": verdict.cause})

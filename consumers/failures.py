"""The one failure policy of the long-lived consumers: projector, recovery job, memory extractor.

DESIGN.md § Decisions after the first build, *One failure policy*: every failure of a dependency
is classified once, here, and each service reacts the same way to the same kind:

* ``transient`` — schema registry unreachable; Redis connection refused/reset, timeout, ``LOADING``,
  ``READONLY`` (failover), ``MASTERDOWN``, ``TRYAGAIN``, ``CLUSTERDOWN``, ``OOM``; broker unavailable,
  leader moving, request timed out; Qdrant unreachable / 5xx / 429. Wait with capped exponential
  backoff (tenacity) and try the same work again — nothing moves past it; each wait is a WARNING log
  line and a metric (``runjournal_dependency_retries_total``, ``runjournal_dependency_waiting``); after
  ``max_wait_s`` of one outage: :class:`DependencyUnavailableError` (the process exits non-zero naming
  the dependency, a supervisor restarts it).
* ``record`` — an undecodable record (:class:`~runjournal.schemas.errors.SchemaError` other than a
  registry transport failure). Quarantine the record with its offset (DLQ, BLOCKED run) and go on.
* ``fatal`` — fenced (producer or static group member), unauthorised / unauthenticated, topic gone,
  any error librdkafka marks fatal, a bug. Stop: :class:`FatalDependencyError` naming the cause and,
  where there is one, the command that repairs it.

A registry transport failure is never a bad record: the bytes are fine, the registry is away.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from confluent_kafka import KafkaError, KafkaException
from tenacity import RetryCallState, Retrying, retry_if_exception, wait_exponential

from runjournal.core.errors import RunjournalError
from runjournal.schemas.errors import RegistryError, SchemaError

if TYPE_CHECKING:  # prometheus-client is the [cli] extra's: an agent continuing a run (core install) runs a policy
    from prometheus_client import CollectorRegistry

__all__ = ["TRANSIENT", "RECORD", "FATAL", "DependencyUnavailableError", "FailurePolicy", "FatalDependencyError",
           "Verdict", "classify", "kafka_error_verdict", "stops_consumer"]

T = TypeVar("T")
TRANSIENT, RECORD, FATAL = "transient", "record", "fatal"

_REDIS_TRANSIENT = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.BusyLoadingError,
                    redis.exceptions.ReadOnlyError, redis.exceptions.TryAgainError, redis.exceptions.ClusterDownError,
                    redis.exceptions.MasterDownError, redis.exceptions.OutOfMemoryError,
                    redis.exceptions.MaxConnectionsError)
_REDIS_TRANSIENT_REPLIES = ("LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "OOM", "BUSY")
_REDIS_FATAL = (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError,
                redis.exceptions.NoPermissionError)

_E = KafkaError
# librdkafka's local error codes start with an underscore; they are public constants, not private members.
_KAFKA_FATAL = {getattr(_E, n) for n in (
    "_FATAL", "_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "FENCED_INSTANCE_ID",
    "TOPIC_AUTHORIZATION_FAILED", "GROUP_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "SASL_AUTHENTICATION_FAILED", "_AUTHENTICATION",
    "UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_TOPIC", "_UNKNOWN_PARTITION")}
_KAFKA_TRANSIENT = {getattr(_E, n) for n in (
    "_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT", "_MSG_TIMED_OUT", "_WAIT_COORD", "_RESOLVE", "_TIMED_OUT_QUEUE",
    "LEADER_NOT_AVAILABLE", "NOT_LEADER_FOR_PARTITION", "REQUEST_TIMED_OUT", "NOT_ENOUGH_REPLICAS",
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "NETWORK_EXCEPTION", "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR",
    "COORDINATOR_LOAD_IN_PROGRESS", "BROKER_NOT_AVAILABLE", "CONCURRENT_TRANSACTIONS",
    # a broker handle torn down or moved while requests were in flight (the broker left the metadata: killed,
    # restarting) — the request is answered by the next broker, not a reason to stop
    "_DESTROY_BROKER", "_NODE_UPDATE")}
_SAME_ID = "another member runs with the same --instance-id: stop it, or give this one another id"
_TOPICS = "create the topics: `runjournal topics create`"
_REPAIR = {getattr(_E, n): fix for n, fix in (("_FENCED", _SAME_ID), ("FENCED_INSTANCE_ID", _SAME_ID),
                                             ("UNKNOWN_TOPIC_OR_PART", _TOPICS), ("_UNKNOWN_TOPIC", _TOPICS))}


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
    """``registry``, ``redis``, ``kafka``, ``qdrant``, ``record`` or ``runjournal``."""
    cause: str
    """One line naming the cause (and, for fatal ones, the repair when known)."""


def stops_consumer(err: KafkaError) -> bool:
    """True for an error a consumer's ``error_cb`` must stop on (fatal, fenced, unauthorised, topic gone); the
    rest (a broker down, a coordinator moving …) librdkafka retries by itself."""
    return bool(err.fatal()) or err.code() in _KAFKA_FATAL


def kafka_error_verdict(err: KafkaError) -> Verdict:
    """Classify one librdkafka error (fatal flag, then its code; unknown codes by ``retriable()``)."""
    code = err.code()
    text = f"{err.name()}: {err.str()}"
    if code in _REPAIR:
        text = f"{text} ({_REPAIR[code]})"
    elif "group.instance.id" in text:  # a consumer's _FATAL names the fencing in its text only
        text = f"{text} ({_SAME_ID})"
    if err.fatal() or code in _KAFKA_FATAL:
        return Verdict(FATAL, "kafka", text)
    if code in _KAFKA_TRANSIENT or err.retriable():
        return Verdict(TRANSIENT, "kafka", text)
    return Verdict(FATAL, "kafka", text)


def classify(exc: BaseException) -> Verdict:
    """Classify ``exc`` (see the module table). Never raises."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, (FatalDependencyError, DependencyUnavailableError)):
        return Verdict(FATAL, getattr(exc, "dependency", "runjournal"), str(exc))
    if isinstance(exc, RegistryError):
        return Verdict(TRANSIENT, "registry", text)
    if isinstance(exc, SchemaError):
        return Verdict(RECORD, "record", text)
    if isinstance(exc, _REDIS_FATAL):
        return Verdict(FATAL, "redis", f"{text} (check RUNJOURNAL_REDIS_URL's user and password)")
    if isinstance(exc, _REDIS_TRANSIENT):
        return Verdict(TRANSIENT, "redis", text)
    if isinstance(exc, redis.ResponseError):
        kind = TRANSIENT if str(exc).startswith(_REDIS_TRANSIENT_REPLIES) else FATAL
        return Verdict(kind, "redis", text)
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return kafka_error_verdict(exc.args[0])
    if getattr(exc, "retryable", False):  # the memory plane marks outages on the class (StoreUnavailableError)
        return Verdict(TRANSIENT, "qdrant", text)
    if hasattr(exc, "retryable"):  # a memory-plane fault of one item (a rejected write, an embedding failure)
        return Verdict(RECORD, "record", text)
    if type(exc).__name__ == "DeadLetterError":  # the DLQ's broker did not acknowledge: an outage, not the record
        return Verdict(TRANSIENT, "kafka", text)
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

"""Issue 14 (d): the one failure policy's table — every dependency failure kind has one classification."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import redis
from confluent_kafka import KafkaError, KafkaException

from runjournal.consumers.runtime.failures import (
    FATAL,
    RECORD,
    TRANSIENT,
    DependencyUnavailableError,
    FailurePolicy,
    FatalDependencyError,
    classify,
)
from runjournal.consumers.vectors.errors import StoreUnavailableError, StoreWriteError
from runjournal.schemas.errors import CorruptEventError, RegistryError, UnsupportedSchemaError

E = redis.exceptions
TABLE = [
    (RegistryError("registry unreachable"), TRANSIENT, "registry"),
    (E.ConnectionError("refused"), TRANSIENT, "redis"),
    (E.TimeoutError("timed out"), TRANSIENT, "redis"),
    (E.BusyLoadingError("LOADING"), TRANSIENT, "redis"),
    (E.ReadOnlyError("READONLY"), TRANSIENT, "redis"),
    (E.TryAgainError("TRYAGAIN"), TRANSIENT, "redis"),
    (E.ClusterDownError("CLUSTERDOWN"), TRANSIENT, "redis"),
    (E.MasterDownError("MASTERDOWN"), TRANSIENT, "redis"),
    (E.OutOfMemoryError("OOM command not allowed"), TRANSIENT, "redis"),
    (E.ResponseError("LOADING Redis is loading the dataset in memory"), TRANSIENT, "redis"),
    (E.AuthenticationError("WRONGPASS"), FATAL, "redis"),
    (E.NoPermissionError("NOPERM"), FATAL, "redis"),
    (KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN)), TRANSIENT, "kafka"),  # noqa: SLF001
    (KafkaException(KafkaError(KafkaError._TRANSPORT)), TRANSIENT, "kafka"),  # noqa: SLF001
    (KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE)), TRANSIENT, "kafka"),
    # issue 17 (the fault campaign, broker SIGKILL + restart): a broker leaving and rejoining the metadata makes
    # librdkafka fail the requests it had in flight with these; the recovery job called that fatal and
    # `recover --watch` stopped
    (KafkaException(KafkaError(KafkaError._DESTROY_BROKER)), TRANSIENT, "kafka"),  # noqa: SLF001
    (KafkaException(KafkaError(KafkaError._NODE_UPDATE)), TRANSIENT, "kafka"),  # noqa: SLF001
    (KafkaException(KafkaError(KafkaError.NOT_ENOUGH_REPLICAS)), TRANSIENT, "kafka"),
    (KafkaException(KafkaError(KafkaError.PRODUCER_FENCED)), FATAL, "kafka"),
    (KafkaException(KafkaError(KafkaError._FENCED)), FATAL, "kafka"),  # noqa: SLF001
    (KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)), FATAL, "kafka"),
    (KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)), FATAL, "kafka"),
    (KafkaException(KafkaError(KafkaError._TRANSPORT, fatal=True)), FATAL, "kafka"),  # noqa: SLF001
    (StoreUnavailableError("qdrant down"), TRANSIENT, "qdrant"),
    (StoreWriteError("rejected"), RECORD, "record"),
    (CorruptEventError("bad bytes"), RECORD, "record"),
    (UnsupportedSchemaError("unknown fingerprint"), RECORD, "record"),
]


@pytest.mark.parametrize(("exc", "kind", "dependency"), TABLE, ids=lambda v: type(v).__name__ if
                         isinstance(v, BaseException) else str(v))
def test_every_failure_kind_has_one_classification(exc: BaseException, kind: str, dependency: str) -> None:
    verdict = classify(exc)
    assert (verdict.kind, verdict.dependency) == (kind, dependency)


def test_transient_waits_are_bounded_and_fatal_stops_at_once() -> None:
    policy = FailurePolicy("t", logging.getLogger("t"), max_wait_s=0.3, backoff_base_s=0.01, backoff_cap_s=0.05)
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise E.ConnectionError("refused")
        return "ok"

    assert policy.call("flaky", flaky) == "ok" and policy.retries == 2
    started = time.monotonic()
    with pytest.raises(DependencyUnavailableError, match="redis unavailable"):
        policy.call("down", lambda: (_ for _ in ()).throw(E.ConnectionError("refused")))
    assert time.monotonic() - started < 5
    with pytest.raises(FatalDependencyError, match="kafka"):
        policy.call("fenced", lambda: (_ for _ in ()).throw(KafkaException(KafkaError(KafkaError.PRODUCER_FENCED))))
    with pytest.raises(CorruptEventError):  # a bad record is the caller's to quarantine
        policy.call("decode", lambda: (_ for _ in ()).throw(CorruptEventError("x")))


def test_stop_ends_a_wait() -> None:
    stop = threading.Event()
    policy = FailurePolicy("t", logging.getLogger("t"), max_wait_s=60, backoff_base_s=0.5, stop=stop)
    threading.Timer(0.5, stop.set).start()
    started = time.monotonic()
    with pytest.raises(RegistryError):
        policy.call("decode", lambda: (_ for _ in ()).throw(RegistryError("away")))
    assert time.monotonic() - started < 10

"""Pure parts of the producer library: keys, digests, plan JSON, trace context, error mapping."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from runjournal.core.errors import RunjournalError
from runjournal.producers import (
    ApprovalStatus,
    CallStatus,
    DeliveryError,
    FatalProducerError,
    JournalError,
    PlannedCall,
    ProducerFencedError,
    RecoveryPlan,
    TransactionAbortedError,
    canonical_json,
    digest,
    idempotency_key,
    valid_traceparent,
)
from runjournal.producers._kafka_errors import Failure, Severity, classify


def test_idempotency_key_depends_only_on_run_node_path_and_index() -> None:
    key = idempotency_key("run-1", "trip/book#2", 3)
    assert key == idempotency_key("run-1", "trip/book#2", 3)  # every resume derives the same key
    assert len(key) == 32 and int(key, 16) >= 0
    others = {
        idempotency_key("run-2", "trip/book#2", 3),
        idempotency_key("run-1", "trip/book", 3),
        idempotency_key("run-1", "trip/book#2", 2),
        idempotency_key("run-1", "", 3),
    }
    assert key not in others and len(others) == 4
    with pytest.raises(ValueError):
        idempotency_key("run-1", "", 0)


def test_canonical_json_is_sorted_compact_utf8_and_never_fails() -> None:
    assert canonical_json({"b": 1, "a": ["é", None]}) == '{"a":["é",null],"b":1}'
    assert canonical_json({"when": {1, 2}}).startswith('{"when":"{1, 2}"')  # repr of a non-JSON value
    assert digest("{}") == "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"


def test_recovery_plan_round_trips_through_json() -> None:
    plan = RecoveryPlan(
        run_id="r1",
        tenant_id="t1",
        agent="travel",
        epoch=3,
        last_seq=17,
        calls={
            "k1": PlannedCall("k1", "book", CallStatus.COMMITTED, result_json='{"ok":1}', attempts=1),
            "k2": PlannedCall("k2", "pay", CallStatus.OUTCOME_UNKNOWN, attempts=2, side_effect=True),
            "k3": PlannedCall("k3", "lookup", CallStatus.NOT_STARTED, side_effect=False),
        },
        approvals={"k2": ApprovalStatus.PENDING},
        created_at_ms=1_700_000_000_000,
        node_attempts={"trip": 2},
        assigned_to="inst-2",
    )
    text = plan.to_json()
    again = RecoveryPlan.from_json(text)
    assert again == plan and again.to_json() == text and '"v":1' in text
    with pytest.raises(ValueError):
        RecoveryPlan.from_json(text.replace('"v":1', '"v":9'))
    with pytest.raises(ValueError):
        RecoveryPlan.from_json(text.replace("OUTCOME_UNKNOWN", "MAYBE"))


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", True),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", False),  # zero trace id
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", False),  # zero span id
        ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", False),  # forbidden version
        ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", False),  # upper case
        ("garbage", False),
    ],
)
def test_traceparent_validation(value: str, ok: bool) -> None:
    assert valid_traceparent(value) is ok


@pytest.mark.parametrize(
    ("error", "severity"),
    [
        (KafkaError(KafkaError._FENCED, fatal=True), Severity.FENCED),
        (KafkaError(KafkaError.PRODUCER_FENCED), Severity.FENCED),
        (KafkaError(KafkaError.INVALID_PRODUCER_EPOCH, fatal=True), Severity.FENCED),
        (KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, fatal=True), Severity.FATAL),
        (KafkaError(KafkaError.UNKNOWN_PRODUCER_ID, fatal=True), Severity.FATAL),
        (KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, txn_requires_abort=True), Severity.ABORTABLE),
        (KafkaError(KafkaError._TIMED_OUT, retriable=True), Severity.RETRIABLE),
        (KafkaError(KafkaError._UNKNOWN_PARTITION), Severity.LOCAL),
        # produce() on a producer already in its fatal state: the code says so, the fatal flag does not
        (KafkaError(KafkaError._FATAL), Severity.FATAL),
        (None, Severity.FATAL),
    ],
)
def test_kafka_errors_map_to_what_the_journal_does(error: KafkaError | None, severity: Severity) -> None:
    assert classify(error) is severity
    if error is not None:
        assert classify(KafkaException(error)) is severity


def test_error_hierarchy_and_failure_copies() -> None:
    assert issubclass(ProducerFencedError, FatalProducerError)
    assert issubclass(FatalProducerError, DeliveryError)
    assert issubclass(TransactionAbortedError, DeliveryError)
    assert issubclass(DeliveryError, JournalError) and issubclass(JournalError, RunjournalError)
    assert ProducerFencedError.retryable is False and TransactionAbortedError.retryable is True
    cause = KafkaException(KafkaError(KafkaError._FENCED, fatal=True))
    failure = Failure(ProducerFencedError, "fenced", cause, retryable=False)
    first, second = failure.error(), failure.error()
    assert first is not second and first.__cause__ is cause and not first.retryable

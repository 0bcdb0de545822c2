"""murmur2 partitioning: the oracle against Kafka's own test vectors, the product (confluent_kafka.murmur2)
against the oracle on 100k random keys, then the real broker path (librdkafka murmur2_random)."""

from __future__ import annotations

import random
import string
import uuid
from collections import Counter

import pytest

from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.schemas.keys import partition_for
from tests.support.murmur2_oracle import murmur2, oracle_partition, to_positive

# org.apache.kafka.common.utils.UtilsTest#testMurmur2 (apache/kafka, clients/src/test/java/...)
KAFKA_UTILS_TEST = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]
# Kafka murmur2 values quoted by akka-cluster-sharding's Murmur2Spec (lengths 1-5: every tail case).
SHORT_KEYS = [
    (b"1", -1993445489),
    (b"12", 126087238),
    (b"123", -267702483),
    (b"1234", -1614185708),
    (b"12345", -1188365604),
]


@pytest.mark.parametrize(("data", "expected"), KAFKA_UTILS_TEST + SHORT_KEYS)
def test_murmur2_matches_kafka_vectors(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_to_positive_clears_sign_bit_only() -> None:
    assert to_positive(-(2**31)) == 0
    assert to_positive(-1) == 0x7FFFFFFF
    assert to_positive(12345) == 12345


@pytest.mark.parametrize("num_partitions", [1, 2, 3, 6, 7, 12, 50, 101, 1000])
def test_partition_for_equals_the_oracle_on_100k_random_keys(num_partitions: int) -> None:
    rng = random.Random(num_partitions)
    alphabet = string.ascii_letters + string.digits + "-_:.é☃\u00e9\U0001f600"
    keys = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(50_000)]
    keys += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 64))) for _ in range(50_000)]
    mismatched = [k for k in keys if partition_for(k, num_partitions) != oracle_partition(k, num_partitions)]
    assert mismatched == []


def test_partition_for_hashes_utf8_and_rejects_zero_partitions() -> None:
    run_id = "rün-☃"
    assert partition_for(run_id, 7) == to_positive(murmur2(run_id.encode("utf-8"))) % 7
    with pytest.raises(ValueError):
        partition_for("r", 0)


@pytest.mark.integration
def test_partition_for_equals_librdkafka_murmur2_random_on_real_broker(topics: Settings) -> None:
    """Produce with NO explicit partition through librdkafka's Java-compatible partitioner, read back."""
    rng = random.Random(4)
    alphabet = string.ascii_letters + string.digits + "-_:é☃"
    run_ids = [str(uuid.uuid4()) for _ in range(150)]
    run_ids += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(50)]
    producer = kafka.producer(topics, **{"partitioner": "murmur2_random", "linger.ms": 5}
    )
    for run_id in run_ids:
        producer.produce(topics.events_topic, key=run_id.encode("utf-8"), value=b"x")
    assert producer.flush(30) == 0
    consumer = kafka.consumer(topics, **{"group.id": f"g-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topics.events_topic])
    landed: dict[str, int] = {}
    try:
        for _ in range(200):
            for msg in consumer.consume(500, timeout=0.5):
                assert msg.error() is None, msg.error()
                landed[msg.key().decode("utf-8")] = msg.partition()
            if len(landed) == len(set(run_ids)):
                break
    finally:
        consumer.close()
    assert len(landed) == len(set(run_ids))
    mismatches = {
        r: (p, partition_for(r, topics.partitions))
        for r, p in landed.items()
        if p != partition_for(r, topics.partitions)
    }
    assert mismatches == {}
    assert len(Counter(landed.values())) == topics.partitions  # the sample really spread over all partitions


# -- the record key ---------------------------------------------------------------------------------------------
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from runjournal.schemas import Event, EventType, new_event_id, utcnow  # noqa: E402
from runjournal.schemas.keys import KeyFormatError, event_key, parse_event_key, run_id_of_key  # noqa: E402


@given(st.text(st.characters(exclude_categories=("Cs",)), min_size=1), st.integers(min_value=1, max_value=2**31),
       st.integers(min_value=1, max_value=2**62))
def test_an_event_key_parses_back_to_its_parts_whatever_the_run_id_holds(run_id: str, epoch: int, seq: int) -> None:
    """``:`` inside a run id is fine (the key parses from the right); the bytes filter agrees with the parser."""
    key = event_key(run_id, epoch, seq)
    assert parse_event_key(key) == (run_id, epoch, seq)
    assert run_id_of_key(key.encode()) == run_id.encode()


def test_the_event_key_is_the_contract_modules_key() -> None:
    event = Event(new_event_id(), "a:b", "t", 7, 2, "p", EventType.MESSAGE, utcnow(), {"role": "user", "content": "x",
                                                                                     "user_id": None})
    assert event.key == event_key("a:b", 2, 7) == "a:b:2:7"


@pytest.mark.parametrize("bad", ["", "run", "run:1", ":1:2", "run:x:2", "run:1:y", b"\xff:1:2"])
def test_a_malformed_key_is_a_named_error(bad: str | bytes) -> None:
    with pytest.raises(KeyFormatError):
        parse_event_key(bad)

"""Helpers of the fault tests (issue 14): instances by their Redis keys, runs on a chosen partition, and
writers that keep transactions flowing (what agents do: a commit marker after every few records)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from runjournal.core import kafka, redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.schemas.keys import partition_for


def run_on_partition(settings: Settings, partition: int, tag: str) -> str:
    """A run id (``{tag}-<n>``) that murmur2 maps to ``partition``."""
    n = 0
    while partition_for(f"{tag}-{n}", settings.partitions) != partition:
        n += 1
    return f"{tag}-{n}"


def owns(settings: Settings, producer_id: str, *run_ids: str) -> None:
    """Put ``run_ids`` in ``producer_id``'s owned set (no lease: a dead instance)."""
    redis_client.client(settings).sadd(RedisKeys(settings.topic_prefix).owned(producer_id), *run_ids)


def live(settings: Settings, producer_id: str, ttl_s: int = 300) -> None:
    """Give ``producer_id`` a lease (a live instance) for ``ttl_s`` seconds."""
    redis_client.client(settings).set(RedisKeys(settings.topic_prefix).lease(producer_id), "1", ex=ttl_s)


def owned(settings: Settings, producer_id: str) -> set[str]:
    """``producer_id``'s owned set."""
    r = redis_client.client(settings)
    return {m.decode() for m in r.smembers(RedisKeys(settings.topic_prefix).owned(producer_id))}


def assigned(settings: Settings, producer_id: str) -> list[str]:
    """``producer_id``'s assignment list (what its ``claim_assignment`` would pop), in order."""
    r = redis_client.client(settings)
    return [m.decode() for m in r.lrange(RedisKeys(settings.topic_prefix).assign(producer_id), 0, -1)]


@contextmanager
def steady_writers(settings: Settings, writers: int = 4, interval_s: float = 0.05) -> Iterator[list[int]]:
    """``writers`` threads, each a transactional producer committing one record to every partition every
    ``interval_s`` seconds (keys ``noise-<w>-<i>:1:<n>``, never decoded by the runs under test). Yields the
    list of commits done (one counter per writer); stops and joins on exit."""
    stop = threading.Event()
    done = [0] * writers

    def work(w: int) -> None:
        producer = kafka.producer(settings, **{"transactional.id": f"{settings.topic_prefix}.noise-{w}",
                                               "linger.ms": 0})
        producer.init_transactions(30)
        n = 0
        while not stop.is_set():
            producer.begin_transaction()
            for p in range(settings.partitions):
                n += 1
                producer.produce(settings.events_topic, key=f"noise-{w}-{p}:1:{n}".encode(), value=b"noise",
                                 partition=p)
            producer.commit_transaction(30)
            done[w] += 1
            stop.wait(interval_s)
        producer.flush(10)

    threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in range(writers)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while min(done) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield done
    finally:
        stop.set()
        for t in threads:
            t.join(30)

"""Two (or 32) threads probing one instance's lease at once (issue 28, one clock per decision): the shared read
raises the effect window to the largest tool timeout any of them asked for, so every request sent after it is
covered by the window the recovery job waits out — and none of the callers is refused or lapses the lease."""

from __future__ import annotations

import threading
import uuid

import pytest
import redis

from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.producers._lease import InstanceLease

pytestmark = pytest.mark.integration


def test_concurrent_probes_share_reads_and_the_window_covers_the_largest_timeout(settings: Settings) -> None:
    r = redis.Redis.from_url(settings.redis_url)
    lease = InstanceLease(r, settings.topic_prefix, f"prober-{uuid.uuid4().hex[:6]}", ttl_ms=10_000)
    instance = lease.acquire(lambda i: f"txn-{i}")
    timeouts = [50 * (i + 1) for i in range(32)]  # 50 ms … 1.6 s, asked in any order by 32 threads
    start, answers = threading.Barrier(len(timeouts)), {}

    def caller(timeout_ms: int) -> None:
        start.wait()
        answers[timeout_ms] = lease.probe(timeout_ms).result(10)

    threads = [threading.Thread(target=caller, args=(t,)) for t in timeouts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    try:
        assert answers == dict.fromkeys(timeouts, True) and not lease.lapsed
        window = RedisKeys(settings.topic_prefix).window(instance)
        assert int(r.get(window) or 0) == max(timeouts)  # T: the largest any caller asked for
        assert r.pttl(window) >= lease.ttl_ms  # lasts ttl + T past now: nothing asked is left uncovered
        assert lease.window_ms == max(timeouts)  # so a check after a Redis outage does not lapse any of them
    finally:
        lease.release()

"""The instance lease and owned-run set in Redis (DESIGN.md § Recovery job: liveness from leases).

* ``{prefix}:lease:{producer_id}`` — string, JSON ``{producer_id, transactional_id, pid, host,
  started_at_ms, ttl_ms}``, TTL ``ttl_ms``; re-set every ``ttl_ms / 3`` by the Journal's lease
  thread; deleted on clean close. A missing key means the instance is presumed dead.
* ``{prefix}:owned:{producer_id}`` — set of run ids the instance writes: added on
  start/resume (before the first event), removed on succeed/fail (after the terminal event).
  A hint for the recovery job; the projector's state also names each run's owner.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from typing import Any

from runjournal.producers.errors import JournalError

__all__ = ["InstanceLease"]

log = logging.getLogger("runjournal.producers.lease")

# Delete the lease only if it is still ours (compare-and-delete).
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end"


def _text(raw: Any) -> str | None:
    if raw is None:
        return None
    return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)


class InstanceLease:
    """One instance's lease and owned set. Methods raise ``redis.RedisError`` unless stated otherwise."""

    def __init__(
        self, redis_client: Any, prefix: str, producer_id: str, transactional_id: str, ttl_ms: int
    ) -> None:
        if ttl_ms < 300:
            raise ValueError(f"lease ttl_ms must be >= 300, got {ttl_ms}")
        self._r = redis_client
        self.key = f"{prefix}:lease:{producer_id}"
        self.owned_key = f"{prefix}:owned:{producer_id}"
        self.ttl_ms = ttl_ms
        self.value = json.dumps(
            {
                "producer_id": producer_id,
                "transactional_id": transactional_id,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started_at_ms": int(time.time() * 1000),
                "ttl_ms": ttl_ms,
            },
            sort_keys=True,
        )
        self.lapses = 0
        """Renewals that found the key gone (expired/deleted): the instance may have been declared dead."""

    def acquire(self) -> None:
        """Take the lease. Raises JournalError when a live lease of another process holds this producer_id."""
        if not self._r.set(self.key, self.value, px=self.ttl_ms, nx=True):
            holder = _text(self._r.get(self.key))
            raise JournalError(
                f"producer_id is in use: lease {self.key} is held by {holder}; "
                f"wait {self.ttl_ms} ms or pick another id"
            )
        left = self._r.scard(self.owned_key)
        if left:
            log.warning("%s holds %d runs of an earlier instance with this producer_id", self.owned_key, left)

    def renew(self) -> None:
        """Re-set the lease with a fresh TTL; logs (and counts in ``lapses``) when it had lapsed."""
        old = _text(self._r.set(self.key, self.value, px=self.ttl_ms, get=True))
        if old != self.value:
            self.lapses += 1
            log.warning("lease %s had lapsed or changed hands (found %r); renewed", self.key, old)

    def still_ours(self) -> bool:
        """True when the lease key holds our value; Redis unreachable counts as True (Kafka fences)."""
        try:
            return _text(self._r.get(self.key)) == self.value
        except Exception as exc:  # noqa: BLE001 - any client failure: cannot tell, do not self-fence
            log.warning("cannot read lease %s (%s); assuming it is still ours", self.key, exc)
            return True

    def release(self) -> None:
        """Delete the lease if it is still ours."""
        self._r.eval(_RELEASE, 1, self.key, self.value)

    def own(self, run_id: str) -> None:
        """Add ``run_id`` to the owned set."""
        self._r.sadd(self.owned_key, run_id)

    def disown(self, run_id: str) -> None:
        """Remove ``run_id`` from the owned set."""
        self._r.srem(self.owned_key, run_id)

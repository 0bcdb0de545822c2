"""A bounded, thread-safe cache of unwrapped data keys (decision 0059): at most ``max_entries`` keys, each kept at
most ``ttl_ms`` after it was unwrapped, least recently used evicted first.

The TTL bounds how long a process that unwrapped a data key keeps reading after the key's KEK was destroyed or
retired elsewhere (crypto-shredding reaches other processes within it); a process that destroys or retires a key
itself forgets it at once (:meth:`DataKeyCache.forget`).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["DataKeyCache"]

CacheKey = tuple[str, int, str]
"""``(kek_id, kek_version, dek_id)``."""


class DataKeyCache:
    """LRU + TTL map ``(kek_id, version, dek_id)`` → data key bytes.

    Args:
        max_entries: most keys held (≥ 1).
        ttl_ms: how long one unwrapped key is served, ms (0: never cached).
        clock: monotonic milliseconds (tests pass their own).

    Raises:
        ValueError: ``max_entries`` < 1 or ``ttl_ms`` < 0.
    """

    def __init__(self, max_entries: int = 1024, ttl_ms: int = 300_000,
                 clock: Callable[[], float] | None = None) -> None:
        if max_entries < 1 or ttl_ms < 0:
            raise ValueError(f"max_entries must be >= 1 and ttl_ms >= 0, not {max_entries}, {ttl_ms}")
        self.max_entries = max_entries
        self.ttl_ms = ttl_ms
        self._clock = clock or (lambda: time.monotonic() * 1000.0)
        self._lock = threading.Lock()
        self._items: OrderedDict[CacheKey, tuple[float, bytes]] = OrderedDict()

    def get(self, key: CacheKey) -> bytes | None:
        """The cached key, or None (absent or expired: an expired entry is dropped)."""
        now = self._clock()
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            if now - item[0] >= self.ttl_ms:
                del self._items[key]
                return None
            self._items.move_to_end(key)
            return item[1]

    def put(self, key: CacheKey, value: bytes) -> None:
        """Cache ``value`` (evicting the least recently used past ``max_entries``)."""
        if self.ttl_ms == 0:
            return
        now = self._clock()
        with self._lock:
            self._items[key] = (now, value)
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    def forget(self, kek_id: str, version: int | None = None) -> int:
        """Drop every key wrapped by ``kek_id`` (only its ``version`` when given); return how many."""
        with self._lock:
            gone = [k for k in self._items if k[0] == kek_id and (version is None or k[1] == version)]
            for k in gone:
                del self._items[k]
            return len(gone)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

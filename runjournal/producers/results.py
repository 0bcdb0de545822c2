"""Large tool results, stored by content digest in Redis and referenced from the journal.

A TOOL_CALL_COMMITTED event carries the result inline (``result_json``) when its canonical
JSON is at most ``Journal(inline_result_bytes=8192)`` bytes; a larger result is written here
first, under ``rj:P:result:<sha256 hex>`` (no TTL, no hash tag: results spread over a cluster's nodes),
and the event carries
``result_ref = "sha256:<hex>"`` plus ``result_digest`` — so events stay small and the
journal still pins the exact bytes (the digest). Redis runs ``appendfsync everysec``: a
result written in Redis' last second before a Redis crash can be lost; the event still
records that the call committed and its digest, and a resumed run reading it back gets
``ResultUnavailableError`` rather than a re-executed side effect.
"""

from __future__ import annotations

from typing import Any

from runjournal.core.redis_keys import RedisKeys
from runjournal.producers._digest import digest

__all__ = ["ResultStore"]

_REF_PREFIX = "sha256:"


class ResultStore:
    """Content-addressed result texts in Redis.

    Args:
        redis_client: a client from ``runjournal.core.redis_client``.
        prefix: key prefix (``settings.topic_prefix`` by default in the Journal).

    Raises:
        redis.RedisError: from ``put`` / ``get`` when Redis fails.
    """

    def __init__(self, redis_client: Any, prefix: str) -> None:
        self._r = redis_client
        self._prefix = prefix
        self._keys = RedisKeys(prefix)

    def key(self, ref: str) -> str:
        """The Redis key of ``ref`` (``sha256:<hex>`` → ``rj:P:result:<hex>``); ValueError if bad."""
        if not ref.startswith(_REF_PREFIX) or len(ref) != len(_REF_PREFIX) + 64:
            raise ValueError(f"not a result reference: {ref!r}")
        return self._keys.result(ref[len(_REF_PREFIX) :])

    def put(self, text: str) -> str:
        """Store ``text`` (canonical JSON) and return its reference ``sha256:<hex>``."""
        ref = _REF_PREFIX + digest(text)
        self._r.set(self.key(ref), text.encode("utf-8"))
        return ref

    def get(self, ref: str) -> str | None:
        """The text stored under ``ref``, or None when absent."""
        raw = self._r.get(self.key(ref))
        if raw is None:
            return None
        return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)

"""Which agent instances are alive (a lease key with a TTL) and which runs each one owns.

Keys (written by ``producers``; see ``producers/_lease.py`` and ``producers/plan.py``):
``{prefix}:lease:{producer_id}`` (TTL'd heartbeat) and ``{prefix}:owned:{producer_id}`` (set of
run ids). An instance with an owned set and no lease is dead (or paused past its TTL — a zombie,
which is why recovery fences before it reads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Instances", "InstanceView"]


@dataclass(frozen=True)
class InstanceView:
    """One instance as Redis shows it."""

    producer_id: str
    """The instance id."""
    alive: bool
    """Its lease key exists."""
    owned: frozenset[str]
    """Run ids in its owned set."""


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


class Instances:
    """Lease and ownership lookups for one key prefix (``Settings.topic_prefix``)."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.r = client
        self.prefix = prefix

    def lease_key(self, producer_id: str) -> str:
        """``{prefix}:lease:{producer_id}``."""
        return f"{self.prefix}:lease:{producer_id}"

    def owned_key(self, producer_id: str) -> str:
        """``{prefix}:owned:{producer_id}``."""
        return f"{self.prefix}:owned:{producer_id}"

    def _ids(self, kind: str) -> set[str]:
        head = f"{self.prefix}:{kind}:"
        return {_text(k)[len(head):] for k in self.r.scan_iter(match=f"{head}*", count=1000)}

    def live(self) -> set[str]:
        """producer_ids holding a lease now."""
        return self._ids("lease")

    def view(self, producer_id: str) -> InstanceView:
        """Lease and owned runs of one instance."""
        owned = frozenset(_text(m) for m in self.r.smembers(self.owned_key(producer_id)))
        return InstanceView(producer_id, bool(self.r.exists(self.lease_key(producer_id))), owned)

    def stale(self) -> list[InstanceView]:
        """Instances that own runs but hold no lease (sorted by id)."""
        live = self.live()
        return [self.view(pid) for pid in sorted(self._ids("owned") - live)]

    def least_loaded(self, exclude: set[str] = frozenset()) -> str | None:  # type: ignore[assignment]
        """The live instance owning the fewest runs (ties by id), or None when none is alive."""
        candidates = sorted(self.live() - set(exclude))
        if not candidates:
            return None
        return min(candidates, key=lambda pid: (int(self.r.scard(self.owned_key(pid))), pid))

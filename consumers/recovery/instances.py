"""Which agent instances are alive (a lease key with a TTL) and which runs each one owns.

Keys (written by ``producers``; named by ``runjournal.core.redis_keys``): ``rj:{P:i:<instance>}:lease``
(TTL'd, compare-and-set heartbeat) and ``rj:{P:i:<instance>}:owned`` (set of run ids), where an instance
is one *incarnation* of a producer_id: ``agent-7`` for the first Journal started under that name,
``agent-7#2`` for the second. A restarted ``agent-7`` is therefore a new instance with its own lease;
the earlier one — an owned set and no lease — is dead (or a paused zombie, which is why recovery fences
before it reads) and its runs are recovered. A lapsed lease is never renewed again (the heartbeat is
compare-and-set and a lapse fences the instance), so a key that is gone stays gone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from runjournal.core import redis_client
from runjournal.core.redis_keys import RedisKeys

__all__ = ["InstanceView", "Instances"]

# Compare-and-delete: free a run id only while the given instance holds it.
_FREE_RUN_ID = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end"


@dataclass(frozen=True)
class InstanceView:
    """One instance as Redis shows it."""

    producer_id: str
    """The instance id (``name`` or ``name#n``)."""
    alive: bool
    """Its lease key exists."""
    owned: frozenset[str]
    """Run ids in its owned set."""


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


class Instances:
    """Lease, ownership and run-id lookups for one key prefix (``Settings.topic_prefix``)."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.r = client
        self.prefix = prefix
        self.keys = RedisKeys(prefix)

    def lease_key(self, producer_id: str) -> str:
        """``rj:{P:i:<instance>}:lease``."""
        return self.keys.lease(producer_id)

    def owned_key(self, producer_id: str) -> str:
        """``rj:{P:i:<instance>}:owned``."""
        return self.keys.owned(producer_id)

    def _ids(self, family: str) -> set[str]:
        """Instance ids with a key of ``family`` (SCAN on every primary of a cluster)."""
        found = (self.keys.instance_of(k, family)
                 for k in redis_client.scan_keys(self.r, self.keys.instance_glob(family)))
        return {i for i in found if i is not None}

    def live(self) -> set[str]:
        """Instance ids holding a lease now."""
        return self._ids("lease")

    def view(self, producer_id: str) -> InstanceView:
        """Lease and owned runs of one instance."""
        owned = frozenset(_text(m) for m in self.r.smembers(self.owned_key(producer_id)))
        return InstanceView(producer_id, bool(self.r.exists(self.lease_key(producer_id))), owned)

    def alive_many(self, producer_ids: Iterable[str]) -> dict[str, bool]:
        """Whether each instance holds its lease: one pipelined EXISTS per instance (each in its own slot).

        Raises:
            redis.RedisError: Redis failed.
        """
        ids = sorted(set(producer_ids))
        if not ids:
            return {}
        pipe = self.r.pipeline(transaction=False)
        for pid in ids:
            pipe.exists(self.lease_key(pid))
        return {pid: bool(n) for pid, n in zip(ids, pipe.execute(), strict=True)}

    def stale(self) -> list[InstanceView]:
        """Instances that own runs but hold no lease (sorted by id) — earlier incarnations included."""
        live = self.live()
        return [self.view(pid) for pid in sorted(self._ids("owned") - live)]

    def least_loaded(self, exclude: set[str] = frozenset()) -> str | None:  # type: ignore[assignment]
        """The live instance owning the fewest runs (ties by id), or None when none is alive."""
        candidates = sorted(self.live() - set(exclude))
        if not candidates:
            return None
        return min(candidates, key=lambda pid: (int(self.r.scard(self.owned_key(pid))), pid))

    def run_started_by(self, run_id: str) -> str | None:
        """The instance that claimed ``run_id`` in ``start_run`` (``rj:{P:r:<run_id>}:claim``), or None."""
        raw = self.r.get(self.keys.claim(run_id))
        return None if raw is None else _text(raw)

    def runs_started_by(self, run_ids: Iterable[str]) -> dict[str, str | None]:
        """:meth:`run_started_by` of each run: one pipelined GET per run (each in its run's slot).

        Raises:
            redis.RedisError: Redis failed.
        """
        ids = list(run_ids)
        if not ids:
            return {}
        pipe = self.r.pipeline(transaction=False)
        for run_id in ids:
            pipe.get(self.keys.claim(run_id))
        return {r: None if raw is None else _text(raw) for r, raw in zip(ids, pipe.execute(), strict=True)}

    def free_run_id(self, run_id: str, started_by: str) -> bool:
        """Free a run id ``started_by`` claimed (compare-and-delete), so a run that left no fact in the
        journal can be started again under its id. Call only after fencing ``started_by`` and reading the
        journal to its end (``no_facts``). Returns True when freed."""
        return bool(self.r.eval(_FREE_RUN_ID, 1, self.keys.claim(run_id), started_by))

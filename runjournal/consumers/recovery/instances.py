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
        """Lease and owned runs of one instance (its incoming runs included: a hand-over to it may have
        committed)."""
        pipe = self.r.pipeline(transaction=True)  # one instance: one slot
        pipe.smembers(self.owned_key(producer_id))
        pipe.smembers(self.keys.incoming(producer_id))
        pipe.exists(self.lease_key(producer_id))
        owned, incoming, alive = pipe.execute()
        return InstanceView(producer_id, bool(alive), frozenset(_text(m) for m in (*owned, *incoming)))

    def incoming_of_live(self) -> dict[str, str]:
        """run_id → live instance, for runs in a live instance's incoming set: a pass put them there before
        committing their RUN_RESUMED and has not completed their hand-over (yet, or it died)."""
        out: dict[str, str] = {}
        for pid in sorted(self._ids("incoming") & self.live()):
            out.update({_text(m): pid for m in self.r.smembers(self.keys.incoming(pid))})
        return out

    def known(self, producer_id: str) -> bool:
        """Whether ``producer_id`` names an instance that ever started: its name's incarnation counter
        (``rj:{P:i:<name>}:incarnation``) reached its incarnation (``name`` is 1, ``name#n`` is n), or a key of it is
        left (a lease, an owned set …). False: a typo — ``recover --instance`` says so.

        Raises:
            redis.RedisError: Redis failed.
        """
        name, _, number = producer_id.rpartition("#") if "#" in producer_id else (producer_id, "", "1")
        incarnation = int(number) if number.isdigit() else 0
        started = self.r.get(self.keys.incarnation(name))
        if started is not None and incarnation and int(started) >= incarnation:
            return True
        return any(self.r.exists(key(producer_id)) for key in (
            self.keys.lease, self.keys.owned, self.keys.incoming, self.keys.surrendered, self.keys.assign))

    def surrendered(self) -> dict[str, tuple[str, int]]:
        """run_id → (instance, epoch) of every run an instance gave up (``rj:{P:i:<instance>}:surrendered``, written
        by ``Journal.surrender``): live instances' and dead ones'. One SCAN, then one HGETALL per instance.

        Raises:
            redis.RedisError: Redis failed.
        """
        out: dict[str, tuple[str, int]] = {}
        for pid, (entries,) in self._each(self._ids("surrendered"), lambda pipe, pid: pipe.hgetall(
                self.keys.surrendered(pid))).items():
            for run_id, epoch in entries.items():
                out[_text(run_id)] = (pid, int(epoch))
        return out

    def clear_surrendered(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Take each ``(instance, run_id)`` off the instance's surrendered hash (pipelined; harmless when gone).

        Raises:
            redis.RedisError: Redis failed (any of the removals may have happened).
        """
        pipe = self.r.pipeline(transaction=False)
        queued = False
        for instance, run_id in pairs:
            pipe.hdel(self.keys.surrendered(instance), run_id)
            queued = True
        if queued:
            pipe.execute()

    def alive_many(self, producer_ids: Iterable[str]) -> dict[str, bool]:
        """Whether each instance holds its lease: one pipelined EXISTS per instance (each in its own slot).

        Raises:
            redis.RedisError: Redis failed.
        """
        return {pid: bool(n) for pid, (n,) in self._each(producer_ids, lambda pipe, pid: pipe.exists(
            self.lease_key(pid))).items()}

    def _each(self, producer_ids: Iterable[str], queue: Any) -> dict[str, list[Any]]:
        """instance -> the replies of the commands ``queue(pipe, instance)`` queued for it: one pipelined round
        trip for all (each instance's keys in its own slot), instances sorted, duplicates once.

        Raises:
            redis.RedisError: Redis failed.
        """
        ids = sorted(set(producer_ids))
        if not ids:
            return {}
        pipe = self.r.pipeline(transaction=False)
        counts = []
        for pid in ids:
            before = len(pipe)
            queue(pipe, pid)
            counts.append(len(pipe) - before)
        replies = iter(pipe.execute())
        return {pid: [next(replies) for _ in range(n)] for pid, n in zip(ids, counts, strict=True)}

    def window_left_ms(self, producer_ids: Iterable[str], timeout_ms: int = 0) -> dict[str, int]:
        """How much longer (ms, 0 when over) a request each instance may have sent, of a tool whose timeout is
        ``timeout_ms``, can still act at a provider — by Redis's clock alone (``producers._lease``): the window's
        PTTL, less what its T adds beyond ``timeout_ms``. The window expires at least ``ttl + T`` after the
        instance's last lease renewal, and the instance sends only within ``ttl`` of that renewal, so
        ``PTTL - T + timeout_ms`` bounds a ``timeout_ms`` request (an instance that once called a slower tool does
        not make every recovery wait for it). ``timeout_ms`` 0 (unknown): the whole PTTL. One pipelined round
        trip (PTTL and GET per instance, each in its own slot).

        Raises:
            redis.RedisError: Redis failed.
        """
        out: dict[str, int] = {}
        for pid, (pttl, raw) in self._each(producer_ids, lambda pipe, pid: (
                pipe.pttl(self.keys.window(pid)), pipe.get(self.keys.window(pid)))).items():
            pttl = int(pttl)
            if pttl < 0 or raw is None:  # no window (expired, or none ever opened): nothing of it can act
                out[pid] = 0
                continue
            longest = int(raw)
            cut = longest - timeout_ms if 0 < timeout_ms <= longest else 0
            out[pid] = max(0, pttl - cut)
        return out

    def stale(self) -> list[InstanceView]:
        """Instances that own runs (or have runs incoming) but hold no lease (sorted by id) — earlier incarnations
        included."""
        live = self.live()
        return [self.view(pid) for pid in sorted((self._ids("owned") | self._ids("incoming")) - live)]

    def disown_many(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Take each ``(instance, run_id)`` off the instance's owned and incoming sets (pipelined; each pair in the
        instance's slot).

        Raises:
            redis.RedisError: Redis failed (any of the removals may have happened; running it again is harmless).
        """
        pipe = self.r.pipeline(transaction=False)
        queued = False
        for instance, run_id in pairs:
            pipe.srem(self.owned_key(instance), run_id)
            pipe.srem(self.keys.incoming(instance), run_id)
            queued = True
        if queued:
            pipe.execute()

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

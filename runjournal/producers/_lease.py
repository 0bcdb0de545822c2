"""Instance leases, incarnations, owned-run sets and run-id claims in Redis (docs/design/protocol.md § Recovery job).

Keys (named by ``runjournal.core.redis_keys``; the instance's keys share the hash tag ``{P:i:<instance>}``,
so the compare-and-set scripts below touch one Redis Cluster slot):

* ``rj:{P:i:<name>}:incarnation`` — counter, INCRed by every Journal started under ``name`` (the
  ``producer_id`` it was given). Incarnation *n* of ``name`` is the **instance** ``name`` (n = 1) or
  ``name#n`` (n >= 2) — the node-path rule (``book``, ``book#2``). The instance id is what the
  Journal writes as ``producer_id``, its ``transactional.id`` base and the suffix of its keys, so a
  process restarted under the same name is a new instance: it fences nothing of the earlier one
  and never takes over its owned set; recovery sees the earlier instance as dead and resumes its runs.
* ``rj:{P:i:<instance>}:lease`` — string, JSON ``{producer_id, name, incarnation, transactional_id, pid,
  host, started_at_ms, ttl_ms}``, TTL ``ttl_ms``, taken with SET NX. **Compare-and-set everywhere**:
  the heartbeat extends it only while it still holds this instance's value (:data:`_RENEW`); a lapsed
  lease is never revived — the lapse fences the instance (it must restart as a new incarnation).
  Deleted (compare-and-delete) on clean close. No key: the instance is dead (or a paused zombie).
* ``rj:{P:i:<instance>}:owned`` — set of run ids the instance writes; added (only while the lease is
  ours, :data:`_OWN`) on start/resume before the first event, removed after the terminal event.
* ``rj:{P:i:<instance>}:window`` — string, *T*: the longest ``timeout_ms`` of a tool the instance may have sent a
  request for; TTL at least ``ttl_ms`` + *T* past every moment the instance could still send (:data:`_OPEN` before a
  side effect's request, :data:`_RENEW` on every heartbeat). Its PTTL is how much longer a request of the
  instance may still act at a provider — measured by Redis's clock alone, so the recovery job waits it out without
  comparing two hosts' wall clocks (docs/design/protocol.md § Zombies). Never deleted: it expires.
* ``rj:{P:r:<run_id>}:claim`` — string, the instance that started the run (SET NX): ``start_run`` refuses
  a run id that exists (``RunExistsError``). No TTL; the recovery job deletes it (compare-and-delete)
  only for a run with no fact in the journal after fencing its starter (``no_facts``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from runjournal.core.redis_keys import RedisKeys
from runjournal.producers.errors import JournalError, LeaseLapsedError, RunExistsError

__all__ = [
    "InstanceLease",
    "incarnation_key",
    "instance_id",
    "lease_key",
    "owned_key",
    "run_id_key",
    "window_key",
]

log = logging.getLogger("runjournal.producers.lease")

#: Compare-and-delete: delete KEYS[1] only while it holds ARGV[1].
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end"
#: Compare-and-extend: re-arm the lease TTL (ARGV[2] ms) only while it holds our value (ARGV[1]), and the effect
#: window (KEYS[2], value T) to ARGV[2] + T from now: the instance may send until its lease's local validity ends
#: (at most ARGV[2] ms from now), and a request sent then may act T ms longer.
_RENEW = ("if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end "
          "redis.call('PEXPIRE', KEYS[1], ARGV[2]) "
          "local t = redis.call('GET', KEYS[2]) "
          "if t then redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]) + tonumber(t)) end "
          "return 1")
#: Before a side effect's request: while the lease (KEYS[1]) holds our value (ARGV[1]), raise the effect window's
#: T (KEYS[2]) to the tool's timeout (ARGV[3] ms) and make it last at least lease ttl (ARGV[2]) + T from now.
#: Returns 1, or 0 when the lease is not ours (nothing written).
_OPEN = ("if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end "
         "local t = tonumber(redis.call('GET', KEYS[2]) or '0') local want = tonumber(ARGV[3]) "
         "if want > t then t = want redis.call('SET', KEYS[2], t) end "
         "local ms = tonumber(ARGV[2]) + t "
         "if redis.call('PTTL', KEYS[2]) < ms then redis.call('PEXPIRE', KEYS[2], ms) end "
         "return 1")
#: Own a run only while the lease is ours: KEYS = lease, owned set; ARGV = lease value, run id.
_OWN = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('SADD', KEYS[2], ARGV[2]) + 1 else return 0 end"
#: Give a run up while the lease is ours: KEYS = lease, owned set, surrendered hash; ARGV = lease value, run id,
#: epoch. The run leaves the owned set and enters the surrendered hash in one step (one slot: the instance's).
_SURRENDER = ("if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end "
              "redis.call('SREM', KEYS[2], ARGV[2]) redis.call('HSET', KEYS[3], ARGV[2], ARGV[3]) return 1")
_MAX_INCARNATION_TRIES = 16


def lease_key(prefix: str, instance: str) -> str:
    """``rj:{P:i:<instance>}:lease`` (``RedisKeys.lease``)."""
    return RedisKeys(prefix).lease(instance)


def owned_key(prefix: str, instance: str) -> str:
    """``rj:{P:i:<instance>}:owned`` (``RedisKeys.owned``)."""
    return RedisKeys(prefix).owned(instance)


def window_key(prefix: str, instance: str) -> str:
    """``rj:{P:i:<instance>}:window`` (``RedisKeys.window``)."""
    return RedisKeys(prefix).window(instance)


def incarnation_key(prefix: str, name: str) -> str:
    """``rj:{P:i:<name>}:incarnation`` (``RedisKeys.incarnation``)."""
    return RedisKeys(prefix).incarnation(name)


def run_id_key(prefix: str, run_id: str) -> str:
    """``rj:{P:r:<run_id>}:claim`` (``RedisKeys.claim``)."""
    return RedisKeys(prefix).claim(run_id)


def instance_id(name: str, incarnation: int) -> str:
    """Incarnation ``incarnation`` (1-based) of ``name``: ``name`` for the first, ``name#n`` after."""
    return name if incarnation == 1 else f"{name}#{incarnation}"


def _text(raw: Any) -> str | None:
    if raw is None:
        return None
    return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)


class InstanceLease:
    """One instance's lease, owned set and run-id claims. Methods raise ``redis.RedisError`` unless stated.

    Args:
        redis_client: a client from ``runjournal.core.redis_client`` (one server or a cluster).
        prefix: key prefix.
        name: the producer_id the Journal was given (no ``#``: it separates the incarnation).
        ttl_ms: lease TTL, ms (>= 300).

    Attributes (set by :meth:`acquire`): ``instance`` (the instance id), ``incarnation``, ``key``,
    ``owned_key``, ``value``.
    """

    def __init__(self, redis_client: Any, prefix: str, name: str, ttl_ms: int) -> None:
        if ttl_ms < 300:
            raise ValueError(f"lease ttl_ms must be >= 300, got {ttl_ms}")
        if not name or "#" in name:
            raise ValueError(f"producer_id must be non-empty without '#' (it marks the incarnation): {name!r}")
        self._r = redis_client
        self._prefix = prefix
        self.name = name
        self.ttl_ms = ttl_ms
        self.instance = name
        self.incarnation = 0
        self.key = lease_key(prefix, name)
        self.owned_key = owned_key(prefix, name)
        self.window_key = window_key(prefix, name)
        self.value = ""
        self.window_ms = 0
        """The effect window's T this instance has stored (ms): requests of tools with ``timeout_ms`` up to it are
        covered by the window the heartbeat keeps extending, even while Redis cannot be reached."""
        self._want_window_ms = 0
        self.lapses = 0
        """1 once the lease was found lapsed (or its validity ran out while Redis was unreachable)."""
        self._lapsed = threading.Event()
        self._released = False
        self._valid_until = 0.0
        self._probe_lock = threading.Lock()
        self._probe_pool: ThreadPoolExecutor | None = None
        self._next_probe: Future[bool] | None = None
        self._renew = redis_client.register_script(_RENEW)
        self._own = redis_client.register_script(_OWN)
        self._open = redis_client.register_script(_OPEN)
        self._release = redis_client.register_script(_RELEASE)
        self._surrender = redis_client.register_script(_SURRENDER)

    # -- life ---------------------------------------------------------------------------------------
    def acquire(self, transactional_id_of: Callable[[str], str]) -> str:
        """Take a new incarnation's lease (INCR the name's counter, SET NX the instance's lease).

        Args:
            transactional_id_of: instance id -> its transactional.id (recorded in the lease value).

        Returns:
            The instance id.

        Raises:
            JournalError: no free incarnation after 16 tries (leases of live instances hold them).
        """
        for _ in range(_MAX_INCARNATION_TRIES):
            incarnation = int(self._r.incr(incarnation_key(self._prefix, self.name)))
            instance = instance_id(self.name, incarnation)
            value = json.dumps({"producer_id": instance, "name": self.name, "incarnation": incarnation,
                                "transactional_id": transactional_id_of(instance), "pid": os.getpid(),
                                "host": socket.gethostname(), "started_at_ms": int(time.time() * 1000),
                                "ttl_ms": self.ttl_ms}, sort_keys=True)
            started = time.monotonic()
            if self._r.set(lease_key(self._prefix, instance), value, px=self.ttl_ms, nx=True):
                self.instance, self.incarnation, self.value = instance, incarnation, value
                self.key, self.owned_key = lease_key(self._prefix, instance), owned_key(self._prefix, instance)
                self.window_key = window_key(self._prefix, instance)
                self._valid_until = started + self.ttl_ms / 1000
                return instance
            # A live lease holds this id: the counter was reset (Redis wiped) under a live instance.
        raise JournalError(f"no free incarnation of {self.name}: leases of {self.name}#… "
                           f"({lease_key(self._prefix, self.name + '#n')}) are held")

    @property
    def lapsed(self) -> bool:
        """True once the lease was found lapsed: the instance is fenced for good."""
        return self._lapsed.is_set()

    def renew(self) -> bool:
        """Extend the lease by ``ttl_ms`` if it still holds our value (compare-and-set).

        Returns:
            True when extended; False when it had lapsed (absent or another value): the instance is
            fenced from now on (``lapsed``), and nothing is written.

        Raises:
            redis.RedisError: Redis is unreachable (nothing is known; see :meth:`expired_locally`).
        """
        if self.lapsed or self._released:
            return False
        started = time.monotonic()
        if self._renew(keys=[self.key, self.window_key], args=[self.value, self.ttl_ms]):
            self._valid_until = started + self.ttl_ms / 1000
            return True
        self.mark_lapsed("the lease key is gone or holds another value")
        return False

    def expired_locally(self) -> bool:
        """True when ``ttl_ms`` passed since the last successful (re)arm began: Redis has dropped the key
        (whatever Redis answers now), so an unreachable Redis cannot keep a zombie alive."""
        return time.monotonic() >= self._valid_until

    def mark_lapsed(self, why: str) -> None:
        """Record the lapse (once); logs why."""
        if not self._lapsed.is_set():
            self._lapsed.set()
            self.lapses += 1
            log.error("lease %s lapsed (%s): this instance is fenced and must restart as a new incarnation",
                      self.key, why)

    def still_ours(self, window_ms: int = 0) -> bool:
        """True while the lease key holds our value. Lapsed → False. Redis unreachable → True only within
        the local validity (``ttl_ms`` since the last successful arm), else the lease is marked lapsed.

        Args:
            window_ms: the ``timeout_ms`` of a tool about to send a request (0: none). The effect window is raised
                to cover it in the same script (:data:`_OPEN`); with Redis unreachable the answer is True only
                when the stored window already covers it (:attr:`window_ms`) — a request the recovery job could
                not wait out is not sent (the lease is marked lapsed).
        """
        if self.lapsed or self._released:
            return False
        try:
            if window_ms > 0:
                ours = bool(self._open(keys=[self.key, self.window_key], args=[self.value, self.ttl_ms, window_ms]))
                if ours:
                    self.window_ms = max(self.window_ms, window_ms)
            else:
                ours = _text(self._r.get(self.key)) == self.value
        except Exception as exc:  # noqa: BLE001 - any client failure: fall back to the local clock
            if self.expired_locally():
                self.mark_lapsed(f"Redis unreachable ({exc}) past the lease's validity")
                return False
            if window_ms > self.window_ms:
                self.mark_lapsed(f"Redis unreachable ({exc}) and the effect window does not cover a "
                                 f"{window_ms} ms tool timeout (stored: {self.window_ms} ms)")
                return False
            log.warning("cannot read lease %s (%s); still within its validity", self.key, exc)
            return True
        if not ours:
            self.mark_lapsed("the lease key is gone or holds another value")
        return ours

    def probe(self, window_ms: int = 0) -> Future[bool]:
        """Start :meth:`still_ours` in the lease's probe thread and return its future at once, so the read can
        overlap other waiting (``Journal.check_still_owner``: the intent's commit). The GET is sent after this
        call returns, so a True answer says the lease was ours at some moment after the call. Concurrent callers
        share the next GET not yet sent (one probe thread, at most one GET waiting): 64 threads asking at once
        cost one or two round trips, not 64. ``window_ms``: see :meth:`still_ours` (the shared read covers the
        largest asked for by any of its callers)."""
        with self._probe_lock:
            self._want_window_ms = max(self._want_window_ms, window_ms)
            if self._next_probe is None:
                if self._probe_pool is None:
                    self._probe_pool = ThreadPoolExecutor(1, thread_name_prefix=f"journal-lease-probe-{self.instance}")
                self._next_probe = Future()
                self._probe_pool.submit(self._run_probe, self._next_probe)
            return self._next_probe

    def _run_probe(self, answer: Future[bool]) -> None:
        with self._probe_lock:
            self._next_probe = None  # a caller from now on needs a GET sent after it asked: the next one
            want = self._want_window_ms  # every caller sharing this read raised it before it was taken
        try:
            answer.set_result(self.still_ours(want))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            answer.set_exception(exc)

    def release(self) -> None:
        """Delete the lease if it is still ours (close, or a fence at the broker); it is never renewed again."""
        self._released = True
        with self._probe_lock:
            pool, self._probe_pool = self._probe_pool, None
        if pool is not None:
            pool.shutdown(wait=False)
        self._release(keys=[self.key], args=[self.value])

    # -- runs ---------------------------------------------------------------------------------------
    def claim_run_id(self, run_id: str) -> None:
        """Register a new run id as started by this instance, and own it — refused for an existing id.

        One round trip (a pipeline, not a transaction: the claim is in the run's slot, the own script in the
        instance's): SET NX ``rj:{P:r:<run_id>}:claim`` and the compare-and-set own (a plain EVAL: a Redis
        Cluster pipeline routes it by its keys, but carries no EVALSHA).

        Raises:
            RunExistsError: the run id exists (it names the instance that started it).
            LeaseLapsedError: the lease is no longer ours (nothing is left claimed).
        """
        claim = run_id_key(self._prefix, run_id)
        pipe = self._r.pipeline(transaction=False)
        pipe.set(claim, self.instance, nx=True)
        pipe.get(claim)
        pipe.execute_command("EVAL", _OWN, 2, self.key, self.owned_key, self.value, run_id)
        claimed, holder, owned = pipe.execute()
        if not claimed:
            if int(owned) == 2:  # SADD added it: undo
                self._r.srem(self.owned_key, run_id)
            raise RunExistsError(run_id, _text(holder))
        if not int(owned):
            self.unclaim_run_id(run_id)
            self.mark_lapsed("found lost when starting a run")
            raise LeaseLapsedError(f"instance {self.instance} lost its lease {self.key}; run {run_id} not started")

    def unclaim_run_id(self, run_id: str) -> None:
        """Free a run id this instance claimed but never published (compare-and-delete); errors only logged."""
        try:
            self._r.eval(_RELEASE, 1, run_id_key(self._prefix, run_id), self.instance)
        except Exception as exc:  # noqa: BLE001 - the id stays taken: harmless, the caller picks another
            log.warning("could not free run id %s: %s", run_id, exc)

    def own(self, run_id: str) -> None:
        """Add ``run_id`` to the owned set while the lease is ours (compare-and-set).

        Raises:
            LeaseLapsedError: the lease is no longer ours.
        """
        if not int(self._own(keys=[self.key, self.owned_key], args=[self.value, run_id])):
            self.mark_lapsed("found lost when taking a run")
            raise LeaseLapsedError(f"instance {self.instance} lost its lease {self.key}; not taking run {run_id}")

    def surrender(self, run_id: str, epoch: int) -> bool:
        """Move ``run_id`` from the owned set to the surrendered hash (value ``epoch``) while the lease is ours.

        Returns:
            True when written; False when the lease is no longer ours (the instance counts as dead: the recovery
            job fences it and resumes the run from its owned set).

        Raises:
            redis.RedisError: Redis failed (nothing, or all of it, was written: one script).
        """
        keys = [self.key, self.owned_key, RedisKeys(self._prefix).surrendered(self.instance)]
        return bool(int(self._surrender(keys=keys, args=[self.value, run_id, epoch])))

    def disown(self, run_id: str) -> None:
        """Remove ``run_id`` from the owned set."""
        self._r.srem(self.owned_key, run_id)

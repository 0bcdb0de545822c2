"""Redis layout of the projection and the one atomic write per partition batch.

Keys (``P`` = topic prefix, ``p`` = partition; ``{P.p}`` is the Redis Cluster hash tag, so a
partition's keys live in one slot and one script may touch them all — docs/design/protocol.md § Projector; every
key name lives in ``runjournal.core.redis_keys``):

* ``rj:{P.p}:offset`` — the partition's applied offset: the last offset whose effect is in Redis.
* ``rj:{P.p}:run:<run_id>`` — the run's state JSON (``RunState.to_json``, execution records included).
* ``rj:{P.p}:runs`` — set of the partition's run ids.
* ``rj:{P.p}:index`` — hash run_id → the run's summary JSON, for lists (``runjournal.consumers.projector.index``).
* ``rj:{P.p}:live`` — hash run_id → ``<epoch>:<owner>`` of the runs neither ended nor parked: how recovery finds
  a run whose owner holds no lease from the journal's facts, whatever Redis set was lost (:meth:`ProjectionStore.live`).

Redis itself holds the truth of what Redis has applied: the state of every run touched by a
batch and the partition's offset change in one ``EVALSHA`` (see ``_APPLY_LUA``). The script
refuses a batch computed from a stale view (the stored offset is not the one the batch was
folded from): the caller reloads from Redis and re-seeks. A batch at or below the stored
offset is a no-op — a redelivered batch changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from runjournal.consumers.projector.index import summary_json
from runjournal.core import redis_client
from runjournal.core.redis_keys import RedisKeys, partition_tag
from runjournal.model.reducer import RunState, RunStatus

__all__ = ["ApplyResult", "PreparedBatch", "ProjectionStore", "partition_tag"]

_APPLY_LUA = """
-- KEYS[1] offset key, KEYS[2] runs-set key, KEYS[3] index key, KEYS[4] live key, KEYS[5..4+n] run keys
-- ARGV[1] expected current offset ('-1' = none), ARGV[2] new offset, ARGV[3] n,
-- ARGV[4..3+n] state JSON ('' = delete the run), ARGV[4+n..3+2n] run ids, ARGV[4+2n..3+3n] summaries,
-- ARGV[4+3n..3+4n] live entries ('<epoch>:<owner>', '' = not live: ended, parked or ownerless)
local cur = redis.call('GET', KEYS[1])
if not cur then cur = '-1' end
if tonumber(cur) >= tonumber(ARGV[2]) then return {0, cur} end
if cur ~= ARGV[1] then return {-1, cur} end
local n = tonumber(ARGV[3])
for i = 1, n do
  local value = ARGV[3 + i]
  local run_id = ARGV[3 + n + i]
  local live = ARGV[3 + 3 * n + i]
  if value == '' then
    redis.call('DEL', KEYS[4 + i])
    redis.call('SREM', KEYS[2], run_id)
    redis.call('HDEL', KEYS[3], run_id)
  else
    redis.call('SET', KEYS[4 + i], value)
    redis.call('SADD', KEYS[2], run_id)
    redis.call('HSET', KEYS[3], run_id, ARGV[3 + 2 * n + i])
  end
  if live == '' then redis.call('HDEL', KEYS[4], run_id) else redis.call('HSET', KEYS[4], run_id, live) end
end
redis.call('SET', KEYS[1], ARGV[2])
return {1, ARGV[2]}
"""


_NOT_LIVE = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.GAP, RunStatus.BLOCKED,
                       RunStatus.PAUSED})  # paused: held by nobody, never an orphan (decisions/0047)


def live_entry(state: RunState | None) -> str:
    """``<epoch>:<owner>`` for a run neither ended nor parked with an owner; ``""`` otherwise (not live)."""
    if state is None or state.status in _NOT_LIVE or not state.owner:
        return ""
    return f"{state.epoch}:{state.owner}"


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


@dataclass(frozen=True)
class ApplyResult:
    """Outcome of :meth:`ProjectionStore.apply_batch`."""

    status: str
    """``"applied"``, ``"duplicate"`` (already applied: a redelivery) or ``"conflict"`` (stale view)."""
    stored_offset: int
    """The partition's applied offset in Redis after the call (-1: none)."""


@dataclass(frozen=True)
class PreparedBatch:
    """One partition batch serialised for the apply script (:meth:`ProjectionStore.prepare_batch`)."""

    partition: int
    """The source partition (its keys share the hash tag ``{P.p}``)."""
    expected_offset: int
    """The applied offset the batch was folded from (-1: none); the script refuses the batch unless Redis holds it."""
    new_offset: int
    """The last offset the batch handled; the partition's applied offset once the script ran."""
    keys: list[str]
    """``KEYS`` of ``_APPLY_LUA``: offset, runs set, index, live runs, then one key per run."""
    args: list[Any]
    """``ARGV`` of ``_APPLY_LUA``: the two offsets, the run count, the state JSONs, the run ids, the summaries, the
    live entries."""


class ProjectionStore:
    """Run states and applied offsets in Redis, for one topic prefix.

    Args:
        client: a client from ``runjournal.core.redis_client`` (one server or a cluster; ``decode_responses=False``).
        prefix: the topic prefix (``Settings.topic_prefix``); keys never collide across prefixes.
    """

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.keys = RedisKeys(prefix)
        # register_script runs EVALSHA and, on NOSCRIPT (Redis restarted or flushed), loads and retries.
        self._apply = client.register_script(_APPLY_LUA)

    # -- keys -----------------------------------------------------------------------------
    def offset_key(self, partition: int) -> str:
        """``rj:{P.p}:offset``."""
        return self.keys.offset(partition)

    def runs_key(self, partition: int) -> str:
        """``rj:{P.p}:runs``."""
        return self.keys.runs(partition)

    def index_key(self, partition: int) -> str:
        """``rj:{P.p}:index`` (run_id → summary JSON; ``runjournal.consumers.projector.index``)."""
        return self.keys.index(partition)

    def live_key(self, partition: int) -> str:
        """``rj:{P.p}:live`` (run_id → ``<epoch>:<owner>`` of the runs neither ended nor parked)."""
        return self.keys.live(partition)

    def live(self, partitions: Iterable[int]) -> dict[str, tuple[int, str]]:
        """run_id → (epoch, owner) of every run the projection shows neither ended nor parked, in ``partitions``:
        one pipelined HGETALL per partition. Cost grows with the runs in flight, not with history.

        Raises:
            redis.RedisError: Redis failed.
        """
        parts = list(partitions)
        if not parts:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for p in parts:
            pipe.hgetall(self.live_key(p))
        out: dict[str, tuple[int, str]] = {}
        for entries in pipe.execute():
            for run_id, value in entries.items():
                epoch, _, owner = _text(value).partition(":")
                out[_text(run_id)] = (int(epoch), owner)
        return out

    def run_key(self, partition: int, run_id: str) -> str:
        """``rj:{P.p}:run:<run_id>``."""
        return self.keys.run(partition, run_id)

    # -- reads ----------------------------------------------------------------------------
    def applied_offset(self, partition: int) -> int:
        """The partition's applied offset, -1 when nothing was applied (seek to offset + 1)."""
        raw = self.client.get(self.offset_key(partition))
        return int(raw) if raw is not None else -1

    def load(self, partition: int, run_ids: Iterable[str]) -> dict[str, RunState]:
        """States of ``run_ids`` (one MGET); runs not in Redis are absent from the result."""
        ids = list(run_ids)
        if not ids:
            return {}
        raw = self.client.mget([self.run_key(partition, r) for r in ids])
        return {rid: RunState.from_json(val) for rid, val in zip(ids, raw, strict=True) if val is not None}

    def snapshot(self, runs_by_partition: Mapping[int, Iterable[str]]) -> dict[int, tuple[int, dict[str, RunState]]]:
        """Each partition's applied offset, then the states of its runs: 1 + one round trip per partition.

        Every offset is read before any state, so each state is a snapshot at or after its partition's offset
        (what a tail fold from ``offset + 1`` needs): one pipeline of GETs (each in its partition's slot; a
        cluster pipeline sends each to its node), then one MGET per partition (one slot).

        Args:
            runs_by_partition: partition -> run ids.

        Returns:
            partition -> ``(applied offset (-1: none), run_id -> state)``; runs not in Redis are absent.

        Raises:
            redis.RedisError: Redis unreachable or refused (nothing is written).
            StateFormatError: a stored state cannot be read.
        """
        if not runs_by_partition:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for p in runs_by_partition:
            pipe.get(self.offset_key(p))
        offsets = [int(raw) if raw is not None else -1 for raw in pipe.execute()]
        return {p: (off, self.load(p, ids)) for (p, ids), off in zip(runs_by_partition.items(), offsets, strict=True)}

    def get(self, partition: int, run_id: str) -> RunState | None:
        """One run's state, or None."""
        raw = self.client.get(self.run_key(partition, run_id))
        return RunState.from_json(raw) if raw is not None else None

    def run_ids(self, partition: int) -> set[str]:
        """All run ids projected in ``partition``."""
        return {m.decode() for m in self.client.smembers(self.runs_key(partition))}

    def run_ids_upto(self, partition: int, limit: int) -> set[str] | None:
        """:meth:`run_ids`, or None when the partition holds more than ``limit`` runs (not read).

        Read after the applied offset it is to go with: the apply script adds a run to the set only as it moves the
        offset, so a set read later holds at least the runs Redis had at that offset.
        """
        if int(self.client.scard(self.runs_key(partition))) > limit:
            return None
        return self.run_ids(partition)

    # -- the one write ------------------------------------------------------------------------
    def apply_batch(
        self, partition: int, *, expected_offset: int, new_offset: int, states: Mapping[str, RunState | None]
    ) -> ApplyResult:
        """Write ``states`` (None = erase the run), their index entries, and the applied offset, atomically.

        :meth:`prepare_batch` then :meth:`run_batch` (the projector calls the two apart: it serialises on its
        main thread and runs the script on its write-behind thread).

        Args:
            partition: the source partition.
            expected_offset: the applied offset the batch was folded from (-1: none).
            new_offset: the last offset handled by the batch.
            states: run_id -> new state, or None to delete the run (a tombstone).

        Returns:
            :class:`ApplyResult`; ``conflict`` means reload states and re-seek to ``stored_offset + 1``.

        Raises:
            redis.RedisError: Redis unreachable (the caller retries with backoff; nothing was written).
        """
        return self.run_batch(self.prepare_batch(partition, expected_offset=expected_offset, new_offset=new_offset,
                                                 states=states))

    def prepare_batch(
        self, partition: int, *, expected_offset: int, new_offset: int, states: Mapping[str, RunState | None]
    ) -> PreparedBatch:
        """The apply script's keys and arguments for one batch (see :meth:`apply_batch` for the arguments): every
        state serialised (``RunState.to_json_bytes``, ~12 KB for a run with 12 calls) with its index entry.

        Raises:
            UnicodeEncodeError: a string of a state holds a lone surrogate (never so for decoded events).
        """
        ids = list(states)
        keys = [self.offset_key(partition), self.runs_key(partition), self.index_key(partition),
                self.live_key(partition), *(self.run_key(partition, r) for r in ids)]
        values = [s.to_json_bytes() if s is not None else b"" for s in states.values()]
        summaries = [summary_json(s) if s is not None else b"" for s in states.values()]
        live = [live_entry(s) for s in states.values()]
        args: list[Any] = [str(expected_offset), str(new_offset), str(len(ids)), *values, *ids, *summaries, *live]
        return PreparedBatch(partition, expected_offset, new_offset, keys, args)

    def run_batch(self, batch: PreparedBatch) -> ApplyResult:
        """Run the apply script for a :meth:`prepare_batch` result: one ``EVALSHA`` (``EVAL`` after a NOSCRIPT).

        Thread-safe (redis-py's connection pool): the projector runs it on its write-behind thread.

        Returns:
            :class:`ApplyResult`.

        Raises:
            redis.RedisError: Redis unreachable or the reply lost — then the batch may or may not be applied: read
                the applied offset again before anything else.
        """
        code, stored = self._apply(keys=batch.keys, args=batch.args)
        status = {1: "applied", 0: "duplicate", -1: "conflict"}[int(code)]
        return ApplyResult(status=status, stored_offset=int(stored))

    def wipe(self) -> int:
        """Delete every projection key of this prefix and its topic identity (``projector --rebuild``).

        Keys are found by SCAN on every primary of a cluster (``redis_client.delete_matching``), with globs that
        match this prefix's partitions only (``RedisKeys.partition_globs``).

        Returns:
            Keys deleted.
        """
        deleted = int(self.client.delete(self.keys.topic_identity()))  # the topic identity (topic_identity)
        return deleted + redis_client.delete_matching(self.client, self.keys.partition_globs())

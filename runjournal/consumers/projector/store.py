"""Redis layout of the projection and the one atomic write per partition batch.

Keys (``P`` = topic prefix, ``p`` = partition; ``{P.p}`` is the Redis Cluster hash tag, so a
partition's keys live in one slot and one script may touch them all — docs/design/protocol.md § Projector; every
key name lives in ``runjournal.core.redis_keys``):

* ``rj:{P.p}:offset`` — the partition's applied offset: the last offset whose effect is in Redis.
* ``rj:{P.p}:run:<run_id>`` — the run's state as a hash (``runjournal.model.stored``): field ``s`` its scalar
  summary (JSON), then one field per execution record ``r:<call_id>``, node ``n:<node_path>``, approval decision
  ``a:<call_id>`` and pending approval ``p:<call_id>`` (each that entry's JSON). A batch writes only the fields it
  changed (``HSET`` / ``HDEL``): its cost follows the batch, not the run's length (issue 29,
  docs/design/decisions/0051-a-hash-per-run.md). A projection written before holds the run as one JSON string
  (``RunState.to_json``): readers take either; the first batch that touches such a run writes its whole hash.
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

import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from runjournal.consumers.projector.index import summary_json
from runjournal.core import redis_client
from runjournal.core.redis_keys import RedisKeys, partition_tag
from runjournal.model.pmap import PMap
from runjournal.model.reducer import RunState, RunStatus
from runjournal.model.stored import MAP_PREFIXES, field_diff, state_fields, state_from_fields

__all__ = ["ApplyResult", "PreparedBatch", "ProjectionStore", "partition_tag"]

_APPLY_LUA = """
-- KEYS[1] offset key, KEYS[2] runs-set key, KEYS[3] index key, KEYS[4] live key, KEYS[4+i] the hash of run i
-- ARGV[1] expected current offset ('-1' = none), ARGV[2] new offset, ARGV[3] n (runs), then per run, in KEYS order:
--   run_id, mode ('F' the whole hash: DEL then HSET; 'D' the fields the batch changed; 'X' erase the run),
--   summary (index entry), live ('<epoch>:<owner>', '' = not live), s (fields set), d (fields removed),
--   then s (field, value) pairs, then d fields
-- A 'D' run whose key is not a hash (erased meanwhile, or still the JSON string of the layout before the hash) makes
-- the batch a conflict, checked before anything is written: the projector reloads from Redis and folds again.
local cur = redis.call('GET', KEYS[1])
if not cur then cur = '-1' end
if tonumber(cur) >= tonumber(ARGV[2]) then return {0, cur} end
if cur ~= ARGV[1] then return {-1, cur} end
local n = tonumber(ARGV[3])
local a = 4
for i = 1, n do
  if ARGV[a + 1] == 'D' and redis.call('TYPE', KEYS[4 + i]).ok ~= 'hash' then return {-1, cur} end
  a = a + 6 + 2 * tonumber(ARGV[a + 4]) + tonumber(ARGV[a + 5])
end
a = 4
for i = 1, n do
  local key = KEYS[4 + i]
  local run_id, mode, summary, live = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local s, d = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  a = a + 6
  if mode == 'X' then
    redis.call('DEL', key)
    redis.call('SREM', KEYS[2], run_id)
    redis.call('HDEL', KEYS[3], run_id)
  else
    if mode == 'F' then redis.call('DEL', key) end
    local j = 0
    while j < s do
      local m = math.min(s - j, 256)
      local args = {key}
      for k = 0, m - 1 do
        args[2 * k + 2] = ARGV[a + 2 * (j + k)]
        args[2 * k + 3] = ARGV[a + 2 * (j + k) + 1]
      end
      redis.call('HSET', unpack(args))
      j = j + m
    end
    a = a + 2 * s
    j = 0
    while j < d do
      local m = math.min(d - j, 256)
      local args = {key}
      for k = 0, m - 1 do args[k + 2] = ARGV[a + j + k] end
      redis.call('HDEL', unpack(args))
      j = j + m
    end
    a = a + d
    redis.call('SADD', KEYS[2], run_id)
    redis.call('HSET', KEYS[3], run_id, summary)
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
    """``ARGV`` of ``_APPLY_LUA``: the two offsets, the run count, then per run its id, mode (``F`` whole hash,
    ``D`` changed fields, ``X`` erase), index entry, live entry, the counts of fields set and removed, the
    (field, value) pairs set and the fields removed."""


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
        # States read from the layout before the hash (one JSON string): id -> state. A batch folded from one writes
        # the run's whole hash (DEL, then every field), never a diff onto a string.
        self._legacy: weakref.WeakValueDictionary[int, RunState] = weakref.WeakValueDictionary()

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
        """States of ``run_ids``: one pipelined HGETALL per run (one slot, one round trip); a run still held in the
        layout before the hash (a JSON string: WRONGTYPE) is read with GET in a second round trip.

        Returns:
            run_id -> state; runs not in Redis are absent.

        Raises:
            redis.RedisError: Redis unreachable or refused.
            StateFormatError: a stored state cannot be read.
        """
        ids = list(run_ids)
        if not ids:
            return {}
        keys = [self.run_key(partition, r) for r in ids]
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(key)
        replies = pipe.execute(raise_on_error=False)
        out: dict[str, RunState] = {}
        legacy: list[int] = []
        for i, reply in enumerate(replies):
            if isinstance(reply, redis.ResponseError) and str(reply).startswith("WRONGTYPE"):
                legacy.append(i)
            elif isinstance(reply, BaseException):
                raise reply
            elif reply:
                out[ids[i]] = state_from_fields(reply)
        if legacy:
            pipe = self.client.pipeline(transaction=False)
            for i in legacy:
                pipe.get(keys[i])
            again: list[str] = []
            for i, value in zip(legacy, pipe.execute(raise_on_error=False), strict=True):
                if isinstance(value, redis.ResponseError) and str(value).startswith("WRONGTYPE"):
                    again.append(ids[i])  # upgraded to a hash between the two reads: read it as one
                elif isinstance(value, BaseException):
                    raise value
                elif value is not None:
                    state = out[ids[i]] = RunState.from_json(value)
                    self._legacy[id(state)] = state
            if again:
                out.update(self.load(partition, again))
        return out

    def snapshot(self, runs_by_partition: Mapping[int, Iterable[str]]) -> dict[int, tuple[int, dict[str, RunState]]]:
        """Each partition's applied offset, then the states of its runs: 1 + one round trip per partition.

        Every offset is read before any state, so each state is a snapshot at or after its partition's offset
        (what a tail fold from ``offset + 1`` needs): one pipeline of GETs (each in its partition's slot; a
        cluster pipeline sends each to its node), then one pipeline of HGETALLs per partition (:meth:`load`).

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
        """One run's state, or None (:meth:`load` of one run: the hash, or the JSON string of a projection written
        before the hash).

        Raises:
            redis.RedisError: Redis unreachable or refused.
            StateFormatError: the stored state cannot be read.
        """
        return self.load(partition, [run_id]).get(run_id)

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
        self, partition: int, *, expected_offset: int, new_offset: int, states: Mapping[str, RunState | None],
        before: Mapping[str, RunState | None] | None = None,
    ) -> ApplyResult:
        """Write ``states`` (None = erase the run), their index entries, and the applied offset, atomically.

        :meth:`prepare_batch` then :meth:`run_batch` (the projector calls the two apart: it serialises on its
        main thread and runs the script on its write-behind thread).

        Args:
            partition: the source partition.
            expected_offset: the applied offset the batch was folded from (-1: none).
            new_offset: the last offset handled by the batch.
            states: run_id -> new state, or None to delete the run (a tombstone).
            before: run_id -> the state Redis holds for it at ``expected_offset`` (absent or None: none, or not
                known), as :meth:`load` read it or an earlier batch wrote it; a run with one is written as the
                fields that changed since, the others whole. None: every run whole.

        Returns:
            :class:`ApplyResult`; ``conflict`` means reload states and re-seek to ``stored_offset + 1`` (also when
            a run written as a diff is not a hash in Redis: erased meanwhile, or still in the layout before it).

        Raises:
            redis.RedisError: Redis unreachable (the caller retries with backoff; nothing was written).
        """
        return self.run_batch(self.prepare_batch(partition, expected_offset=expected_offset, new_offset=new_offset,
                                                 states=states, before=before))

    def prepare_batch(
        self, partition: int, *, expected_offset: int, new_offset: int, states: Mapping[str, RunState | None],
        before: Mapping[str, RunState | None] | None = None,
    ) -> PreparedBatch:
        """The apply script's keys and arguments for one batch (see :meth:`apply_batch` for the arguments).

        A run whose ``before`` state is given (and was not read from the layout before the hash) is written as the
        hash fields the batch changed (``runjournal.model.stored.field_diff``: the scalar field and the entries set
        or removed, found in O(changes)); any other run whole (DEL, then every field). Each with its index entry
        (O(1): ``summary_json``) and live entry.

        Raises:
            UnicodeEncodeError: a string of a state holds a lone surrogate (never so for decoded events).
        """
        ids = list(states)
        keys = [self.offset_key(partition), self.runs_key(partition), self.index_key(partition),
                self.live_key(partition), *(self.run_key(partition, r) for r in ids)]
        args: list[Any] = [str(expected_offset), str(new_offset), str(len(ids))]
        legacy = self._legacy
        for run_id, state in states.items():
            if state is None:
                args += [run_id, "X", b"", "", "0", "0"]
                continue
            old = before.get(run_id) if before is not None else None
            if old is None or legacy.get(id(old)) is old:
                sets, dels = state_fields(state), []
                mode = "F"
            else:
                sets, dels = field_diff(old, state)
                mode = "D"
            args += [run_id, mode, summary_json(state), live_entry(state), str(len(sets)), str(len(dels))]
            for name in MAP_PREFIXES:  # the next batch diffs against this state: its maps' history is not needed
                written = getattr(state, name)
                if isinstance(written, PMap):
                    written.forget_history()
            for item in sets.items():
                args += item
            args += dels
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

"""Claims that keep an archive and a continuation of the same run apart (decision 0057).

The archiver tombstones a finished run's events; ``continue_run`` reopens a FAILED run with a RUN_RESUMED. Both
at once would leave a live run whose history is tombstoned: the archive read the run before the RUN_RESUMED and
removed it after. Each actor therefore claims the run in Redis (the archive unit ``{P:arc}``, scored by Redis's
``TIME``), *then* looks for the other's claim, and only then reads or writes:

* archiver: claim ``rj:{P:arc}:archiving:<run>`` → see no live ``:reopening:<run>`` claim → read, fold, write,
  verify → (started less than :data:`CLAIM_MS` / 2 ago) → tombstone, remove → release;
* ``continue_run``: claim ``rj:{P:arc}:reopening:<run>`` → see no live ``:archiving:<run>`` claim → recover (fence,
  read, RUN_RESUMED committed) → release.

Redis is linearizable, so of two actors that overlap at least one sees the other's claim and steps back: the
archiver leaves the run due (``RunReopeningError``; the next sweep finds it reopened and drops it), the operator is
told to try again (``RunBeingArchivedError``). A continuation that released its claim has committed its
RUN_RESUMED, so an archive that claims after it reads a run that is not finished. Each actor holds a token of its
own (two archivers, two operators: neither drops the other's), a crashed actor's token expires after
:data:`CLAIM_MS` by Redis's clock, and an archive older than half of it gives up before its tombstones (it may
have outlived its claim while paused).
"""

from __future__ import annotations

import uuid
from typing import Any

from runjournal.core.errors import RunjournalError
from runjournal.core.redis_keys import RedisKeys

__all__ = ["ARCHIVING", "CLAIM_MS", "REOPENING", "RunBeingArchivedError", "RunReopeningError", "claim", "live_claim",
           "redis_now_ms", "release"]

CLAIM_MS = 10 * 60 * 1000
"""How long a claim holds (ms, 10 minutes, by Redis's clock): longer than an archive of one run or a continuation's
recovery pass takes; a crashed actor's claim expires with it."""

ARCHIVING, REOPENING = "archiving", "reopening"

_CLAIM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return now
"""
_LIVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
"""


class RunReopeningError(RunjournalError):
    """The archiver found a continuation of the run in flight: it archived nothing and removed nothing; the run
    stays due (the next sweep finds it reopened, or archives it)."""


class RunBeingArchivedError(RunjournalError):
    """``continue_run`` found an archive of the run in flight: nothing was fenced or published; try again once the
    archiver has finished (the run is then read from the archive)."""


def redis_now_ms(client: Any) -> int:
    """Redis's clock (``TIME``), ms since the epoch: the one clock of every retention and claim decision."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def claim(client: Any, prefix: str, kind: str, run_id: str) -> tuple[str, int]:
    """Claim ``run_id`` for ``kind`` (``archiving`` or ``reopening``): one script adds a token to the sorted set
    ``rj:{P:arc}:<kind>:<run_id>`` scored by its expiry (Redis's ``TIME`` + :data:`CLAIM_MS`) and drops expired
    ones. Several actors of one kind may hold a run at once (two archivers sweeping one due set; two operators,
    whom the recovery job's fencing orders): each holds its own token, and a crashed one's expires.

    Returns:
        ``(token, now_ms)``: the token for :func:`release`, and Redis's clock when the claim was taken (ms).

    Raises:
        redis.RedisError: Redis unreachable (nothing claimed: the caller has done nothing yet).
    """
    token = uuid.uuid4().hex
    now = client.eval(_CLAIM, 1, RedisKeys(prefix).archive_claim(kind, run_id), token, CLAIM_MS)
    return token, int(now)


def live_claim(client: Any, prefix: str, kind: str, run_id: str) -> bool:
    """True while an actor of ``kind`` holds ``run_id`` (a token not released and not expired, by Redis's clock)."""
    return int(client.eval(_LIVE, 1, RedisKeys(prefix).archive_claim(kind, run_id))) > 0


def release(client: Any, prefix: str, kind: str, run_id: str, token: str) -> None:
    """Drop this actor's token from ``run_id``'s claims of ``kind`` (the others' stay)."""
    client.zrem(RedisKeys(prefix).archive_claim(kind, run_id), token)

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
RUN_RESUMED, so an archive that claims after it reads a run that is not finished. A claim is ``SET NX PX``: a
second actor of the same kind steps back too (two archivers sweeping one due set), and a crashed actor's claim
expires after :data:`CLAIM_MS` by Redis's clock; an archive older than half of it gives up before its tombstones.
"""

from __future__ import annotations

import uuid
from typing import Any

from runjournal.core.errors import RunjournalError
from runjournal.core.redis_keys import RedisKeys

__all__ = ["ARCHIVING", "CLAIM_MS", "REOPENING", "RunBeingArchivedError", "RunReopeningError", "claim", "live_claim",
           "redis_now_ms", "release"]

CLAIM_MS = 15 * 60 * 1000
"""How long a claim holds (ms, 15 minutes, Redis's ``PX``): longer than an archive of one run or a continuation's
recovery pass takes; a crashed actor's claim expires with it."""

ARCHIVING, REOPENING = "archiving", "reopening"

_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


class RunReopeningError(RunjournalError):
    """The archiver found a continuation of the run in flight, or another archive of it: it archived nothing and
    removed nothing; the run stays due (the next sweep finds it reopened, or archives it)."""


class RunBeingArchivedError(RunjournalError):
    """``continue_run`` found an archive of the run in flight, or another continuation of it: nothing was fenced or
    published; try again once the archiver has finished (the run is then read from the archive)."""


def redis_now_ms(client: Any) -> int:
    """Redis's clock (``TIME``), ms since the epoch: the one clock of every retention and claim decision."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def claim(client: Any, prefix: str, kind: str, run_id: str) -> str | None:
    """Claim ``run_id`` for ``kind`` (``archiving`` or ``reopening``): ``SET rj:{P:arc}:<kind>:<run_id> <token> NX PX
    CLAIM_MS``. Returns the token (pass it to :func:`release`), or None when another actor of the same kind holds
    the run (two archivers sweeping one due set; two operators continuing one run).

    Raises:
        redis.RedisError: Redis unreachable (nothing claimed: the caller has done nothing yet).
    """
    token = uuid.uuid4().hex
    done = client.set(RedisKeys(prefix).archive_claim(kind, run_id), token, nx=True, px=CLAIM_MS)
    return token if done else None


def live_claim(client: Any, prefix: str, kind: str, run_id: str) -> bool:
    """True while an actor of ``kind`` holds ``run_id`` (its claim not released and not expired)."""
    return bool(client.exists(RedisKeys(prefix).archive_claim(kind, run_id)))


def release(client: Any, prefix: str, kind: str, run_id: str, token: str) -> None:
    """Drop ``run_id``'s claim of ``kind`` if it is still ``token``'s (a claim that expired and was taken by another
    actor is left to it)."""
    client.eval(_RELEASE, 1, RedisKeys(prefix).archive_claim(kind, run_id), token)

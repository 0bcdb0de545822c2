"""The demo's recovery service: a process of its own, so the fault campaign can SIGKILL it at any step.

Every ``--interval`` seconds (0.5) it runs one stale pass of the :class:`RecoveryJob` (fence dead instances,
read, fold, classify, RUN_RESUMED, hand over), then the demo's queue bookkeeping:

* a run recovery found with no fact at all (``no_facts``: it never durably started) goes back to the
  work queue unless an instance holds its id now (it is starting it); any decided run leaves its dead owner's
  claimed list;
* a run a dead instance took from the queue but never owned (it died between the queue and
  ``start_run``) is checked against the journal (its owner fenced first) and requeued only when the
  journal has no fact of it.

Each pass that decided something is one JSON line in ``--reports`` (``{"t": unix s, "report": …}``);
a failed pass is ``{"t", "error"}``. Armed with ``RJ_FAILPOINTS`` (``recovery.after_read=1`` …) it SIGKILLs
itself inside a pass, and the next process's first pass completes what the dead one left — the
property the campaign checks.

Run as ``python -m runjournal.demo.recoverer --reports FILE``; stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

from runjournal.consumers.recovery.job import FREED, RecoveryError, RecoveryJob
from runjournal.core import redis_client
from runjournal.core.logs import setup_logging
from runjournal.core.settings import Settings
from runjournal.demo.agent import DemoKeys
from runjournal.producers.fencing import fence_producer

__all__ = ["DemoRecovery", "main"]

log = logging.getLogger("runjournal.demo.recoverer")


#: Requeue a run unless the queue already holds it (two recovery services may both decide it).
_REQUEUE = "if redis.call('LPOS', KEYS[1], ARGV[1]) then return 0 end return redis.call('RPUSH', KEYS[1], ARGV[1])"


class DemoRecovery:
    """One recovery job plus the demo queue's bookkeeping (see the module docstring)."""

    def __init__(self, settings: Settings, reports: Path) -> None:
        self.settings = settings
        self.job = RecoveryJob(settings, max_wait_s=10)
        self.r = redis_client.client(settings, socket_timeout=5)
        self.keys = DemoKeys(settings.topic_prefix)
        self.reports = reports

    def _write(self, line: dict[str, Any]) -> None:
        with self.reports.open("a") as f:  # one line per write: a kill leaves whole lines behind
            f.write(json.dumps({"t": round(time.time(), 3), **line}, default=str) + "\n")

    def one_pass(self) -> None:
        """One stale pass and the queue bookkeeping (raises what the job raises)."""
        report = self.job.recover(stale=True).as_dict()
        if report["runs"]:
            self._write({"report": report})
            for r in report["runs"]:
                self._settle(r["run_id"], r["owner"], r["action"], r.get("detail"), run_owner=r["owner"])
        self._sweep_claimed()

    def _sweep_claimed(self) -> None:
        """Runs a dead instance took from the queue but never owned go back to the queue when the journal
        has no fact of them (a run in an owned set is the stale pass's)."""
        live = self.job.instances.live()
        owned: set[str] = set()
        for okey in redis_client.scan_keys(self.r, self.keys.owned_glob()):
            owned |= {m.decode() for m in self.r.smembers(okey)}
        for key in redis_client.scan_keys(self.r, self.keys.claimed_glob()):
            owner = self.keys.owner_of_claimed(key)
            if owner in live:
                continue
            orphans = [x.decode() for x in self.r.lrange(key, 0, -1) if x.decode() not in owned]
            if not orphans:
                continue
            fence_producer(self.settings, owner)
            for run_id in orphans:
                try:
                    (outcome,) = self.job.recover(runs=[run_id]).runs
                except RecoveryError:  # the projection shows a live owner: it is running, not lost
                    self.r.lrem(key, 0, run_id)
                    continue
                self._write({"report": {"runs": [vars(outcome)], "orphan_of": owner}})
                self._settle(run_id, owner, outcome.action, outcome.detail, run_owner=outcome.owner)

    def _settle(self, run_id: str, owner: str | None, action: str, detail: str | None = None, *,
                run_owner: str | None = None) -> None:
        """A run with no fact at all goes back to the queue: when this pass freed its id, when no instance ever
        claimed the id (``run_owner`` None), or when no instance holds its id now — a dead instance's owned set may
        name a run whose id it never held (the pass reports "not claimed by this owner"), and no other pass would
        queue it again. The requeue is check-and-set on the queue; a run queued twice is started once (its id's
        claim: the second taker gets ``RunExistsError`` and drops it). Any decided run leaves its dead owner's list."""
        if action in {"deferred", "no_live_instance", "retry_later", "superseded"}:
            return  # undecided: the next pass takes it again
        if action == "no_facts" and (detail == FREED or run_owner is None
                                     or self.job.instances.runs_started_by([run_id]).get(run_id) is None):
            self.r.eval(_REQUEUE, 1, self.keys.queue, run_id)
        if owner:
            self.r.lrem(self.keys.claimed(owner), 0, run_id)

    def run(self, interval_s: float, stop: threading.Event) -> None:
        """Passes until ``stop``; a failed pass is reported and the next one tries again."""
        while not stop.wait(interval_s):
            try:
                self.one_pass()
            except Exception as exc:  # noqa: BLE001 - keep sweeping; reported in the summary
                log.warning("recovery pass failed: %r", exc)
                self._write({"error": repr(exc)[:500]})
        self.job.close()


def main(argv: list[str] | None = None) -> None:
    """Process entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reports", required=True, type=Path)
    ap.add_argument("--interval", type=float, default=0.5)
    args = ap.parse_args(argv)
    settings = Settings.load()
    setup_logging("WARNING", level=settings.log_level)  # JSON lines, librdkafka's too (runjournal.kafka)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    DemoRecovery(settings, args.reports).run(args.interval, stop)


if __name__ == "__main__":
    main()

"""Continue a run that ended FAILED, under a new epoch, on a live Journal.

``Journal.start_run`` refuses the id of an existing run (``RunExistsError``): starting it again would
write its keys ``{run_id}:1:1…`` a second time and answer its requests with its old decisions. A failed
run is continued instead, through the recovery job, so the journal — not the caller — says what is done:

1. ``journal.flush()`` (its open transaction would hold the read back), then
   ``RecoveryJob.recover(runs=[run_id], reopen_failed=True, assign_to=journal.producer_id)``: folds the
   run (projection snapshot + tail), classifies every call and publishes RUN_RESUMED (seq + 1, epoch + 1),
   which the reducer takes as reopening a FAILED run; the plan goes to Redis, assigned to ``journal``.
2. The assignment is taken off the journal's list and ``journal.resume(run_id)`` returns the handle.

Step 1 runs under a claim on the run (a token in ``rj:{P:arc}:reopening:<run>``) taken before anything is read,
and only while no archive of the run holds its own claim: an archive and a continuation of one run never overlap,
so a continued run's history is never tombstoned under it (decision 0057).

**An archived run** (decision 0058): when step 1 finds no fact of the run and the archive
(``RUNJOURNAL_ARCHIVE_URL``) holds it, a run that ended FAILED is restored first —
``runjournal.consumers.recovery.unarchive.restore_archived`` re-publishes its events and framework records,
with their keys and bytes, to its partition in one transaction (once: two restorers of one run fence each other, a
later one finds the records and publishes nothing) — and step 1 runs again. An archived run that ended otherwise is
refused (``finished``) before anything is published. Its large results stay in the archive: a committed call
returns its recorded result read from there (``ResultStore.get``).

The agent then re-executes its code on that handle: committed calls return their recorded results
(nothing runs), unknown ones are reconciled by key, recorded approvals are honoured (not asked again),
a recorded retryable failure runs again under its own key (attempt + 1), a non-retryable one is raised
again (``RecordedFailureError``) — the rules of any resume (``RunHandle.call``).
"""

from __future__ import annotations

from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.consumers.recovery.report import RunOutcome
from runjournal.consumers.recovery.unarchive import restore_archived
from runjournal.consumers.runtime import archive_claims as claims
from runjournal.core import redis_client as redis_clients
from runjournal.core.errors import RunjournalError
from runjournal.core.ids import RUN_ID
from runjournal.core.redis_keys import RedisKeys
from runjournal.model.reducer import RunStatus
from runjournal.producers import Journal, RunHandle

__all__ = ["RunNotContinuableError", "continue_run"]


class RunNotContinuableError(RunjournalError):
    """``continue_run`` was asked for a run it cannot continue: unknown, still running, or ended otherwise
    than FAILED (``action`` and ``detail`` say which, as the recovery report does)."""

    def __init__(self, run_id: str, action: str, detail: str | None) -> None:
        self.run_id = run_id
        self.action = action
        self.detail = detail
        super().__init__(f"run {run_id} cannot be continued: {action}" + (f" ({detail})" if detail else ""))


def continue_run(journal: Journal, run_id: str, *, max_wait_s: float = 30.0) -> RunHandle:
    """Reopen the FAILED run ``run_id`` under a new epoch and resume it on ``journal`` (module docstring); an
    archived FAILED run is restored from the archive first (docs/design/decisions/0058-continue-an-archived-run.md).

    Args:
        journal: the live Journal that takes the run.
        run_id: a run that ended FAILED (in the journal, or archived).
        max_wait_s: longest to wait for an unknown call's tool timeout before reconciling it is allowed (s).

    Returns:
        The run's handle (epoch = the previous epoch + 1).

    Raises:
        InvalidIdError: ``run_id`` breaks the run-id rules (``runjournal.core.ids.RUN_ID``); nothing was fenced,
            read or published.
        RunNotContinuableError: no such run, neither in the journal nor in the archive (``no_facts``), it has not
            ended or is parked (``not_ended``: nobody is fenced by this call; a crashed run is the stale pass's), it
            ended SUCCEEDED or CANCELLED (``finished``; an archived one: nothing was published), another
            ``continue_run`` was restoring the same archived run at the same moment (``superseded``), the archiver
            is archiving it now (``being_archived``) or an erase of it began (``erased``) — nothing fenced or
            published in the last two (claims on ``{P:arc}``: ``runjournal.consumers.runtime.archive_claims``,
            decision 0057).
        RestoreError: an archived run could not be restored (its object does not match its manifest, its partition
            could not be read, the transaction failed); nothing of it was committed — continue it again.
        ObjectStoreError: the run is not in the journal and the archive's backend is unknown or not installed.
        DeliveryError: the journal's open transaction could not be committed first.
        RecoveryError, KafkaException, redis.RedisError: as ``RecoveryJob.recover``.
    """
    RUN_ID.check(run_id)
    prefix = journal.settings.topic_prefix
    client = redis_clients.client(journal.settings)
    token, _now = claims.claim(client, prefix, claims.REOPENING, run_id)  # before anything is read (decision 0057)
    try:
        if claims.live_claim(client, prefix, claims.ARCHIVING, run_id):
            raise RunNotContinuableError(run_id, "being_archived", "the archiver is archiving it now: try again "
                                         "once it is done")
        if client.zscore(RedisKeys(prefix).archive_erased(), run_id) is not None:
            raise RunNotContinuableError(run_id, "erased", "runjournal erase began on it: an erased run is not "
                                         "continued")
        journal.flush()  # its own open transaction would hold back the partitions' last stable offset the job reads
        outcome = _recover(journal, run_id, max_wait_s)
        if outcome.action == "no_facts":  # not in the journal: archived? (decision 0058)
            restored = restore_archived(journal.settings, run_id)
            if restored is not None:
                if restored.status != RunStatus.FAILED.value:
                    raise RunNotContinuableError(run_id, "finished",
                                                 f"{restored.status}, archived at {restored.object_url}")
                if restored.superseded:
                    raise RunNotContinuableError(run_id, "superseded", "another continue_run is restoring it from "
                                                 f"the archive ({restored.object_url}) at the same moment")
                # A new job: its init_transactions comes after the restore, so it fences every recovery actor that
                # initialised before (another operator's first pass included) and reads after them — of two
                # operators exactly one resumes the run. The first job's producer may be fenced by such a pass.
                outcome = _recover(journal, run_id, max_wait_s)
    finally:
        claims.release(client, prefix, claims.REOPENING, run_id, token)  # RUN_RESUMED committed (or nothing was)
    if outcome.action != "resumed":
        raise RunNotContinuableError(run_id, outcome.action, outcome.detail)
    journal.plans.unassign(run_id, journal.producer_id)
    return journal.resume(run_id)


def _recover(journal: Journal, run_id: str, max_wait_s: float) -> RunOutcome:
    """One recovery pass over ``run_id`` (reopening a FAILED run, assigned to ``journal``) with a job of its own."""
    job = RecoveryJob(journal.settings, max_wait_s=max_wait_s)
    try:
        (outcome,) = job.recover(runs=[run_id], reopen_failed=True, assign_to=journal.producer_id).runs
    finally:
        job.close()
    return outcome

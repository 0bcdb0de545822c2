"""The recovery job: fence, read end offsets, fold the tail, classify, resume under a new epoch.

Order (docs/design/protocol.md § Zombies: fence first, then read), numbered as in :meth:`RecoveryJob.recover`:

0. Check the topic against what the projection stored about it (``runjournal.consumers.runtime.topic_identity``):
   a re-created topic or another partition count is :class:`TopicMismatchError`, before any decision.
1. Choose the runs: owned by instances whose lease expired (``stale`` — an earlier incarnation of a
   restarted producer_id included: each incarnation is its own instance), by one instance, or named
   (owner: the projected state's, else the instance that claimed the run id; an ended run has none).
2. Fence each dead instance at the broker: ``init_transactions()`` with its ``transactional.id``
   bumps the producer epoch and aborts its open transaction; it can write no new intent.
3. Then read the end offsets of the partitions involved — nothing of the zombie lands behind them.
4. Fold each partition's tail (projector's applied offset → end offset) onto the Redis snapshot.
   When the folded tail names an owner the projection did not (the projector lags), that owner is
   fenced too and steps 3-4 run again (at most three rounds): the owner the *tail* names is fenced.
   A partition that cannot be read to its end (a transaction stays open, the registry stays away)
   decides nothing for its runs (``retry_later``); the other partitions' runs go on.
5. Classify every tool call (``runjournal.consumers.recovery.plan``); a run whose unknown calls are still
   inside their tool timeout is waited for (up to ``max_wait_s``) or deferred to the next sweep.
6. Publish RUN_RESUMED (seq = last + 1, epoch + 1, plan summary) for all runs in one
   transaction of the recovery job's own transactional producer. Two recovery actors fence each other: this
   producer's ``init_transactions`` completes with step 2, before step 3 reads, so of two actors racing on a run
   exactly one commits and the other reports the run ``superseded`` (``runjournal.consumers.recovery.resumed``).
7. Hand over (``runjournal.consumers.recovery.handover``), per run, in three idempotent writes, each within one
   Redis Cluster slot (``runjournal.core.redis_keys``): the plan (the run's slot); the assignee's assignment list
   and owned set in one check-and-set script (its instance slot: never a second list entry); the removal from
   the dead instance's owned set (its slot). Runs go in batches: each write step of a batch is one round trip
   (a pipeline of single-slot commands, or one command or script per instance), the next step only after the
   previous one was acknowledged. A run whose write fails skips its later steps; the others go on, then the
   pass raises (the next pass completes that run).

Redis is read in batches too: the named runs' states (the snapshot the fold starts from: each partition's
applied offset, then its states) and their owners' leases in a few pipelined round trips; an instance's lease is
read once per pass, so every step of a pass decides from the same view of who is alive.

Every step is idempotent and a crash at any point is completed by the next normal pass:

* before 6 commits (after fencing, after the read, inside the transaction): nothing durable
  happened — the recovery producer's next ``init_transactions`` aborts the open transaction — and the
  next pass does it all again;
* after 6, before or inside 7: the journal already names the assignee as owner (epoch n+1). The next
  pass finds a *live* owner that does not hold the run (not in its owned set), or holds it while the dead
  owner's set still lists it: the hand-over did not complete, so it completes it (``handed_over``) — the
  run is resumed exactly once. When the assignee has died meanwhile, the run is resumed again under
  epoch n+2 to another live instance.

Transactional failures (c): an abortable one aborts the transaction and leaves the job usable (its runs are
``retry_later``); a fatal one (fenced by another recovery job, unauthorised) raises
:class:`~runjournal.consumers.runtime.failures.FatalDependencyError`. Failpoints (``RJ_FAILPOINTS``, crash tests):
``recovery.after_fence``, ``recovery.after_read``, ``recovery.after_commit``, ``recovery.inside_handover``,
``recovery.handover.after_plan``, ``recovery.handover.after_assign``.

A run with no fact at all after 2-4 (``no_facts``) frees its run id for its fenced starter, so it can be
started again. With ``reopen_failed`` a FAILED run is resumed too (continuing it: ``continue_run``).

Running it twice is harmless; each run's outcome is in the returned :class:`RecoveryReport`.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

from runjournal.consumers.projector.store import ProjectionStore
from runjournal.consumers.recovery._gc import Pause, collector_paused
from runjournal.consumers.recovery.handover import HandOver, HandOvers
from runjournal.consumers.recovery.instances import Instances
from runjournal.consumers.recovery.plan import Classified, build_plan, classify
from runjournal.consumers.recovery.report import RecoveryReport, RunOutcome, with_changes
from runjournal.consumers.recovery.resumed import (
    RECOVERY_PRODUCER_ID,
    SUPERSEDED,
    ResumedPublisher,
    control_event,
    resumed_event,
)
from runjournal.consumers.recovery.tail import Snapshot, end_offsets, fold_tails, read_snapshots
from runjournal.consumers.runtime.failures import FailurePolicy
from runjournal.consumers.runtime.topic_identity import check_topic
from runjournal.core import failpoints, otel, redis_client
from runjournal.core.errors import RunjournalError
from runjournal.core.ids import PRODUCER_ID, RUN_ID
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.model.reducer import RunState, RunStatus
from runjournal.producers.control import RESUME, WAIT, ControlRequest, ControlStore
from runjournal.producers.fencing import fence_producer
from runjournal.producers.plan import PlanStore, RecoveryPlan
from runjournal.schemas import Event, codec_from_settings
from runjournal.schemas.keys import partition_for

__all__ = ["FREED", "RECOVERY_PRODUCER_ID", "RecoveryError", "RecoveryJob", "RecoveryReport", "RunOutcome"]

log = logging.getLogger("runjournal.consumers.recovery")

FREED = "run id freed"
"""The ``no_facts`` detail of the one actor that freed the run id (a caller may start the run again)."""
NO_LIVE_INSTANCE = ("no instance holds a live lease to take it over: start an agent (a Journal) and the next pass "
                    "hands it over (`runjournal recover --stale`, or the `--watch` sweep)")
"""The ``no_live_instance`` detail: nothing was published, the run waits for a live instance."""
RETRIED = "nothing was decided; the next pass tries again"
"""Added to a ``retry_later`` detail."""
PARKED_FIX = ("fix the cause (`runjournal inspect RUN_ID`), then `runjournal projector --rebuild`, or "
              "`runjournal erase` the run")
"""What a person does about a ``parked`` run (docs/guide/journal.md, Parked runs)."""

_FENCE_THREADS = 8
"""Dead instances fenced at once (each ``init_transactions`` waits on the broker, not on this process)."""


class RecoveryError(RunjournalError):
    """Recovery could not proceed (e.g. asked to recover a live instance without ``force``)."""


class RecoveryJob:
    """Recovers runs of dead instances. One per process; see the module docstring for the steps.

    Args:
        settings: bootstrap, Redis URL, topic prefix.
        max_wait_s: longest to wait for unknown calls' tool timeouts before deferring a run (s).
        outage_wait_s: longest one dependency outage (registry, Redis) is waited out in a pass (s, 10).
        read_timeout_s: longest the tails are read before a partition is left incomplete (s, 30).
    """

    def __init__(self, settings: Settings, *, max_wait_s: float = 30.0, outage_wait_s: float = 10.0,
                 read_timeout_s: float = 30.0) -> None:
        self.settings = settings
        otel.apply_setting(settings.tracing)  # Settings(tracing=...) given in code (docs/guide/tracing.md)
        self.max_wait_s = max_wait_s
        self.read_timeout_s = read_timeout_s
        self.policy = FailurePolicy("recovery", log, max_wait_s=outage_wait_s)
        self.redis = redis_client.client(settings)
        self.keys = RedisKeys(settings.topic_prefix)
        self.store = ProjectionStore(self.redis, settings.topic_prefix)
        self.instances = Instances(self.redis, settings.topic_prefix)
        self.plans = PlanStore(self.redis, settings.topic_prefix)
        self.handovers = HandOvers(self.redis, self.plans, self.policy)
        self.codec = codec_from_settings(settings)
        self.publisher = ResumedPublisher(settings, self.codec, self._partition)
        self._partitions: int | None = None
        self.controls = ControlStore(self.redis, settings.topic_prefix)
        self._force = False
        self._reopen_failed = False
        self._resume_paused = False
        self._waking: int | None = None
        """Redis's clock (ms) during a wake pass (:meth:`wake`): only runs held by a wait whose time came resume."""
        self._asked: tuple[str | None, str | None] = (None, None)
        self._requests: dict[str, ControlRequest] = {}
        """run_id -> an operator's pending request, for the runs of this pass (one read per pass)."""
        self._alive: dict[str, bool] = {}
        self._incoming: dict[str, str] = {}
        """run_id -> the live instance whose incoming set named it, this pass (:meth:`_clear_incoming`)."""
        self._surrendered: dict[str, tuple[str, int]] = {}
        """run_id -> (instance, epoch) it was surrendered at, this pass (``Instances.surrendered``)."""
        self._gc = Pause(enabled_before=False)  # the pass's pause of the cyclic collector (_gc)

    # -- 1. which runs ---------------------------------------------------------------------------
    def _select(self, *, stale: bool, instance: str | None, runs: list[str] | None, force: bool,
                reopen: bool = False) -> tuple[dict[str, str | None], dict[int, Snapshot]]:
        """run_id -> dead owner to fence (None: nobody to fence; ``reopen``: named runs are only continued
        if they turn out FAILED, so nobody is fenced for them), and the snapshots read for named runs."""
        chosen: dict[str, str | None] = {}
        self._incoming = {}
        self._surrendered = {}
        if stale:
            for view in self.instances.stale():  # owned (or incoming) runs of instances with no lease
                chosen.update({r: view.producer_id for r in view.owned})
            self._orphans_from_projection(chosen)
            self._incoming = self.policy.call("read incoming", self.instances.incoming_of_live)
            for run_id in self._incoming:  # a pass put them there, then died before their hand-over (or is busy)
                chosen.setdefault(run_id, None)
            # Runs a live instance gave up (Journal.surrender): taken without fencing it (_spares); a dead one's too.
            self._surrendered = self.policy.call("read surrendered", self.instances.surrendered)
            chosen.update({run_id: pid for run_id, (pid, _epoch) in self._surrendered.items()})
        if instance:
            view = self.instances.view(instance)
            if view.alive and not force:
                raise RecoveryError(f"instance {instance} holds a live lease; refusing (use --force)")
            chosen.update({r: instance for r in view.owned})
        if not runs:
            return chosen, {}
        # The projection may lag: the owner is checked again on the folded state (see _triage).
        snapshots = read_snapshots(self.store, self.policy, self._by_partition(runs))
        states = {r: snapshots[self._partition(r)].states.get(r) for r in runs}
        unseen = [] if reopen else [r for r, st in states.items() if st is None]
        claims = self.policy.call("read claims", lambda: self.instances.runs_started_by(unseen))
        owners = {r: st.owner if st else claims.get(r) for r, st in states.items()}
        leases = {o for o in owners.values() if o}
        gave_up = {r: v for r, v in self.policy.call("read surrendered", self.instances.surrendered).items()
                   if r in states}
        for run_id in runs:
            state = states[run_id]
            if reopen or self._resume_paused or (
                    state is not None and (state.terminal or state.status is RunStatus.PAUSED)):
                # ended or paused (or to be resumed only if the fold finds it paused: _triage): nobody writes it,
                # nobody to fence — its last owner may be alive
                chosen[run_id] = None
                continue
            owner = owners[run_id]
            if run_id in gave_up and gave_up[run_id][0] == owner:
                self._surrendered[run_id] = gave_up[run_id]  # a live instance gave it up (a pause): taken unfenced
                chosen[run_id] = owner
                continue
            if owner and not force and self._is_alive(owner, prefetch=leases):
                raise RecoveryError(f"run {run_id} is owned by live instance {owner}; refusing (use --force)")
            chosen[run_id] = owner
        return chosen, snapshots

    def _orphans_from_projection(self, chosen: dict[str, str | None]) -> None:
        """Add the runs the projection shows neither ended nor parked whose owner holds no lease (the journal's
        facts: found even when every Redis set that named them was lost, or a hand-over died before writing one).
        One HGETALL per partition and one EXISTS per owner, pipelined."""
        assert self._partitions is not None
        live = self.policy.call("read live runs", lambda: self.store.live(range(self._partitions)))
        owners = {owner for run_id, (_epoch, owner) in live.items() if run_id not in chosen}
        owners.discard(RECOVERY_PRODUCER_ID)
        if not owners:
            return
        alive = {o: self._is_alive(o, prefetch=owners) for o in sorted(owners)}
        for run_id, (_epoch, owner) in live.items():
            if run_id not in chosen and owner in alive and not alive[owner]:
                chosen[run_id] = owner

    def unknown_runs(self, run_ids: list[str]) -> list[str]:
        """Those of ``run_ids`` that never existed here: no run-id claim (``start_run`` claims every run it starts;
        only a ``no_facts`` pass frees one) and no projected state. ``recover --run`` refuses them before a pass.

        Raises:
            TopicNotFoundError: the events topic is missing. redis.RedisError: Redis failed.
        """
        claims = self.instances.runs_started_by(run_ids)
        return [r for r in run_ids if claims.get(r) is None and self.store.get(self._partition(r), r) is None]

    def _spares(self, run_id: str, owner: str | None) -> bool:
        """True when ``owner`` is a live instance that surrendered ``run_id`` (``Journal.surrender``): it is not
        fenced (its other runs go on), not waited for (it handed the run over once every request of it had
        returned), and may be handed the run again."""
        gave_up = self._surrendered.get(run_id)
        return (gave_up is not None and owner == gave_up[0] and not self._force
                and self._is_alive(owner, prefetch={p for p, _e in self._surrendered.values()}))

    def _is_alive(self, producer_id: str, prefetch: set[str] | frozenset[str] = frozenset()) -> bool:
        """Whether ``producer_id`` holds its lease, read once per pass (``prefetch``: read these too, pipelined)."""
        if producer_id not in self._alive:
            wanted = {producer_id, *prefetch} - set(self._alive)
            self._alive.update(self.policy.call("read leases", lambda: self.instances.alive_many(wanted)))
        return self._alive[producer_id]

    def _partition(self, run_id: str) -> int:
        if self._partitions is None:
            self._check_topic()
        assert self._partitions is not None
        return partition_for(run_id, self._partitions)

    def _by_partition(self, run_ids: list[str] | dict[str, str | None]) -> dict[int, set[str]]:
        out: dict[int, set[str]] = {}
        for run_id in run_ids:
            out.setdefault(self._partition(run_id), set()).add(run_id)
        return out

    def _check_topic(self) -> None:
        """Step 0, every pass: the topic exists and is the one the projection describes (count, id, offsets)."""
        shape = check_topic(self.settings, self.redis, self.settings.topic_prefix,
                            lambda n: {p: self.store.applied_offset(p) for p in range(n)}, adopt=True,
                            call=self.policy.call)
        self._partitions = shape.partitions

    # -- the pass ----------------------------------------------------------------------------------
    def recover(self, *, stale: bool = False, instance: str | None = None, runs: list[str] | None = None,
                force: bool = False, assign_to: str | None = None, reopen_failed: bool = False,
                resume_paused: bool = False, requested_by: str | None = None,
                reason: str | None = None) -> RecoveryReport:
        """One recovery pass (see the module docstring for steps 0-7).

        Args:
            stale, instance, runs: which runs (step 1). force: recover even from a live instance.
            assign_to: the live instance to hand resumed runs to (default: the least loaded).
            reopen_failed: also resume runs that ended FAILED (a new epoch; recorded results, failures and
                approvals are kept) — how a failed run is continued (``continue_run``).
            resume_paused: resume the named runs an operator paused (``runjournal resume``); without it a paused
                run is reported ``paused`` and left held. Operators' pending cancel / pause requests on the runs of
                the pass are carried out whatever the mode (docs/design/decisions/0047-operator-controls.md).
            requested_by, reason: the operator who asked for this pass and why (recorded in its RUN_RESUMED events).

        Raises:
            InvalidIdError: a named run or instance is not text (``runjournal.core.ids`` ``check_lookup``); a run
                whose id breaks the id rules is parked, not resumed.
            RecoveryError: a named instance or run is live and ``force`` is False.
            TopicNotFoundError, TopicMismatchError: the topic is missing, or not the one the projection
                was built from (message names the repair); nothing was decided.
            FatalDependencyError: fenced by another recovery job, unauthorised (nothing was handed over), or
                Redis refused a hand-over write (the other runs were handed over).
            DependencyUnavailableError: Redis or the broker stayed away longer than ``outage_wait_s`` (in the
                hand-over: after the other runs were handed over).
        """
        if resume_paused and (stale or instance or not runs):
            raise ValueError("resume_paused applies to named runs only (runs=[...])")
        for run_id in runs or ():
            RUN_ID.check_lookup(run_id)
        if instance is not None:
            PRODUCER_ID.check_lookup(instance)
        started = time.monotonic()
        report = RecoveryReport()
        self._alive = {}  # leases are read once per pass
        self._check_topic()  # 0
        if assign_to and assign_to not in self.instances.live():
            raise RecoveryError(f"--assign-to {assign_to}: no live instance holds that lease "
                                f"(live: {sorted(self.instances.live()) or 'none'})")
        self._force = force
        self._reopen_failed = reopen_failed
        self._resume_paused = resume_paused
        self._asked = (requested_by, reason)
        with collector_paused() as self._gc:  # the pass's objects hold no cycles; freed before it resumes (_gc)
            self._pass(report, stale=stale, instance=instance, runs=runs, assign_to=assign_to)
            self._clear_incoming(report)
            self._clear_surrendered(report)
            if stale:  # the sweep also fires durable timers: held runs whose wake-up time came (producers.waits)
                self._wake(report, None, assign_to)
        report.recovery_ms = (time.monotonic() - started) * 1000
        log.info("recovery pass", extra=report.as_dict(with_runs=False))
        return report

    def wake(self, runs: list[str] | None = None, *, assign_to: str | None = None) -> RecoveryReport:
        """Resume the held runs whose wake-up time came (``rj:{P:ctl}:timers`` by Redis's clock), or ``runs``: a run
        held by a durable wait (``run.sleep``, ``run.wait_signal``) is resumed when its time came or it waits for a
        signal (a delivered signal arms its timer now); a run an operator paused is left held — unless an operator's
        resume was left for this service (``control.RESUME``: its timer is armed at once; the RUN_RESUMED records
        who asked). ``recover(stale=True)`` does this after every sweep. docs/design/decisions/0050-durable-waits.md.

        Raises:
            As :meth:`recover`.
        """
        started = time.monotonic()
        report = RecoveryReport()
        self._alive = {}
        self._check_topic()
        self._force = self._reopen_failed = False
        self._asked = (None, None)
        with collector_paused() as self._gc:
            self._wake(report, runs, assign_to)
        report.recovery_ms = (time.monotonic() - started) * 1000
        return report

    def _wake(self, report: RecoveryReport, runs: list[str] | None, assign_to: str | None) -> None:
        now = self.policy.call("read Redis's clock", self.controls.now_ms)
        due = runs if runs is not None else self.policy.call("read timers", lambda: self.controls.due(now))
        due = [r for r in due if RUN_ID.problem(r) is None]
        if not due:
            return
        self._resume_paused, self._waking, self._asked = True, now, (None, "woken: its wait is over")
        try:
            self._pass(report, stale=False, instance=None, runs=due, assign_to=assign_to)
            self._clear_incoming(report)
            self._clear_surrendered(report)
        finally:
            self._resume_paused, self._waking, self._asked = False, None, (None, None)

    def _pass(self, report: RecoveryReport, *, stale: bool, instance: str | None, runs: list[str] | None,
              assign_to: str | None) -> None:
        """Steps 1-7 into ``report``; everything else they build is garbage when this returns."""
        with otel.step_span("runjournal.recovery.pass", {"runjournal.stale": stale}) as span:
            chosen, snapshots = self._select(stale=stale, instance=instance, runs=runs, force=self._force,
                                             reopen=self._reopen_failed)  # 1
            states, offsets = self._fence_and_read(chosen, snapshots, report)  # 2-4
            with otel.step_span("runjournal.recovery.classify", {"runjournal.runs": len(chosen)}):
                resumable = self._triage(chosen, states, report)  # 5
            with otel.step_span("runjournal.recovery.hand_over", {"runjournal.runs": len(resumable)}):
                self._resume(resumable, chosen, states, offsets, report, assign_to)  # 6, 7
            if span is not None:
                span.set_attribute("runjournal.runs", len(chosen))

    def _clear_incoming(self, report: RecoveryReport) -> None:
        """Runs taken from a live instance's incoming set that this pass did not hand to it: that marker is stale
        (the RUN_RESUMED never committed, the run ended, or another instance owns it) — take it off."""
        if not self._incoming:
            return
        outcomes = {o.run_id: o for o in report.runs}
        done = [(pid, run_id) for run_id, pid in self._incoming.items()
                if (o := outcomes.get(run_id)) is not None and o.action not in ("retry_later", "deferred")
                and not (o.action in ("handed_over", "resumed") and o.assigned_to == pid)]
        if done:
            self.policy.call("clear incoming", lambda: self.plans.clear_incoming(done))

    def _clear_surrendered(self, report: RecoveryReport) -> None:
        """Surrendered runs this pass decided (resumed, finished, parked …): their entry is done. Runs left for a
        later pass (``retry_later``, ``deferred``, ``no_live_instance``) keep it."""
        if not self._surrendered:
            return
        outcomes = {o.run_id: o for o in report.runs}
        done = [(pid, run_id) for run_id, (pid, _epoch) in self._surrendered.items()
                if (o := outcomes.get(run_id)) is not None
                and o.action not in ("retry_later", "deferred", "no_live_instance")]
        if done:
            self.policy.call("clear surrendered", lambda: self.instances.clear_surrendered(done))

    def _fence_and_read(self, chosen: dict[str, str | None], snapshots: dict[int, Snapshot],
                        report: RecoveryReport) -> tuple[dict[str, RunState | None], dict[str, int]]:
        """Steps 2-4: fence, read end offsets, fold; again while the tail names an owner not yet fenced.

        The snapshots may be read before the fence: the fold from their applied offsets reaches the end offsets
        read after it, whenever they were read (each state is at or after its partition's applied offset)."""
        to_fence = {o for r, o in chosen.items() if o and not self._spares(r, o)}
        fenced: set[str] = set()
        by_partition = self._by_partition(chosen)
        if by_partition:
            self.publisher.prepare()  # the RUN_RESUMED producer's init_transactions, beside the fences below
        states: dict[str, RunState | None] = {}
        for _round in range(3):
            self._fence(sorted(to_fence - fenced))  # 2
            fenced |= to_fence
            if by_partition and _round == 0:  # 2, completed: this actor fences every earlier recovery actor
                self.policy.call("init the recovery producer", self.publisher.ready)  # before anything is read
            failpoints.hit("recovery.after_fence")
            if not by_partition:
                break
            with otel.step_span("runjournal.recovery.read", {"runjournal.partitions": len(by_partition)}):
                bounds = self.policy.call("end offsets", lambda: end_offsets(self.settings, set(by_partition)))  # 3
                states, report.partitions = fold_tails(self.settings, self.store, self.codec, by_partition, bounds,
                                                       policy=self.policy, timeout_s=self.read_timeout_s,
                                                       snapshots=snapshots)  # 4
            failpoints.hit("recovery.after_read")
            owners = {st.owner for st in states.values() if st is not None and st.owner and not st.terminal
                      and st.owner not in fenced and st.owner != RECOVERY_PRODUCER_ID}
            named = {o for o in sorted(owners) if self._force or not self._is_alive(o, prefetch=owners)}
            if not named:
                break
            to_fence |= named  # the tail names a dead owner the projection did not show: fence it, read again
        report.fenced = sorted(fenced)
        return states, {str(p.partition): p.end for p in report.partitions}

    def _fence(self, owners: list[str]) -> None:
        """Fence every owner at the broker, several at once; returns when all are fenced.

        Raises:
            DependencyUnavailableError, FatalDependencyError, JournalError: a fence failed (as ``fence_producer``
                under the policy); nothing is read before every owner is fenced.
        """
        if not owners:
            return
        with otel.step_span("runjournal.recovery.fence", {"runjournal.owners": len(owners)}), \
                ThreadPoolExecutor(max_workers=min(_FENCE_THREADS, len(owners)), thread_name_prefix="fence") as pool:
            for done in [pool.submit(self.policy.call, "fence", lambda o=o: fence_producer(self.settings, o))
                         for o in owners]:
                done.result()

    def _triage(self, chosen: dict[str, str | None], states: dict[str, RunState | None],
                report: RecoveryReport) -> dict[str, Classified]:
        resumable: dict[str, Classified] = {}
        live_owned: list[tuple[RunOutcome, RunState, str | None]] = []
        incomplete = {p.partition: p.reason for p in report.partitions if not p.complete}
        self._requests = self.policy.call("read requests", lambda: self.controls.get_many(chosen)) if chosen else {}
        for run_id, owner in sorted(chosen.items()):
            state = states.get(run_id)
            partition = self._partition(run_id)
            gave_up = self._surrendered.get(run_id)
            if gave_up is not None and state is not None and state.epoch > gave_up[1]:
                # Resumed since it was surrendered (a pass died before clearing the entry): the entry is done, and
                # the run is its new owner's — a hand-over left unfinished is completed below (_live_owners).
                self.instances.clear_surrendered([(gave_up[0], run_id)])
                del self._surrendered[run_id]
                owner = chosen[run_id] = None
            base = RunOutcome(run_id=run_id, owner=owner or (state.owner if state else None), partition=partition,
                              previous_epoch=state.epoch if state else None)
            if partition in incomplete:  # nothing is decided from a partition not read to its end
                report.runs.append(with_changes(base, action="retry_later",
                                                detail=f"{incomplete[partition]} — {RETRIED}"))
            elif state is None:
                self._disown(owner, run_id)
                # fenced and read to the end: the run never happened; its id may be used again (compare-and-delete:
                # of two actors, one frees it — the one that may start it again says so)
                freed = bool(owner) and self.instances.free_run_id(run_id, owner)
                report.runs.append(with_changes(base, action="no_facts",
                                                detail=FREED if freed else "nothing of it is in the journal, and "
                                                "its run id was not claimed by this owner: nothing to resume"))
            elif state.terminal and not (self._reopen_failed and state.status is RunStatus.FAILED):
                self._disown(owner, run_id)
                if (moot := self._requests.pop(run_id, None)) is not None:  # it ended first: nothing to carry out
                    self._request_done(moot)
                if self._waking is not None:
                    self._disarm([run_id])
                report.runs.append(with_changes(base, action="finished", detail=state.status.value))
            elif self._resume_paused and owner is None and state.status is not RunStatus.PAUSED:
                # asked to resume a paused run (nobody fenced): the journal says it is not paused — left alone
                if self._waking is not None and not self._wait_pending(run_id):
                    self._disarm([run_id])  # no wait of it is on the way: a stray wake-up (a signal) is forgotten
                if (moot := self._requests.get(run_id)) is not None and moot.action == RESUME:
                    self._requests.pop(run_id, None)  # resumed by someone else first: the resume is moot
                    self._request_done(moot)
                report.runs.append(with_changes(base, action="not_paused", detail=(
                    f"{state.status.value}, owned by {state.owner}: only a paused run is resumed")))
            elif self._waking is not None and state.status is RunStatus.PAUSED and not self._wakes(state):
                self._rearm(state)  # an operator's pause stands; a sleep not yet over sleeps on
                report.runs.append(with_changes(base, action="paused", detail=(
                    f"held until {state.resume_at_ms} (Redis's clock, ms)" if state.resume_at_ms is not None
                    else f"held by an operator's pause ({state.requested_by}): runjournal resume {run_id}")))
            elif state.status is RunStatus.PAUSED and not self._resume_paused and (
                    (req := self._requests.get(run_id)) is None or req.action != "cancel"):
                self._disown(owner, run_id)
                if req is not None and req.action != RESUME:  # paused already (a pass that died after its
                    # commit): the request is done; a resume stays for the wake pass (its timer is armed)
                    self._requests.pop(run_id, None)
                    self._request_done(req)
                report.runs.append(with_changes(base, action="paused", detail=(
                    f"held for nobody since a pause by {state.requested_by or 'an operator'}: `runjournal resume "
                    f"{run_id}` hands it to a live instance")))
            elif self._reopen_failed and owner is None and not state.terminal:
                # Asked to continue a failed run that has not ended: nobody was fenced, so it is not taken.
                report.runs.append(with_changes(base, action="not_ended",
                                         detail=f"{state.status.value}, owned by {state.owner}"))
            elif (not state.terminal and not self._force and state.owner and state.owner != owner
                  and self._is_alive(state.owner)):
                report.runs.append(base)  # decided below, for all such runs at once
                live_owned.append((base, state, owner))
            elif state.status in (RunStatus.GAP, RunStatus.BLOCKED):
                self._park(owner, run_id)
                why = state.gap_reason or state.blocked_reason or state.status.value
                report.runs.append(with_changes(base, action="parked", detail=f"{why} — {PARKED_FIX}"))
            elif (bad := RUN_ID.problem(run_id)) is not None:
                # Started before the id rules (docs/reference/identifiers.md): its idempotency keys may be another
                # run's, and Journal.resume refuses it — nobody is handed a run they cannot take. Inspect, erase.
                self._park(owner, run_id)
                report.runs.append(with_changes(base, action="parked",
                                                detail=f"the run id breaks the id rules ({bad[0]}: {bad[1]}) — "
                                                       "`runjournal inspect` it, then `runjournal erase` it"))
            elif (classified := self._classify_or_defer(base, state, report, owner)) is not None:
                resumable[run_id] = classified
        self._live_owners(live_owned)
        return resumable

    def _classify_or_defer(self, base: RunOutcome, state: RunState, report: RecoveryReport,
                           owner: str | None) -> Classified | None:
        """The run's classification, once a request its writers may have sent can no longer act (waited for up
        to ``max_wait_s``); None when that is later: the run is reported ``deferred``.

        One clock per decision: how long is the writers' effect windows' PTTL in Redis (``rj:{P:i:<instance>}:
        window``, kept by each writer ``ttl + timeout_ms`` past any moment it may still send), slept on this host's
        monotonic clock — never an intent's ``occurred_at`` (the writer's wall clock) against this host's
        (docs/design/protocol.md § Zombies)."""
        classified = classify(state)
        if not classified.has_unknown:
            return classified
        writers = sorted({w for w in (state.owner, owner) if w and not self._spares(state.run_id, w)})
        left_ms = self.policy.call("effect windows", lambda: self.instances.window_left_ms(
            writers, classified.unknown_timeout_ms))
        wait_s = max(left_ms.values(), default=0) / 1000
        if wait_s > self.max_wait_s:
            report.runs.append(with_changes(base, action="deferred", calls=classified.counts,
                                            detail=f"a request of {', '.join(writers)} may act for {wait_s:.1f} s "
                                                   "more (its effect window): a pass after that decides it"))
            return None
        if wait_s > 0:
            with self._gc.lifted():  # up to max_wait_s: the process's other threads' garbage is collected meanwhile
                time.sleep(wait_s)  # let a zombie's request time out before anyone reconciles
        return classified

    def _live_owners(self, found: list[tuple[RunOutcome, RunState, str | None]]) -> None:
        """Runs whose journal names a live owner: left alone, or an earlier pass's hand-over completed
        (:meth:`HandOvers.unfinished`); the completions are written like any hand-over (:meth:`_hand_over`)."""
        if found:
            self._hand_over(self.handovers.unfinished(found))

    def _resume(self, resumable: dict[str, Classified], chosen: dict[str, str | None],
                states: dict[str, RunState | None], offsets: dict[str, int], report: RecoveryReport,
                assign_to: str | None) -> None:
        if not resumable:
            return
        dead = {o for r, o in chosen.items() if o and not self._spares(r, o)} | set(report.fenced)
        held = self._held(resumable, chosen, states, offsets)
        pending = {r: c for r, c in resumable.items() if r not in {o.run_id for _e, o, _d, _q in held}}
        target = (assign_to or self.instances.least_loaded(exclude=dead)) if pending else None  # once, before 7
        batch: list[tuple[Event, RecoveryPlan, RunOutcome, str | None]] = []
        now_ms = int(time.time() * 1000)
        for run_id, classified in pending.items():
            state = states[run_id]
            assert state is not None
            outcome = RunOutcome(run_id=run_id, owner=chosen[run_id] or state.owner,
                                 partition=self._partition(run_id), previous_epoch=state.epoch,
                                 calls=classified.counts)
            if target is None:
                report.runs.append(with_changes(outcome, action="no_live_instance", detail=NO_LIVE_INSTANCE))
                continue
            request = self._requests.get(run_id)
            asked = (request.requested_by, request.reason or None) if (
                request and request.action == RESUME and self._asked[0] is None) \
                else self._asked  # an operator's resume left for this service: its who and why (unless this pass
            # was itself asked by an operator: that one resumes it, and the pending request is moot)
            traced = None if otel.tracer() is None else otel.run_traceparent(
                run_id, otel.recovery_span_id(run_id, state.epoch + 1))
            event = resumed_event(state, classified, target, offsets, requested_by=asked[0], reason=asked[1],
                                  traceparent=traced)
            plan = build_plan(state, classified, new_epoch=event.epoch, resumed_seq=event.seq, assigned_to=target,
                              now_ms=now_ms)
            if request is not None and request.action == RESUME:
                outcome = with_changes(outcome, detail=f"resume requested by {request.requested_by}")
            elif request is not None:
                outcome = with_changes(outcome, detail=f"{request.action} requested by {request.requested_by}: the "
                                       f"new owner reconciles the unknown call(s) first, then carries it out")
            elif self._spares(run_id, chosen[run_id]):
                outcome = with_changes(outcome, detail=f"surrendered by {chosen[run_id]}")
            batch.append((event, plan, with_changes(outcome, epoch=event.epoch, assigned_to=target), chosen[run_id]))
        if not batch and not held:
            return
        # Before the commit, the assignee's incoming set names every run of the batch: a pass killed between the
        # commit and the hand-over leaves the run findable (the next pass completes it), whatever else is lost.
        if batch:
            assert target is not None
            incoming = {target: [p.run_id for _e, p, _o, _d in batch]}
            self.policy.call("mark incoming", lambda: self.plans.mark_incoming(incoming))
        for _e, _o, _d, request in held:  # a held wait's wake-up time is stored before the event that holds it
            if request.action == WAIT and request.until_ms is not None:
                until = request.until_ms
                self.policy.call("arm a timer", lambda r=request.run_id, u=until: self.controls.arm(r, u, lt=True))
        error = self.publisher.publish([e for e, _o, _d, _q in held] + [e for e, _p, _o, _d in batch])  # 6
        refused = "retry_later" if not error or not error.startswith(SUPERSEDED) else SUPERSEDED
        for _e, outcome, _d, _q in held:
            report.runs.append(with_changes(outcome, action=refused, detail=error if refused == SUPERSEDED
                                            else f"{error} — {RETRIED}") if error else outcome)
        for _e, _p, outcome, _d in batch:
            report.runs.append(with_changes(outcome, action=refused,
                                            detail=error if refused == SUPERSEDED else f"{error} — {RETRIED}")
                               if error else with_changes(outcome, action="resumed"))
        if error:
            if refused == SUPERSEDED and batch:  # fenced before its commit: nothing landed, its incoming marks lie
                self.policy.call("clear incoming", lambda: self.plans.clear_incoming(
                    [(target, p.run_id) for _e, p, _o, _d in batch]))
            return  # an ambiguous failure keeps them: the next pass completes a commit that happened
        failpoints.hit("recovery.after_commit")
        for _e, outcome, dead_owner, request in held:  # nobody takes them: the dead owner lets go, the request is done
            self._disown(dead_owner, outcome.run_id)
            self._request_done(request)
        if batch:
            self._disarm([p.run_id for _e, p, _o, _d in batch])  # resumed: no timer of theirs is pending any more
            for _e, plan, _o, _d in batch:  # an operator's resume carried out (its RUN_RESUMED is durable)
                if (request := self._requests.get(plan.run_id)) is not None and request.action == RESUME:
                    self._request_done(request)
            self._hand_over([HandOver(plan, dead_owner) for _e, plan, _o, dead_owner in batch])  # 7
            if otel.tracer() is not None:
                self._trace_hand_overs([(plan, dead_owner) for _e, plan, _o, dead_owner in batch])

    def _trace_hand_overs(self, handed: list[tuple[RecoveryPlan, str | None]]) -> None:
        """Each handed-over run's spans in its own trace (docs/design/decisions/0054-traces.md): the dead owner's
        segment, ended here for it (it never will: the span id derives from the run and its epoch), and this
        hand-over (the span the RUN_RESUMED's traceparent names), linked to this pass and that segment."""
        pass_link = otel.current_link()
        for plan, dead_owner in handed:
            run_id, previous = plan.run_id, plan.epoch - 1
            dead = otel.segment_span_id(run_id, previous)
            if dead_owner and not self._spares(run_id, dead_owner):
                otel.emit_run_span("runjournal.run.segment", run_id, dead, attributes={
                    "runjournal.run_id": run_id, "runjournal.epoch": previous, "runjournal.producer_id": dead_owner,
                    "runjournal.outcome": "lost"}, links=[], error=f"owner {dead_owner} was fenced by recovery")
            otel.emit_run_span("runjournal.recovery.run", run_id, otel.recovery_span_id(run_id, plan.epoch),
                               attributes={"runjournal.run_id": run_id, "runjournal.epoch": plan.epoch,
                                           "runjournal.previous_epoch": previous,
                                           "runjournal.assigned_to": plan.assigned_to or ""},
                               links=[link for link in (pass_link, otel.span_link(run_id, dead)) if link is not None])

    def _held(self, resumable: dict[str, Classified], chosen: dict[str, str | None],
              states: dict[str, RunState | None],
              offsets: dict[str, int]) -> list[tuple[Event, RunOutcome, str | None, ControlRequest]]:
        """The runs of ``resumable`` an operator's request ends or holds here instead of a hand-over
        (docs/design/decisions/0047-operator-controls.md): a pause → RUN_RESUMED with ``paused`` (epoch + 1, no
        owner); a cancel → RUN_CANCELLED — unless a call's outcome is unknown: that run is resumed as usual, and its
        new owner reconciles the call before it carries the cancel out (an effect in flight is never abandoned)."""
        out: list[tuple[Event, RunOutcome, str | None, ControlRequest]] = []
        for run_id, classified in resumable.items():
            request = self._requests.get(run_id)
            state = states[run_id]
            if request is None or request.action == RESUME or state is None or (
                    request.action == "cancel" and classified.has_unknown):
                continue
            event = control_event(state, classified, request, offsets)
            outcome = RunOutcome(run_id=run_id, owner=chosen[run_id] or state.owner, partition=self._partition(run_id),
                                 previous_epoch=state.epoch, epoch=event.epoch, calls=classified.counts,
                                 action={"pause": "paused", WAIT: "waiting"}.get(request.action, "cancelled"),
                                 detail=f"{request.action} requested by {request.requested_by or 'an operator'}"
                                        f"{': ' + request.reason if request.reason else ''}")
            out.append((event, outcome, chosen[run_id], request))
        return out

    def _wakes(self, state: RunState) -> bool:
        """In a wake pass: a held run resumes when it waits for a signal (a delivery armed its timer) or its wake-up
        time came by Redis's clock, or an operator's resume was left for this service (``control.RESUME``); an
        operator's pause (none of these) stands."""
        assert self._waking is not None
        request = self._requests.get(state.run_id)
        return state.waiting_for is not None or (request is not None and request.action == RESUME) or (
            state.resume_at_ms is not None and state.resume_at_ms <= self._waking)

    def _wait_pending(self, run_id: str) -> bool:
        request = self._requests.get(run_id)
        return request is not None and request.action == WAIT

    def _rearm(self, state: RunState) -> None:
        if state.resume_at_ms is None:
            self._disarm([state.run_id])
        else:
            self.policy.call("arm a timer", lambda: self.controls.arm(state.run_id, int(state.resume_at_ms or 0)))

    def _disarm(self, run_ids: list[str]) -> None:
        try:
            self.policy.call("disarm timers", lambda: self.controls.disarm(run_ids))
        except Exception as exc:  # noqa: BLE001 - a stray timer only wakes a pass that finds nothing to do
            log.warning("could not forget the timers of %s: %s", run_ids, exc)

    def _request_done(self, request: ControlRequest) -> None:
        """Remove an operator's request that this pass carried out (or found moot); errors are logged — the next
        pass, or the owner, finds the run paused or ended and removes it."""
        try:
            self.policy.call("remove request", lambda: self.controls.done(request))
        except Exception as exc:  # noqa: BLE001 - harmless leftover, removed by whoever meets it next
            log.warning("could not remove the %s request of run %s: %s", request.action, request.run_id, exc)

    # -- forks (runjournal.consumers.recovery.fork; docs/design/decisions/0049-fork.md) ---------------------------
    def start_fork(self, history: list[Event], *, assign_to: str | None = None, requested_by: str | None = None,
                   reason: str | None = None) -> RunOutcome:
        """Write a fork (``fork_history``'s events, then a RUN_RESUMED to a live instance) in one transaction of the
        recovery producer and hand it over, like a recovered run. Its run id is claimed first (SET NX): a fork never
        lands on an existing run.

        Returns:
            The outcome: ``forked`` (epoch 2, assigned), or ``no_live_instance`` (nothing written, the id freed).

        Raises:
            RecoveryError: the fork's run id exists, ``assign_to`` holds no live lease, or the transaction was refused
                three times (another recovery actor kept fencing this one); nothing of the fork landed.
            FatalDependencyError, DependencyUnavailableError: as :meth:`recover`.
        """
        from runjournal.model.reducer import fold

        self._check_topic()
        fork_id = history[0].run_id
        partition = self._partition(fork_id)
        state = fold((e, partition, i) for i, e in enumerate(history))
        assert state is not None
        classified = classify(state)
        outcome = RunOutcome(run_id=fork_id, partition=partition, previous_epoch=1, calls=classified.counts)
        if assign_to and assign_to not in self.instances.live():
            raise RecoveryError(f"assign_to {assign_to}: no live instance holds that lease "
                                f"(live: {sorted(self.instances.live()) or 'none'})")
        target = assign_to or self.instances.least_loaded()
        if target is None:
            return with_changes(outcome, action="no_live_instance", detail=NO_LIVE_INSTANCE)
        claim = self.keys.claim(fork_id)
        if not self.policy.call("claim the fork's run id", lambda: self.redis.set(claim, RECOVERY_PRODUCER_ID,
                                                                                  nx=True)):
            raise RecoveryError(f"run {fork_id} exists: a fork needs a new run id")
        event = resumed_event(state, classified, target, {}, requested_by=requested_by, reason=reason)
        plan = build_plan(state, classified, new_epoch=event.epoch, resumed_seq=event.seq, assigned_to=target,
                          now_ms=int(time.time() * 1000))
        self.policy.call("mark incoming", lambda: self.plans.mark_incoming({target: [fork_id]}))
        error: str | None = None
        for _attempt in range(3):
            self.policy.call("init the recovery producer", self.publisher.ready)
            error = self.publisher.publish([*history, event])
            if error is None:
                break
        if error is not None:
            self.policy.call("clear incoming", lambda: self.plans.clear_incoming([(target, fork_id)]))
            self.instances.free_run_id(fork_id, RECOVERY_PRODUCER_ID)
            raise RecoveryError(f"the fork {fork_id} was not written: {error}")
        self._hand_over([HandOver(plan, None)])
        return with_changes(outcome, action="forked", epoch=event.epoch, assigned_to=target)

    def _hand_over(self, items: list[HandOver]) -> None:
        """Step 7 for ``items`` (``runjournal.consumers.recovery.handover``): batches of single-slot writes, a crash
        between them completed by the next pass (:meth:`_live_owners`).

        Raises:
            DependencyUnavailableError, FatalDependencyError: a run's write failed (after the others were written).
        """
        self.handovers.hand_over(items)

    def _disown(self, owner: str | None, run_id: str) -> None:
        if owner:
            self.instances.disown_many([(owner, run_id)])

    def _park(self, owner: str | None, run_id: str) -> None:
        """Park, then disown (two slots): a crash between leaves the run listed; the next pass parks it again."""
        self.redis.sadd(self.keys.parked(), run_id)
        self._disown(owner, run_id)

    def close(self) -> None:
        """Flush and drop the recovery producer."""
        self.publisher.close()

"""The recovery job: fence, read end offsets, fold the tail, classify, resume under a new epoch.

Order (DESIGN.md § Zombies: fence first, then read), numbered as in :meth:`RecoveryJob.recover`:

0. Check the topic against what the projection stored about it (``runjournal.consumers.topic_identity``):
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
   transaction of the recovery job's own transactional producer (two concurrent recovery jobs
   fence each other).
7. Hand over, per run, in one Redis MULTI: the plan, the assignee's assignment list and owned
   set, and removal from the dead instance's owned set (check-and-set: never a second list entry).

Every step is idempotent and a crash at any point is completed by the next normal pass:

* before 6 commits (after fencing, after the read, inside the transaction): nothing durable
  happened — the recovery producer's next ``init_transactions`` aborts the open transaction — and the
  next pass does it all again;
* after 6, before or inside 7: the journal already names the assignee as owner (epoch n+1). The next
  pass finds a *live* owner that does not hold the run (not in its owned set): the hand-over did not
  complete, so it completes it (``handed_over``) — the run is resumed exactly once. When the assignee
  has died meanwhile, the run is resumed again under epoch n+2 to another live instance.

Transactional failures (c): an abortable one aborts the transaction and leaves the job usable (its runs are
``retry_later``); a fatal one (fenced by another recovery job, unauthorised) raises
:class:`~runjournal.consumers.failures.FatalDependencyError`. Failpoints (``RJ_FAILPOINTS``, crash tests):
``recovery.after_fence``, ``recovery.after_read``, ``recovery.after_commit``, ``recovery.inside_handover``.

A run with no fact at all after 2-4 (``no_facts``) frees its run id for its fenced starter, so it can be
started again. With ``reopen_failed`` a FAILED run is resumed too (continuing it: ``continue_run``).

Running it twice is harmless; each run's outcome is in the returned :class:`RecoveryReport`.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import redis
from confluent_kafka import KafkaError, KafkaException, Producer

from runjournal.consumers.failures import FailurePolicy, FatalDependencyError, kafka_error_verdict
from runjournal.consumers.projector.store import ProjectionStore
from runjournal.consumers.recovery.instances import Instances
from runjournal.consumers.recovery.plan import Classified, build_plan, classify, plan_summary
from runjournal.consumers.recovery.report import RecoveryReport, RunOutcome, with_changes
from runjournal.consumers.recovery.tail import end_offsets, fold_tails
from runjournal.consumers.topic_identity import check_projection, describe_events_topic
from runjournal.core import failpoints, kafka
from runjournal.core.errors import RunjournalError
from runjournal.core.settings import Settings
from runjournal.model.reducer import RunState, RunStatus
from runjournal.producers.fencing import fence_producer
from runjournal.producers.partitioner import partition_for
from runjournal.producers.plan import PlanStore
from runjournal.schemas import Event, EventType, codec_from_settings, new_event_id, utcnow

__all__ = ["RecoveryError", "RecoveryJob", "RecoveryReport", "RunOutcome"]

log = logging.getLogger("runjournal.consumers.recovery")

RECOVERY_PRODUCER_ID = "recovery"


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
        self.max_wait_s = max_wait_s
        self.read_timeout_s = read_timeout_s
        self.policy = FailurePolicy("recovery", log, max_wait_s=outage_wait_s)
        self.redis = redis.Redis.from_url(settings.redis_url)
        self.store = ProjectionStore(self.redis, settings.topic_prefix)
        self.instances = Instances(self.redis, settings.topic_prefix)
        self.plans = PlanStore(self.redis, settings.topic_prefix)
        self.codec = codec_from_settings(settings)
        self._producer: Producer | None = None
        self._partitions: int | None = None
        self._force = False
        self._reopen_failed = False

    # -- 1. which runs ---------------------------------------------------------------------------
    def _select(self, *, stale: bool, instance: str | None, runs: list[str] | None,
                force: bool, reopen: bool = False) -> dict[str, str | None]:
        """run_id -> dead owner to fence (None: nobody to fence; ``reopen``: named runs are only continued
        if they turn out FAILED, so nobody is fenced for them)."""
        chosen: dict[str, str | None] = {}
        if stale:
            for view in self.instances.stale():
                chosen.update({r: view.producer_id for r in view.owned})
        if instance:
            view = self.instances.view(instance)
            if view.alive and not force:
                raise RecoveryError(f"instance {instance} holds a live lease; refusing (use --force)")
            chosen.update({r: instance for r in view.owned})
        for run_id in runs or []:
            # The projection may lag: the owner is checked again on the folded state (see _triage).
            state = self.store.get(self._partition(run_id), run_id)
            if reopen or (state is not None and state.terminal):
                chosen[run_id] = None  # ended: nobody writes it, nobody to fence (its last owner may be alive)
                continue
            owner = state.owner if state else self.instances.run_started_by(run_id)
            if owner and self.instances.view(owner).alive and not force:
                raise RecoveryError(f"run {run_id} is owned by live instance {owner}; refusing (use --force)")
            chosen[run_id] = owner
        return chosen

    def _partition(self, run_id: str) -> int:
        if self._partitions is None:
            self._check_topic()
        assert self._partitions is not None
        return partition_for(run_id, self._partitions)

    def _check_topic(self) -> None:
        """Step 0, every pass: the topic exists and is the one the projection describes (count, id, offsets)."""
        shape = self.policy.call("describe topic", lambda: describe_events_topic(self.settings))
        applied = self.policy.call("read offsets", lambda: {p: self.store.applied_offset(p)
                                                            for p in range(shape.partitions)})
        check_projection(self.redis, self.settings.topic_prefix, shape, applied, adopt=False)
        self._partitions = shape.partitions

    def _kafka_producer(self) -> Producer:
        if self._producer is None:
            self._producer = kafka.producer(self.settings, **{"acks": "all", "enable.idempotence": True,
                "transactional.id": f"{self.settings.topic_prefix}.{RECOVERY_PRODUCER_ID}", "linger.ms": 5})
            self._producer.init_transactions(30)
        return self._producer

    # -- the pass ----------------------------------------------------------------------------------
    def recover(self, *, stale: bool = False, instance: str | None = None, runs: list[str] | None = None,
                force: bool = False, assign_to: str | None = None, reopen_failed: bool = False) -> RecoveryReport:
        """One recovery pass (see the module docstring for steps 0-7).

        Args:
            stale, instance, runs: which runs (step 1). force: recover even from a live instance.
            assign_to: the live instance to hand resumed runs to (default: the least loaded).
            reopen_failed: also resume runs that ended FAILED (a new epoch; recorded results, failures and
                approvals are kept) — how a failed run is continued (``continue_run``).

        Raises:
            RecoveryError: a named instance or run is live and ``force`` is False.
            TopicNotFoundError, TopicMismatchError: the topic is missing, or not the one the projection
                was built from (message names the repair); nothing was decided.
            FatalDependencyError: fenced by another recovery job, unauthorised (nothing was handed over).
            DependencyUnavailableError: Redis or the broker stayed away longer than ``outage_wait_s``.
        """
        started = time.monotonic()
        report = RecoveryReport()
        self._check_topic()  # 0
        if assign_to and assign_to not in self.instances.live():
            raise RecoveryError(f"--assign-to {assign_to}: no live instance holds that lease "
                                f"(live: {sorted(self.instances.live()) or 'none'})")
        chosen = self._select(stale=stale, instance=instance, runs=runs, force=force, reopen=reopen_failed)  # 1
        self._force = force
        self._reopen_failed = reopen_failed
        states, offsets = self._fence_and_read(chosen, report)  # 2-4
        resumable = self._triage(chosen, states, report)  # 5
        self._resume(resumable, chosen, states, offsets, report, assign_to)  # 6, 7
        report.recovery_ms = (time.monotonic() - started) * 1000
        log.info("recovery pass", extra={k: v for k, v in report.as_dict().items() if k != "runs"})
        return report

    def _fence_and_read(self, chosen: dict[str, str | None],
                        report: RecoveryReport) -> tuple[dict[str, RunState | None], dict[str, int]]:
        """Steps 2-4: fence, read end offsets, fold; again while the tail names an owner not yet fenced."""
        to_fence = {o for o in chosen.values() if o}
        fenced: set[str] = set()
        by_partition: dict[int, set[str]] = {}
        for run_id in chosen:
            by_partition.setdefault(self._partition(run_id), set()).add(run_id)
        states: dict[str, RunState | None] = {}
        for _round in range(3):
            for owner in sorted(to_fence - fenced):  # 2
                self.policy.call("fence", lambda o=owner: fence_producer(self.settings, o))  # type: ignore[misc]
                fenced.add(owner)
            failpoints.hit("recovery.after_fence")
            if not by_partition:
                break
            bounds = self.policy.call("end offsets", lambda: end_offsets(self.settings, set(by_partition)))  # 3
            states, report.partitions = fold_tails(self.settings, self.store, self.codec, by_partition, bounds,
                                                   policy=self.policy, timeout_s=self.read_timeout_s)  # 4
            failpoints.hit("recovery.after_read")
            named = {st.owner for st in states.values() if st is not None and st.owner and not st.terminal
                     and st.owner not in fenced and st.owner != RECOVERY_PRODUCER_ID
                     and (self._force or not self.instances.view(st.owner).alive)}
            if not named:
                break
            to_fence |= named  # the tail names a dead owner the projection did not show: fence it, read again
        report.fenced = sorted(fenced)
        return states, {str(p.partition): p.end for p in report.partitions}

    def _triage(self, chosen: dict[str, str | None], states: dict[str, RunState | None],
                report: RecoveryReport) -> dict[str, Classified]:
        resumable: dict[str, Classified] = {}
        incomplete = {p.partition: p.reason for p in report.partitions if not p.complete}
        for run_id, owner in sorted(chosen.items()):
            state = states.get(run_id)
            partition = self._partition(run_id)
            base = RunOutcome(run_id=run_id, owner=owner or (state.owner if state else None), partition=partition,
                              previous_epoch=state.epoch if state else None)
            if partition in incomplete:  # nothing is decided from a partition not read to its end
                report.runs.append(with_changes(base, action="retry_later", detail=incomplete[partition]))
            elif state is None:
                self._disown(owner, run_id)
                if owner:  # fenced and read to the end: the run never happened; its id may be used again
                    self.instances.free_run_id(run_id, owner)
                report.runs.append(with_changes(base, action="no_facts"))
            elif state.terminal and not (self._reopen_failed and state.status is RunStatus.FAILED):
                self._disown(owner, run_id)
                report.runs.append(with_changes(base, action="finished", detail=state.status.value))
            elif self._reopen_failed and owner is None and not state.terminal:
                # Asked to continue a failed run that has not ended: nobody was fenced, so it is not taken.
                report.runs.append(with_changes(base, action="not_ended",
                                         detail=f"{state.status.value}, owned by {state.owner}"))
            elif (not state.terminal and not self._force and state.owner and state.owner != owner
                  and self.instances.view(state.owner).alive):
                report.runs.append(self._live_owner(base, state, owner))
            elif state.status in (RunStatus.GAP, RunStatus.BLOCKED):
                self._park(owner, run_id)
                report.runs.append(with_changes(base, action="parked", detail=state.gap_reason or state.blocked_reason))
            else:
                classified = classify(state)
                wait_s = (classified.reconcile_after_ms - time.time() * 1000) / 1000
                if wait_s > self.max_wait_s:
                    report.runs.append(with_changes(base, action="deferred", calls=classified.counts,
                                             detail=f"tool timeout passes in {wait_s:.1f} s"))
                    continue
                if wait_s > 0:
                    time.sleep(wait_s)  # let a zombie's request time out before anyone reconciles
                resumable[run_id] = classified
        return resumable

    def _live_owner(self, base: RunOutcome, state: RunState, dead_owner: str | None) -> RunOutcome:
        """The journal names a live owner. It holds the run (its owned set has it): leave it alone. It does not:
        a pass committed RUN_RESUMED to it and died before the hand-over — complete that hand-over now."""
        assert state.owner is not None
        if self.redis.sismember(self.plans.owned_key(state.owner), state.run_id):
            return with_changes(base, action="owner_alive", detail=f"owned by live {state.owner}")
        classified = classify(state)
        plan = build_plan(state, classified, new_epoch=state.epoch, resumed_seq=state.last_seq,
                          assigned_to=state.owner, now_ms=int(time.time() * 1000))
        self._hand_over(plan, dead_owner)
        return with_changes(base, action="handed_over", epoch=state.epoch, assigned_to=state.owner,
                            calls=classified.counts, detail="completed the hand-over of an earlier pass's RUN_RESUMED")

    def _resume(self, resumable: dict[str, Classified], chosen: dict[str, str | None],
                states: dict[str, RunState | None], offsets: dict[str, int], report: RecoveryReport,
                assign_to: str | None) -> None:
        dead = {o for o in chosen.values() if o} | set(report.fenced)
        batch: list[tuple[Event, Any, RunOutcome, str | None]] = []
        for run_id, classified in resumable.items():
            state = states[run_id]
            assert state is not None
            target = assign_to or self.instances.least_loaded(exclude=dead)
            outcome = RunOutcome(run_id=run_id, owner=chosen[run_id] or state.owner,
                                 partition=self._partition(run_id), previous_epoch=state.epoch,
                                 calls=classified.counts)
            if target is None:
                report.runs.append(with_changes(outcome, action="no_live_instance"))
                continue
            event = self._resumed_event(state, classified, target, offsets)
            plan = build_plan(state, classified, new_epoch=event.epoch, resumed_seq=event.seq, assigned_to=target,
                              now_ms=int(time.time() * 1000))
            batch.append((event, plan, with_changes(outcome, epoch=event.epoch, assigned_to=target), chosen[run_id]))
        if not batch:
            return
        error = self._publish_resumed([e for e, _p, _o, _d in batch])  # 6
        for _e, _p, outcome, _d in batch:
            report.runs.append(with_changes(outcome, action="retry_later", detail=error) if error
                               else with_changes(outcome, action="resumed"))
        if error:
            return
        failpoints.hit("recovery.after_commit")
        for _e, plan, _o, dead_owner in batch:  # 7
            failpoints.hit("recovery.inside_handover")
            self._hand_over(plan, dead_owner)

    def _publish_resumed(self, events: list[Event]) -> str | None:
        """Step 6: every RUN_RESUMED in one transaction. Returns None when committed, or why it was not.

        An abortable failure aborts the transaction, drops the producer (the next pass builds one: a new
        producer epoch) and leaves the job usable; a
        fatal one (fenced by another recovery job, unauthorised) drops the producer and raises.

        Raises:
            FatalDependencyError: the transactional producer is fenced or failed fatally.
        """
        producer = self._kafka_producer()
        try:
            producer.begin_transaction()
            for event in events:
                producer.produce(self.settings.events_topic, key=event.key.encode(), value=self.codec.encode(event),
                                 partition=self._partition(event.run_id))
            producer.commit_transaction(30)
            return None
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if err is not None and err.txn_requires_abort():
                try:
                    producer.abort_transaction(30)
                except KafkaException as abort_exc:
                    log.warning("abort failed", extra={"error": str(abort_exc)})
                # A fresh producer for the next pass: after a refused record the idempotent sequence may need an
                # epoch bump; init_transactions on the same transactional.id gives one (and fences this one).
                self._drop_producer()
                log.warning("RUN_RESUMED transaction aborted; the next pass retries", extra={"error": str(err)})
                return f"RUN_RESUMED transaction aborted: {err.str()}"
            self._drop_producer()
            cause = kafka_error_verdict(err).cause if err is not None else str(exc)
            if err is not None and err.retriable() and not err.fatal():
                return f"RUN_RESUMED not committed: {cause}"
            raise FatalDependencyError("kafka", f"recovery producer {self.settings.topic_prefix}."
                                       f"{RECOVERY_PRODUCER_ID}: {cause}") from exc

    def _drop_producer(self) -> None:
        """Forget the transactional producer; the next pass builds one (``init_transactions`` aborts leftovers)."""
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(0)

    def _resumed_event(self, state: RunState, classified: Classified, target: str, offsets: dict[str, int]) -> Event:
        return Event(event_id=new_event_id(), run_id=state.run_id, tenant_id=state.tenant_id or "",
                     seq=state.last_seq + 1, epoch=state.epoch + 1, producer_id=RECOVERY_PRODUCER_ID,
                     type=EventType.RUN_RESUMED, occurred_at=utcnow(),
                     payload={"previous_epoch": state.epoch, "recovered_by": f"recovery@{uuid.getnode():x}",
                              "plan_json": plan_summary(classified, previous_epoch=state.epoch,
                                                        new_epoch=state.epoch + 1, offsets=offsets),
                              "assigned_to": target})

    def _hand_over(self, plan: Any, dead_owner: str | None) -> None:
        """Step 7 for one run, check-and-set (WATCH on the assignee's owned set): the plan; the assignment list
        and owned-set entries only if the assignee does not hold the run yet; removal from the dead owner.
        Running it again (a pass completing a crashed one) adds no second list entry."""
        owned = self.plans.owned_key(plan.assigned_to)

        def txn(pipe: Any) -> None:
            held = pipe.sismember(owned, plan.run_id)
            pipe.multi()
            pipe.set(self.plans.plan_key(plan.run_id), plan.to_json())
            if not held:
                pipe.rpush(self.plans.assign_key(plan.assigned_to), plan.run_id)
                pipe.sadd(owned, plan.run_id)
            if dead_owner and dead_owner != plan.assigned_to:
                pipe.srem(self.plans.owned_key(dead_owner), plan.run_id)

        self.policy.call("hand over", lambda: self.redis.transaction(txn, owned))

    def _disown(self, owner: str | None, run_id: str) -> None:
        if owner:
            self.redis.srem(self.plans.owned_key(owner), run_id)

    def _park(self, owner: str | None, run_id: str) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.sadd(f"{self.settings.topic_prefix}:parked", run_id)
        if owner:
            pipe.srem(self.plans.owned_key(owner), run_id)
        pipe.execute()

    def close(self) -> None:
        """Flush and drop the recovery producer."""
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None

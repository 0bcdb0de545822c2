"""The recovery job: fence, read end offsets, fold the tail, classify, resume under a new epoch.

Order (DESIGN.md § Zombies: fence first, then read), numbered as in :meth:`RecoveryJob.recover`:

1. Choose the runs: owned by instances whose lease expired (``stale`` — an earlier incarnation of a
   restarted producer_id included: each incarnation is its own instance), by one instance, or named
   (owner: the projected state's, else the instance that claimed the run id; an ended run has none).
2. Fence each dead instance at the broker: ``init_transactions()`` with its ``transactional.id``
   bumps the producer epoch and aborts its open transaction; it can write no new intent.
3. Then read the end offsets of the partitions involved — nothing of the zombie lands behind them.
4. Fold each partition's tail (projector's applied offset → end offset) onto the Redis snapshot.
5. Classify every tool call (``runjournal.consumers.recovery.plan``); a run whose unknown calls are still
   inside their tool timeout is waited for (up to ``max_wait_s``) or deferred to the next sweep.
6. Publish RUN_RESUMED (seq = last + 1, epoch + 1, plan summary) for all runs in one
   transaction of the recovery job's own transactional producer (two concurrent recovery jobs
   fence each other).
7. Hand over, per run, in one Redis MULTI: the plan, the assignee's assignment list and owned
   set, and removal from the dead instance's owned set. A crash before 7 leaves the run with its
   dead owner: the next sweep resumes it again under a newer epoch (harmless: nobody runs it).

A run with no fact at all after 2-4 (``no_facts``) frees its run id for its fenced starter, so it can be
started again. With ``reopen_failed`` a FAILED run is resumed too (continuing it: ``continue_run``).

Running it twice is harmless; each run's outcome is in the returned :class:`RecoveryReport`.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import redis
from confluent_kafka import Producer

from runjournal.consumers.projector.store import ProjectionStore
from runjournal.consumers.recovery.instances import Instances
from runjournal.consumers.recovery.plan import Classified, build_plan, classify, plan_summary
from runjournal.consumers.recovery.tail import PartitionRead, end_offsets, fold_tails
from runjournal.core import kafka
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


@dataclass
class RunOutcome:
    """What recovery did with one run."""

    run_id: str
    """The run."""
    action: str = ""
    """``resumed``, ``finished`` (terminal: only disowned), ``parked`` (GAP/BLOCKED: needs repair),
    ``deferred`` (a tool timeout has not passed), ``no_facts``, ``no_live_instance``, ``owner_alive`` (the
    journal shows a live instance owns it: left alone), ``not_ended`` (``reopen_failed``: it has not ended)."""
    owner: str | None = None
    """The dead instance it was taken from."""
    partition: int | None = None
    """Its partition."""
    previous_epoch: int | None = None
    """Epoch before recovery."""
    epoch: int | None = None
    """The new epoch (resumed runs)."""
    assigned_to: str | None = None
    """The live instance that takes it over."""
    calls: dict[str, int] = field(default_factory=dict)
    """Plan class -> count."""
    detail: str | None = None
    """Why, for non-resumed runs."""


@dataclass
class RecoveryReport:
    """Totals and per-run outcomes of one recovery pass."""

    runs: list[RunOutcome] = field(default_factory=list)
    fenced: list[str] = field(default_factory=list)
    partitions: list[PartitionRead] = field(default_factory=list)
    recovery_ms: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-able report: ``runs_recovered``, ``calls`` per class, ``offsets`` read, ``recovery_ms``."""
        totals: dict[str, int] = {}
        for r in self.runs:
            for k, v in r.calls.items():
                totals[k] = totals.get(k, 0) + v
        actions: dict[str, int] = {}
        for r in self.runs:
            actions[r.action] = actions.get(r.action, 0) + 1
        return {"runs_recovered": actions.get("resumed", 0), "actions": actions, "calls": totals,
                "fenced": self.fenced, "recovery_ms": round(self.recovery_ms, 1),
                "offsets": [vars(p) for p in self.partitions], "runs": [vars(r) for r in self.runs]}


class RecoveryJob:
    """Recovers runs of dead instances. One per process; see the module docstring for the steps.

    Args:
        settings: bootstrap, Redis URL, topic prefix.
        max_wait_s: longest to wait for unknown calls' tool timeouts before deferring a run (s).
    """

    def __init__(self, settings: Settings, *, max_wait_s: float = 30.0) -> None:
        self.settings = settings
        self.max_wait_s = max_wait_s
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
            meta = self._kafka_producer().list_topics(self.settings.events_topic, timeout=10)
            self._partitions = len(meta.topics[self.settings.events_topic].partitions)
        return partition_for(run_id, self._partitions)

    def _kafka_producer(self) -> Producer:
        if self._producer is None:
            self._producer = kafka.producer(self.settings, **{"acks": "all", "enable.idempotence": True,
                "transactional.id": f"{self.settings.topic_prefix}.{RECOVERY_PRODUCER_ID}", "linger.ms": 5})
            self._producer.init_transactions(30)
        return self._producer

    # -- the pass ----------------------------------------------------------------------------------
    def recover(self, *, stale: bool = False, instance: str | None = None, runs: list[str] | None = None,
                force: bool = False, assign_to: str | None = None, reopen_failed: bool = False) -> RecoveryReport:
        """One recovery pass (see the module docstring for steps 1-7).

        Args:
            stale, instance, runs: which runs (step 1). force: recover even from a live instance.
            assign_to: the live instance to hand resumed runs to (default: the least loaded).
            reopen_failed: also resume runs that ended FAILED (a new epoch; recorded results, failures and
                approvals are kept) — how a failed run is continued (``continue_run``).

        Raises:
            RecoveryError: a named instance or run is live and ``force`` is False.
            KafkaException: fencing, reading or publishing failed (nothing was handed over).
        """
        started = time.monotonic()
        report = RecoveryReport()
        if assign_to and assign_to not in self.instances.live():
            raise RecoveryError(f"--assign-to {assign_to}: no live instance holds that lease "
                                f"(live: {sorted(self.instances.live()) or 'none'})")
        chosen = self._select(stale=stale, instance=instance, runs=runs, force=force, reopen=reopen_failed)  # 1
        self._force = force
        self._reopen_failed = reopen_failed
        for owner in sorted({o for o in chosen.values() if o}):  # 2
            fence_producer(self.settings, owner)
            report.fenced.append(owner)
        by_partition: dict[int, set[str]] = {}
        for run_id in chosen:
            by_partition.setdefault(self._partition(run_id), set()).add(run_id)
        ends = end_offsets(self.settings, by_partition)  # 3
        states, report.partitions = fold_tails(self.settings, self.store, self.codec, by_partition, ends)  # 4
        offsets = {str(p.partition): p.end for p in report.partitions}
        resumable = self._triage(chosen, states, report)  # 5
        self._resume(resumable, chosen, states, offsets, report, assign_to)  # 6, 7
        report.recovery_ms = (time.monotonic() - started) * 1000
        log.info("recovery pass", extra={k: v for k, v in report.as_dict().items() if k != "runs"})
        return report

    def _triage(self, chosen: dict[str, str | None], states: dict[str, RunState | None],
                report: RecoveryReport) -> dict[str, Classified]:
        resumable: dict[str, Classified] = {}
        for run_id, owner in sorted(chosen.items()):
            state = states.get(run_id)
            base = RunOutcome(run_id=run_id, owner=owner, partition=self._partition(run_id),
                              previous_epoch=state.epoch if state else None)
            if state is None:
                self._disown(owner, run_id)
                if owner:  # fenced and read to the end: the run never happened; its id may be used again
                    self.instances.free_run_id(run_id, owner)
                report.runs.append(_with(base, action="no_facts"))
            elif state.terminal and not (self._reopen_failed and state.status is RunStatus.FAILED):
                self._disown(owner, run_id)
                report.runs.append(_with(base, action="finished", detail=state.status.value))
            elif self._reopen_failed and owner is None and not state.terminal:
                # Asked to continue a failed run that has not ended: nobody was fenced, so it is not taken.
                report.runs.append(_with(base, action="not_ended",
                                         detail=f"{state.status.value}, owned by {state.owner}"))
            elif (not state.terminal and not self._force and state.owner and state.owner != owner
                  and self.instances.view(state.owner).alive):
                # The journal says a live instance took the run over (the projection had not shown it yet).
                report.runs.append(_with(base, action="owner_alive", detail=f"owned by live {state.owner}"))
            elif state.status in (RunStatus.GAP, RunStatus.BLOCKED):
                self._park(owner, run_id)
                report.runs.append(_with(base, action="parked", detail=state.gap_reason or state.blocked_reason))
            else:
                classified = classify(state)
                wait_s = (classified.reconcile_after_ms - time.time() * 1000) / 1000
                if wait_s > self.max_wait_s:
                    report.runs.append(_with(base, action="deferred", calls=classified.counts,
                                             detail=f"tool timeout passes in {wait_s:.1f} s"))
                    continue
                if wait_s > 0:
                    time.sleep(wait_s)  # let a zombie's request time out before anyone reconciles
                resumable[run_id] = classified
        return resumable

    def _resume(self, resumable: dict[str, Classified], chosen: dict[str, str | None],
                states: dict[str, RunState | None], offsets: dict[str, int], report: RecoveryReport,
                assign_to: str | None) -> None:
        if not resumable:
            return
        dead = {o for o in chosen.values() if o}
        producer = self._kafka_producer()
        producer.begin_transaction()
        handover = []
        for run_id, classified in resumable.items():
            state = states[run_id]
            assert state is not None
            target = assign_to or self.instances.least_loaded(exclude=dead)
            outcome = RunOutcome(run_id=run_id, owner=chosen[run_id], partition=self._partition(run_id),
                                 previous_epoch=state.epoch, calls=classified.counts)
            if target is None:
                report.runs.append(_with(outcome, action="no_live_instance"))
                continue
            event = self._resumed_event(state, classified, target, offsets)
            producer.produce(self.settings.events_topic, key=event.key.encode(), value=self.codec.encode(event),
                             partition=self._partition(run_id))
            plan = build_plan(state, classified, new_epoch=event.epoch, resumed_seq=event.seq, assigned_to=target,
                              now_ms=int(time.time() * 1000))
            handover.append((plan, chosen[run_id]))
            report.runs.append(_with(outcome, action="resumed", epoch=event.epoch, assigned_to=target))
        producer.commit_transaction(30)  # 6: RUN_RESUMED durable for every run
        for plan, dead_owner in handover:  # 7
            self._hand_over(plan, dead_owner)

    def _resumed_event(self, state: RunState, classified: Classified, target: str, offsets: dict[str, int]) -> Event:
        return Event(event_id=new_event_id(), run_id=state.run_id, tenant_id=state.tenant_id or "",
                     seq=state.last_seq + 1, epoch=state.epoch + 1, producer_id=RECOVERY_PRODUCER_ID,
                     type=EventType.RUN_RESUMED, occurred_at=utcnow(),
                     payload={"previous_epoch": state.epoch, "recovered_by": f"recovery@{uuid.getnode():x}",
                              "plan_json": plan_summary(classified, previous_epoch=state.epoch,
                                                        new_epoch=state.epoch + 1, offsets=offsets),
                              "assigned_to": target})

    def _hand_over(self, plan: Any, dead_owner: str | None) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(self.plans.plan_key(plan.run_id), plan.to_json())
        pipe.rpush(self.plans.assign_key(plan.assigned_to), plan.run_id)
        pipe.sadd(self.plans.owned_key(plan.assigned_to), plan.run_id)
        if dead_owner and dead_owner != plan.assigned_to:
            pipe.srem(self.plans.owned_key(dead_owner), plan.run_id)
        pipe.execute()

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


def _with(outcome: RunOutcome, **changes: Any) -> RunOutcome:
    for k, v in changes.items():
        setattr(outcome, k, v)
    return outcome

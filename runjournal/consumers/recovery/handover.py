"""Step 7 of a recovery pass: hand runs over in batches of single-slot writes.

Per run, three idempotent writes, each within one Redis Cluster slot (``runjournal.core.redis_keys``), in order:

1. the plan (the run's slot): :meth:`PlanStore.put_many`, one pipelined SET per run;
2. the assignment, check-and-set (the assignee's owned set and assignment list, one slot):
   :meth:`PlanStore.assign_many`, one script per assignee and batch;
3. the removal from the dead owner's owned set (its slot): one SREM per dead owner and batch, pipelined.

Runs go in batches of :data:`HANDOVER_BATCH`. Each step of a batch is one round trip (a pipeline, or one
command per instance) and the next step starts only once Redis acknowledged the previous one, so a run is never
assigned before its plan is stored, nor taken from its dead owner before it is assigned; no command, script or
transaction spans two slots (a cluster pipeline sends each command to its node).

A run whose write fails skips its later steps; the other runs of the batch, and the later batches, go on. After
the last batch the first failure is raised. Each such run is completed by the next pass, as is a pass killed
between two writes (``recovery.inside_handover`` before each batch, ``recovery.handover.after_plan`` and
``…after_assign`` inside one): the journal already names the assignee, which does not hold the run yet, or
holds it while the dead owner's set still lists it (:meth:`HandOvers.unfinished`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runjournal.consumers.recovery.plan import build_plan, classify
from runjournal.consumers.recovery.report import RunOutcome, with_changes
from runjournal.consumers.runtime.failures import DependencyUnavailableError, FailurePolicy
from runjournal.core import failpoints
from runjournal.model.reducer import RunState
from runjournal.producers.errors import StalePlanError
from runjournal.producers.plan import PlanStore, RecoveryPlan

__all__ = ["HANDOVER_BATCH", "HandOver", "HandOvers"]

HANDOVER_BATCH = 256
"""Runs per batch: each of the three steps of a batch is one Redis round trip (and a script of this many runs)."""


@dataclass(frozen=True)
class HandOver:
    """One run to hand over."""

    plan: RecoveryPlan
    """The plan to store; ``plan.assigned_to`` is the live instance that takes the run."""
    dead_owner: str | None
    """The instance whose owned set lists the run, to take it from (None: nobody's)."""


Step = Callable[[list[HandOver]], dict[str, BaseException]]


@dataclass
class _Progress:
    """One hand-over's failures so far, and whether an outage may still be waited out."""

    failures: dict[str, BaseException] = field(default_factory=dict)
    """run_id -> why it was not handed over (in order of failure)."""
    patient: bool = True
    """False once an outage outlasted the policy: later steps are written once, without waiting."""


class HandOvers:
    """The hand-over writes of one key prefix (see the module docstring).

    Args:
        client: a client from ``runjournal.core.redis_client`` (one server or a cluster).
        plans: the plan store of the same prefix (its key names).
        policy: the failure policy: a step that fails transiently is tried again, bounded by its ``max_wait_s``.
    """

    def __init__(self, client: Any, plans: PlanStore, policy: FailurePolicy) -> None:
        self.r = client
        self.plans = plans
        self.policy = policy

    def hand_over(self, items: Sequence[HandOver]) -> None:
        """Hand every run of ``items`` over, batch by batch (module docstring).

        Raises:
            DependencyUnavailableError, FatalDependencyError: the first run whose write failed (Redis stayed away,
                or refused), after every other run was handed over; the next pass completes it. Only the first
                outage is waited out (``policy.max_wait_s``): later batches are written once each, so an outage
                costs one wait, not one per batch.
        """
        progress = _Progress()
        for start in range(0, len(items), HANDOVER_BATCH):
            failpoints.hit("recovery.inside_handover")
            batch = list(items[start:start + HANDOVER_BATCH])
            batch = self._step("store plans", batch, self._put_plans, progress)
            failpoints.hit("recovery.handover.after_plan")
            batch = self._step("assign", batch, self._assign, progress)
            failpoints.hit("recovery.handover.after_assign")
            self._step("disown", [i for i in batch if i.dead_owner and i.dead_owner != i.plan.assigned_to],
                       self._disown, progress)
        if progress.failures:
            first, exc = next(iter(progress.failures.items()))
            self.policy.log.error("hand-over incomplete; the next pass completes it", extra={
                "runs": len(progress.failures), "first": first, "error": str(exc)})
            raise exc

    def unfinished(self, found: Sequence[tuple[RunOutcome, RunState, str | None]]) -> list[HandOver]:
        """Decide each ``(outcome, folded state, dead owner)`` whose journal names a live owner (``state.owner``), in
        a few round trips (pipelined, per slot), and return the hand-overs still to write.

        Where the owner holds the run (its owned set has it): leave it alone (``owner_alive``) — but if the dead
        owner's set still lists the run, a pass died before the hand-over's last write: remove it now
        (``handed_over``). Where it does not hold it: a pass committed RUN_RESUMED to it and died before the
        hand-over, or inside it: its hand-over (same epoch) is returned, and the outcome says ``handed_over``.

        Raises:
            DependencyUnavailableError, FatalDependencyError: Redis stayed away or refused (the policy's).
        """
        held = self.policy.call("hand over", lambda: self.holds([(st.owner or "", st.run_id) for _o, st, _d in found]))
        leftover = [(st, d) for (_o, st, d), h in zip(found, held, strict=True) if h and d and d != st.owner]
        removed = self.policy.call("hand over", lambda: self.disown_each([(d or "", st.run_id) for st, d in leftover]))
        completed = {st.run_id for (st, _d), r in zip(leftover, removed, strict=True) if r}
        items: list[HandOver] = []
        now_ms = int(time.time() * 1000)
        for (outcome, state, dead_owner), holds in zip(found, held, strict=True):
            if holds and state.run_id in completed:
                with_changes(outcome, action="handed_over", epoch=state.epoch, assigned_to=state.owner,
                             detail=f"completed an earlier pass's hand-over: {dead_owner} no longer lists it")
            elif holds:
                with_changes(outcome, action="owner_alive", detail=f"owned by live {state.owner}")
            else:
                classified = classify(state)
                items.append(HandOver(build_plan(state, classified, new_epoch=state.epoch, resumed_seq=state.last_seq,
                                                 assigned_to=state.owner, now_ms=now_ms), dead_owner))
                with_changes(outcome, action="handed_over", epoch=state.epoch, assigned_to=state.owner,
                             calls=classified.counts, detail="completed the hand-over of an earlier pass's RUN_RESUMED")
        return items

    def holds(self, pairs: Sequence[tuple[str, str]]) -> list[bool]:
        """For each ``(instance, run_id)``: is the run in the instance's owned set? One pipelined round trip.

        Raises:
            redis.RedisError: Redis failed (nothing is written).
        """
        return self._each(pairs, lambda pipe, instance, run_id: pipe.sismember(self.plans.owned_key(instance),
                                                                                 run_id))

    def disown_each(self, pairs: Sequence[tuple[str, str]]) -> list[bool]:
        """Remove each ``run_id`` from its ``instance``'s owned set; True where it was listed. One round trip.

        Raises:
            redis.RedisError: Redis failed (any of the removals may have happened; running it again is harmless).
        """
        return self._each(pairs, lambda pipe, instance, run_id: pipe.srem(self.plans.owned_key(instance), run_id))

    def _each(self, pairs: Sequence[tuple[str, str]], queue: Callable[[Any, str, str], Any]) -> list[bool]:
        if not pairs:
            return []
        pipe = self.r.pipeline(transaction=False)
        for instance, run_id in pairs:
            queue(pipe, instance, run_id)
        return [bool(int(reply)) for reply in pipe.execute()]

    # -- the three steps: each returns run_id -> error for the runs it did not write ----------------------------
    def _step(self, what: str, batch: list[HandOver], write: Step, progress: _Progress) -> list[HandOver]:
        """``write(batch)`` under the policy; runs it reports failed are written again (under the policy, bounded)
        before they are given up (into ``progress.failures``). Once an outage was waited out, steps are tried once.
        Returns the runs written."""
        if not batch:
            return []
        superseded: set[str] = set()
        try:
            if progress.patient:
                failed = self.policy.call(f"hand over: {what}", lambda: write(batch))
                superseded = {r for r, e in failed.items() if isinstance(e, StalePlanError)}
                if failed := {r: e for r, e in failed.items() if r not in superseded}:
                    failed = self._again(what, [i for i in batch if i.plan.run_id in failed], write)
            else:
                failed = write(batch)
                superseded = {r for r, e in failed.items() if isinstance(e, StalePlanError)}
                failed = {r: e for r, e in failed.items() if r not in superseded}
        except Exception as exc:  # noqa: BLE001 - classified by the policy already; raised after the other runs
            failed = {i.plan.run_id: exc for i in batch}
        if superseded:  # a later recovery's plan is stored: that one's hand-over is the run's, not this one
            self.policy.log.warning("hand-over superseded by a newer plan", extra={"runs": sorted(superseded)})
        for run_id, error in failed.items():
            progress.failures.setdefault(run_id, error)
            if isinstance(error, DependencyUnavailableError):
                progress.patient = False
        return [i for i in batch if i.plan.run_id not in failed and i.plan.run_id not in superseded]

    def _again(self, what: str, retry: list[HandOver], write: Step) -> dict[str, BaseException]:
        """Write ``retry`` again until it all succeeds or the policy gives up; returns what still fails."""
        left = {i.plan.run_id: i for i in retry}

        def attempt() -> None:
            errors = write(list(left.values()))
            for run_id in set(left) - set(errors):
                del left[run_id]
            if errors:
                raise next(iter(errors.values()))  # classified by the policy: transient ones are waited for

        try:
            self.policy.call(f"hand over: {what}", attempt)
        except Exception as exc:  # noqa: BLE001 - the caller records it for the runs still left
            return dict.fromkeys(left, exc)
        return {}

    def _put_plans(self, batch: list[HandOver]) -> dict[str, BaseException]:
        return dict(self.plans.put_many(i.plan for i in batch))

    def _assign(self, batch: list[HandOver]) -> dict[str, BaseException]:
        failed: dict[str, BaseException] = {}
        for assignee, runs in _grouped(batch, lambda i: i.plan.assigned_to).items():
            try:
                self.plans.assign_many(assignee, runs)
            except Exception as exc:  # noqa: BLE001 - this assignee's runs only; the runs before it may be assigned
                failed.update(dict.fromkeys(runs, exc))
        return failed

    def _disown(self, batch: list[HandOver]) -> dict[str, BaseException]:
        groups = _grouped(batch, lambda i: i.dead_owner)
        pipe = self.r.pipeline(transaction=False)
        for owner, runs in groups.items():
            pipe.srem(self.plans.owned_key(owner), *runs)
            pipe.srem(self.plans.incoming_key(owner), *runs)
        replies = pipe.execute(raise_on_error=False)
        failed: dict[str, BaseException] = {}
        for i, runs in enumerate(groups.values()):
            for reply in replies[2 * i:2 * i + 2]:
                if isinstance(reply, Exception):
                    failed.update(dict.fromkeys(runs, reply))
        return failed


def _grouped(batch: Iterable[HandOver], by: Callable[[HandOver], str | None]) -> dict[str, list[str]]:
    """run ids of ``batch`` by ``by(item)`` (items where it is None are left out), in batch order."""
    out: dict[str, list[str]] = {}
    for item in batch:
        key = by(item)
        if key is not None:
            out.setdefault(key, []).append(item.plan.run_id)
    return out

"""Operator controls: cancel, pause and resume a run — ``runjournal cancel|pause|resume``, the console, Python.

docs/design/decisions/0047-operator-controls.md. Nobody but the run's writer writes its stream, so an operator never
publishes an event of the run: a cancel or a pause is a request (``runjournal.producers.control``) that the run's
live owner carries out at its next step boundary, or — when nobody live owns the run (its owner is dead, gave it
up, or the run is paused) — the recovery job carries out here and now, in a recovery pass over that run alone
(fence the dead owner, read to the end, publish in the recovery producer's transaction). A resume of a paused run
is such a pass too: RUN_RESUMED under a new epoch, handed to a live instance.

One function per action, the same semantics from every front end; each returns a :class:`ControlResult` and
waits (up to ``wait_s``) until the request was carried out: ``cancelled`` / ``paused`` / ``resumed`` — or
``requested`` when the owner has not reached a step boundary yet (it will; the request is stored and every live
instance has read it, ``seen``).

Least privilege (docs/operations/cluster-and-least-privilege.md): an operator whose credentials may not run a
recovery pass (its Kafka user has no transactional id; its Redis user may not write what a pass writes) does not
fail — the request is durable, and the recovery service (``runjournal recover --stale --watch``, as its own user)
carries it out at its next sweep: a cancel or pause as any request on a run nobody live owns, a resume as a
``resume`` request whose timer is armed at once (the sweep's wake pass hands the run over), a signal's wake-up
likewise. The result says so (``outcome`` ``requested``, ``detail`` naming the service).
"""

from __future__ import annotations

import getpass
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from runjournal.consumers.projector.index import read_entries
from runjournal.consumers.projector.store import ProjectionStore
from runjournal.consumers.recovery.instances import Instances
from runjournal.consumers.recovery.job import RecoveryError, RecoveryJob
from runjournal.consumers.recovery.resumed import SUPERSEDED
from runjournal.consumers.runtime.partitions import events_partition_count
from runjournal.core import redis_client as redis_clients
from runjournal.core.dependency_errors import not_permitted
from runjournal.core.errors import RunjournalError
from runjournal.core.ids import RUN_ID
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.model.reducer import RunState, RunStatus
from runjournal.producers.control import RESUME, ControlRequest, ControlStore
from runjournal.schemas.keys import partition_for

__all__ = ["ControlRefusedError", "ControlResult", "ForkResult", "Operator", "RunFilter", "applies",
           "default_operator"]

_ENDED = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED})


def applies(action: str, status: str) -> bool:
    """Whether ``action`` applies to a run in ``status`` (a RunStatus value): cancel — not ended, not parked; pause —
    RUNNING or WAITING_APPROVAL; resume — PAUSED. What a bulk action selects and which buttons the console shows;
    the action itself checks the run again (a refusal is :class:`ControlRefusedError`).

    Raises:
        KeyError: ``action`` is not ``cancel``, ``pause`` or ``resume``.
    """
    return {"cancel": status not in {"SUCCEEDED", "FAILED", "CANCELLED", "GAP", "BLOCKED"},
            "pause": status in {"RUNNING", "WAITING_APPROVAL"},
            "resume": status == "PAUSED"}[action]


class ControlRefusedError(RunjournalError):
    """The action does not apply to the run: unknown run, already ended, not paused (resume), parked. Nothing was
    stored; the message says why and what to do instead."""


def default_operator() -> str:
    """``user@host``: who asks, when the caller does not say (``--by``)."""
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name (a container): still say where from
        user = "operator"
    return f"{user}@{socket.gethostname()}"


@dataclass
class ControlResult:
    """What one action did to one run (``--json``: :meth:`as_dict`)."""

    run_id: str
    """The run."""
    action: str
    """``cancel``, ``pause`` or ``resume``."""
    outcome: str
    """``cancelled`` / ``paused`` / ``resumed`` (carried out); ``requested`` (stored: the live owner carries it out
    at its next step); ``withdrawn`` (a resume took back a pause not yet carried out); ``would_*`` (``--dry-run``);
    ``no_live_instance`` (a resume with nobody to take the run: the next recovery pass hands it over)."""
    detail: str = ""
    """A sentence a person can act on."""
    status: str | None = None
    """The run's status as last read (the projection, or the recovery pass's fold)."""
    owner: str | None = None
    """The run's owner as last read."""
    request: dict[str, Any] | None = None
    """The request stored (or standing), when there is one."""
    seen: bool | None = None
    """True once every live instance had read the request (after that, no new intent of the run is sent)."""
    waited_ms: float = 0.0
    """How long the call waited for the action to be carried out (ms)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return asdict(self)


@dataclass
class ForkResult:
    """What a fork did, or would do (``--json``: :meth:`as_dict`)."""

    run_id: str
    """The source run."""
    fork_run_id: str
    """The fork's run id."""
    at_seq: int
    """The fork point: the source's history up to and including this seq."""
    outcome: str
    """``forked``, ``would_fork`` (``--dry-run``) or ``no_live_instance`` (nothing written)."""
    preview: dict[str, Any]
    """The source's calls by what the fork does with them: ``returned``, ``reconciled``, ``rerun``, ``may_repeat``
    (``runjournal.consumers.recovery.fork.ForkPreview``)."""
    assigned_to: str | None = None
    """The live instance it was handed to."""
    detail: str = ""
    """A sentence a person can act on."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return asdict(self)


@dataclass(frozen=True)
class RunFilter:
    """Which runs a bulk action takes, from the runs index (every field optional; all given must match)."""

    tenant: str | None = None
    """RUN_STARTED tenant."""
    agent: str | None = None
    """RUN_STARTED agent."""
    status: tuple[str, ...] = ()
    """Run statuses (``RUNNING``, ``WAITING_APPROVAL``, ``PAUSED`` …); empty: every status an action applies to."""
    older_than_s: float | None = None
    """Started at least this many seconds ago (by the journal's ``occurred_at``; s)."""
    limit: int = 1000
    """At most this many runs (the oldest first)."""

    def describe(self) -> str:
        """The filter in words (what ``--dry-run`` prints above its list)."""
        parts = [f"tenant={self.tenant}" if self.tenant else "", f"agent={self.agent}" if self.agent else "",
                 f"status={','.join(self.status)}" if self.status else "",
                 f"started more than {self.older_than_s:g} s ago" if self.older_than_s is not None else ""]
        return ", ".join(p for p in parts if p) or "every run"


@dataclass
class Operator:
    """The operator side of cancel / pause / resume for one prefix (module docstring).

    Args:
        settings: bootstrap, Redis, prefix.
        wait_s: how long each action waits to be carried out (s; 0: store the request and return).
        poll_s: how often it looks while it waits (s).
    """

    settings: Settings
    wait_s: float = 30.0
    poll_s: float = 0.2
    _job: RecoveryJob | None = field(default=None, init=False, repr=False)
    refused: str | None = field(default=None, init=False)
    """Why this operator's own recovery pass was refused (an ACL it lacks), once it was: requests are then left to
    the recovery service (module docstring). None while its passes work."""

    def __post_init__(self) -> None:
        self.redis = redis_clients.client(self.settings)
        self.store = ProjectionStore(self.redis, self.settings.topic_prefix)
        self.controls = ControlStore(self.redis, self.settings.topic_prefix)
        self.instances = Instances(self.redis, self.settings.topic_prefix)
        self.keys = RedisKeys(self.settings.topic_prefix)
        self._partitions = events_partition_count(self.settings)

    def close(self) -> None:
        """Close the recovery job this operator used, if any."""
        if self._job is not None:
            self._job.close()
            self._job = None

    def __enter__(self) -> Operator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def job(self) -> RecoveryJob:
        """The recovery job that carries requests out on runs nobody live owns (built on first use)."""
        if self._job is None:
            self._job = RecoveryJob(self.settings, max_wait_s=min(self.wait_s, 30.0) or 1.0)
        return self._job

    def _pass(self, act: Callable[[RecoveryJob], Any]) -> Any:
        """Run ``act`` (a recovery pass) unless this operator's credentials were refused one; on an ACL refusal note
        it in :attr:`refused` and return None (the recovery service carries the request out). Other errors raise."""
        if self.refused is not None:
            return None
        try:
            return act(self.job)
        except Exception as exc:
            if not not_permitted(exc):
                raise
            self.refused = f"{type(exc).__name__}: {exc}"
            return None

    def _left_to_service(self, what: str) -> str:
        return (f"{what}: the recovery service carries it out at its next sweep (`runjournal recover --stale "
                f"--watch`, as the recovery user) — these credentials may not run a recovery pass ({self.refused})")

    # -- reading -------------------------------------------------------------------------------------------------
    def state(self, run_id: str) -> RunState | None:
        """The run's projected state (None: not projected — never started, or the projector lags)."""
        return self.store.get(partition_for(run_id, self._partitions), run_id)

    def select(self, flt: RunFilter, action: str) -> list[str]:
        """Run ids of the runs index matching ``flt`` that ``action`` applies to (cancel: not ended; pause: not
        ended, not paused; resume: paused), oldest first, at most ``flt.limit``."""
        now_ms = time.time() * 1000
        out = []
        for e in read_entries(self.redis, self.store, range(self._partitions)):
            if not applies(action, e["s"]) or (flt.status and e["s"] not in flt.status):
                continue
            if (flt.tenant and e["t"] != flt.tenant) or (flt.agent and e["a"] != flt.agent):
                continue
            if flt.older_than_s is not None and (e["b"] is None or now_ms - e["b"] < flt.older_than_s * 1000):
                continue
            out.append((e["b"] or 0, e["id"]))
        return [run_id for _b, run_id in sorted(out)[: flt.limit]]

    # -- actions --------------------------------------------------------------------------------------------------
    def cancel(self, run_id: str, *, reason: str = "", requested_by: str | None = None,
               dry_run: bool = False) -> ControlResult:
        """Cancel ``run_id``: no new intent of it is sent once every live instance has read the request; calls in
        flight end as usual (COMMITTED, FAILED, or an unknown outcome reconciled by the next owner before the cancel
        is carried out); the run ends RUN_CANCELLED with who and why and is never resumed.

        Raises:
            ControlRefusedError: unknown run, or already ended (nothing stored).
            InvalidIdError: ``run_id`` is not a run id a lookup accepts.
        """
        return self._stop(run_id, "cancel", reason, requested_by, dry_run)

    def pause(self, run_id: str, *, reason: str = "", requested_by: str | None = None,
              dry_run: bool = False) -> ControlResult:
        """Pause ``run_id``: its owner stops at its next step boundary and gives the run up; the recovery job holds it
        for nobody (a RUN_RESUMED with ``paused``) until :meth:`resume`. A cancel pending on the run stands.

        Raises:
            ControlRefusedError: unknown run, already ended, already paused (nothing stored).
            InvalidIdError: ``run_id`` is not a run id a lookup accepts.
        """
        return self._stop(run_id, "pause", reason, requested_by, dry_run)

    def resume(self, run_id: str, *, reason: str = "", requested_by: str | None = None,
               dry_run: bool = False) -> ControlResult:
        """Resume a paused run: RUN_RESUMED under a new epoch, handed to a live instance (the least loaded), which
        continues it like any resumed run (recorded calls return their results, unknown ones are reconciled). A
        pause requested but not yet carried out is withdrawn instead.

        Raises:
            ControlRefusedError: unknown run, or neither paused nor with a pause pending (nothing changed).
            InvalidIdError: ``run_id`` is not a run id a lookup accepts.
        """
        RUN_ID.check_lookup(run_id)
        who = requested_by or default_operator()
        started = time.monotonic()
        state = self._known(run_id)
        pending = self.controls.get(run_id)
        paused = state is not None and state.status is RunStatus.PAUSED
        if pending is not None and pending.action == "pause" and not paused:
            if dry_run:
                return ControlResult(run_id, "resume", "would_withdraw", "the pause requested by "
                                     f"{pending.requested_by} has not been carried out: it would be withdrawn",
                                     status=_status(state), owner=state.owner if state else None,
                                     request=pending.as_dict())
            withdrawn = self.controls.withdraw(run_id, "pause")
            if withdrawn:
                return ControlResult(run_id, "resume", "withdrawn", f"the pause requested by {pending.requested_by} "
                                     "had not been carried out; it is withdrawn and the run goes on",
                                     status=_status(state), owner=state.owner if state else None,
                                     request=pending.as_dict(), waited_ms=_ms(started))
            state = self._known(run_id)  # carried out meanwhile: resume the paused run
        if state is None or state.status is not RunStatus.PAUSED:
            raise ControlRefusedError(f"run {run_id} is {_status(state)}, not paused: nothing to resume"
                                      + (" (to continue a FAILED run: runjournal recover --continue RUN_ID)"
                                         if state is not None and state.status is RunStatus.FAILED else ""))
        if dry_run:
            return ControlResult(run_id, "resume", "would_resume", f"paused by {state.requested_by}; it would be "
                                 "handed to a live instance under a new epoch", status=state.status.value)
        for _attempt in range(3):  # another recovery actor's producer fenced this pass's: the next pass fences it
            report = self._pass(lambda job: job.recover(runs=[run_id], resume_paused=True, requested_by=who,
                                                        reason=reason or None))
            if report is None:  # refused: a resume request, carried out by the recovery service's wake pass
                return self._resume_by_service(run_id, who, reason, state, started)
            (outcome,) = [o for o in report.runs if o.run_id == run_id]
            if outcome.action not in (SUPERSEDED, "retry_later") or time.monotonic() >= started + self.wait_s:
                break
            time.sleep(self.poll_s)
        result = ControlResult(run_id, "resume", outcome.action, outcome.detail or "", status=state.status.value,
                               owner=outcome.assigned_to, waited_ms=_ms(started))
        if outcome.action == "resumed":
            result.detail = f"epoch {outcome.epoch}, handed to {outcome.assigned_to}"
            result.status = RunStatus.RUNNING.value
        elif outcome.action == "finished":  # it ended first (a cancel won the race): as the stops say it
            result.outcome = (outcome.detail or "finished").lower()
            result.status = outcome.detail or result.status
            result.detail = f"the run ended {outcome.detail} before the resume was carried out"
        return result

    def _resume_by_service(self, run_id: str, who: str, reason: str, state: RunState,
                           started: float) -> ControlResult:
        """Leave a resume of the paused ``run_id`` to the recovery service (a ``resume`` request and its timer, one
        script) and wait up to ``wait_s`` for its wake pass to carry it out."""
        stored, request = self.controls.request(run_id, RESUME, requested_by=who, reason=reason)
        result = ControlResult(run_id, "resume", "requested", status=state.status.value, request=request.as_dict())
        if not stored and request.action != RESUME:
            raise ControlRefusedError(f"a {request.action} requested by {request.requested_by} is pending on run "
                                      f"{run_id} and stands; the resume was not stored")
        deadline = started + self.wait_s
        while self.controls.get(run_id) == request and time.monotonic() < deadline:
            time.sleep(self.poll_s)
        now = self._fold(run_id)
        if self.controls.get(run_id) != request and now is not None and now.status is not RunStatus.PAUSED:
            result.outcome, result.status, result.owner = "resumed", now.status.value, now.owner
            result.detail = f"by the recovery service: epoch {now.epoch}, handed to {now.owner}"
        else:
            result.detail = self._left_to_service("stored")
        result.waited_ms = _ms(started)
        return result

    def signal(self, run_id: str, name: str, payload: Any = None, *, requested_by: str | None = None) -> ControlResult:
        """Deliver the signal ``name`` with ``payload`` (a JSON value) to ``run_id`` — exactly once: a second delivery
        of the same name is refused (``already_delivered``), the first stands. A run waiting for it in a process
        (``run.wait_signal``) takes it at its next poll; a run held waiting for it is woken now (a recovery pass here
        hands it to a live instance). A signal sent before the run waits is there when it does.

        Raises:
            ControlRefusedError: unknown or ended run; with ``RUNJOURNAL_ENCRYPTION=on``, a key directory without
                the run's key (the payload is sealed under it: decision 0059). Nothing delivered.
            InvalidIdError: ``name`` breaks the call-id rules; a ``run_id`` a lookup refuses.
            NonCanonicalValueError: ``payload`` has no exact JSON form (nothing delivered).
            EncryptedContentError / KeyUnavailableError: the payload could not be sealed (nothing delivered).
        """
        from runjournal.core.ids import CALL_ID
        from runjournal.producers import canonical_value
        from runjournal.producers.waits import SignalInbox

        RUN_ID.check_lookup(run_id)
        CALL_ID.check(name)
        canonical_value(payload, "signal payload")
        who = requested_by or default_operator()
        started = time.monotonic()
        state = self._known(run_id)
        if state is not None and state.status in _ENDED:
            raise ControlRefusedError(f"run {run_id} already ended ({state.status.value}); no signal is delivered")
        seal = None
        if self.settings.encryption == "on":  # the inbox is at rest too: sealed under the run's key (decision 0059)
            if state is None or state.tenant_id is None:
                raise ControlRefusedError(f"run {run_id}: its tenant is not known yet, so its signal cannot be sealed "
                                          "(RUNJOURNAL_ENCRYPTION=on); try again")
            from runjournal.producers.encryption import ContentCrypto, signal_address

            crypto, tenant, user = ContentCrypto(self.settings), state.tenant_id, state.user_id
            if not crypto.has_key(tenant, user):
                raise ControlRefusedError(f"run {run_id}: this host's key directory holds "
                                          "no live key of the run's user, so its signal cannot be sealed for it: "
                                          "use the agents' RUNJOURNAL_KEYS_DIR (docs/guide/encryption.md)")
            seal = lambda text: crypto.seal_text(text, tenant_id=tenant, subject=user,  # noqa: E731
                                                 run_id=run_id, address=signal_address(name), field="payload")
        if not SignalInbox(self.redis, self.settings.topic_prefix).send(run_id, name, payload, sent_by=who,
                                                                        seal=seal):
            return ControlResult(run_id, "signal", "already_delivered", f"signal {name!r} was delivered to {run_id} "
                                 "before; the first delivery stands (a signal is delivered once)",
                                 status=_status(state), owner=state.owner if state else None)
        self.controls.arm(run_id, self.controls.now_ms(), lt=True)  # a held run waiting for it wakes at the next sweep
        result = ControlResult(run_id, "signal", "delivered", status=_status(state),
                               owner=state.owner if state else None)
        if state is not None and state.status is RunStatus.PAUSED and state.waiting_for == name:
            report = self._pass(lambda job: job.wake([run_id]))
            outcome = next((o for o in report.runs if o.run_id == run_id), None) if report is not None else None
            if report is None:
                result.detail = self._left_to_service("the run waits for it; its timer is armed")
            elif outcome is not None and outcome.action == "resumed":
                result.detail = f"the run waited for it: woken, epoch {outcome.epoch}, handed to {outcome.assigned_to}"
                result.status, result.owner = RunStatus.RUNNING.value, outcome.assigned_to
            elif outcome is not None:
                result.detail = f"the run waits for it; wake-up: {outcome.action} — {outcome.detail or ''}"
        else:
            result.detail = "delivered: the run takes it when it waits for it (or at its next poll)"
        result.waited_ms = _ms(started)
        return result

    def fork(self, run_id: str, *, at_seq: int | None = None, at_event: str | None = None,
             new_run_id: str | None = None, reason: str = "", requested_by: str | None = None,
             dry_run: bool = False, assign_to: str | None = None) -> ForkResult:
        """Fork ``run_id`` at a point of its history: a new run whose journal starts with the source's execution
        facts up to that point (copied, under the source's keys), handed to a live instance that re-executes the
        agent's code — recorded calls return their results, calls unknown at the fork point are reconciled first,
        every later call runs under the fork's new keys (docs/design/decisions/0049-fork.md). ``dry_run``: nothing is
        written; the result lists every call and what the fork does with it — ``may_repeat`` the effects it may
        perform again.

        Args:
            at_seq: the fork point: the source's history up to and including this seq. ``at_event``: the same,
                named by an event id. Neither: the source's end.
            new_run_id: the fork's run id (default ``<source>-fork-<8 hex>``; checked by the run-id rules).
            assign_to: the live instance to hand it to (default: the least loaded).

        Raises:
            ControlRefusedError: unknown run, a fork point outside its history, a parked source, or a new run id
                that exists (nothing written).
            InvalidIdError: an id a lookup refuses; a ``new_run_id`` that breaks the run-id rules.
        """
        from runjournal.consumers.ops.inspect import read_run_events
        from runjournal.consumers.recovery.fork import fork_history, preview
        from runjournal.model.reducer import fold

        RUN_ID.check_lookup(run_id)
        who = requested_by or default_operator()
        partition = partition_for(run_id, self._partitions)
        rows = [r for r in read_run_events(self.settings, run_id, partition=partition) if "event" in r]
        if not rows:
            raise ControlRefusedError(f"no run {run_id} in the journal (prefix {self.settings.topic_prefix}): check "
                                      "the id (runjournal inspect) and RUNJOURNAL_TOPIC_PREFIX")
        positioned = [(r["event"], partition, r["offset"]) for r in rows]
        if at_event is not None:
            seqs = [r["event"].seq for r in rows if r["event"].event_id == at_event]
            if not seqs:
                raise ControlRefusedError(f"run {run_id} has no event {at_event}")
            at_seq = seqs[0]
        now = fold(positioned)
        assert now is not None
        at_seq = now.last_seq if at_seq is None else at_seq
        if not 1 <= at_seq <= now.last_seq:
            raise ControlRefusedError(f"the fork point must be a seq of run {run_id}: 1 to {now.last_seq}, "
                                      f"got {at_seq}")
        at = fold(positioned, until_seq=at_seq)
        assert at is not None
        if at.parked or now.parked:
            raise ControlRefusedError(f"run {run_id} is parked ({now.status.value}); repair it before forking")
        fork_id = new_run_id or _fork_id(run_id)
        RUN_ID.check(fork_id)
        if fork_id == run_id or self.instances.runs_started_by([fork_id]).get(fork_id) is not None \
                or self.state(fork_id) is not None:  # checked in a dry run too (the fork's claim is SET NX)
            raise ControlRefusedError(f"run {fork_id} exists: a fork needs a new run id (--run-id, or none for "
                                      f"{run_id}-fork-<hex>)")
        if assign_to is not None and assign_to not in (live := self.instances.live()):
            raise ControlRefusedError(f"--assign-to {assign_to}: no live instance holds that lease (live: "
                                      f"{', '.join(sorted(live)) or 'none'})")
        seen = preview(at, now)
        result = ForkResult(run_id=run_id, fork_run_id=fork_id, at_seq=at_seq, outcome="would_fork",
                            preview=seen.as_dict())
        if dry_run:
            result.detail = (f"{len(seen.returned)} call(s) returned from the record, {len(seen.reconciled)} "
                             f"reconciled first, {len(seen.rerun)} run again under the source's key, "
                             f"{len(seen.may_repeat)} side effect(s) the fork may perform again")
            return result
        history = fork_history(at, fork_id=fork_id, at_seq=at_seq, requested_by=who, reason=reason or None)
        try:
            outcome = self.job.start_fork(history, assign_to=assign_to, requested_by=who, reason=reason or None)
        except RecoveryError as exc:
            raise ControlRefusedError(str(exc)) from exc
        result.outcome = outcome.action
        result.assigned_to = outcome.assigned_to
        result.detail = (f"epoch {outcome.epoch}, handed to {outcome.assigned_to}" if outcome.action == "forked"
                         else outcome.detail or "")
        return result

    # -- cancel / pause -------------------------------------------------------------------------------------------
    def _known(self, run_id: str) -> RunState | None:
        """The run's state read from the journal to its end (the projection may lag what was just written)."""
        state = self._fold(run_id)
        if state is None and self.instances.runs_started_by([run_id]).get(run_id) is None:
            raise ControlRefusedError(f"no run {run_id} here (prefix {self.settings.topic_prefix}): not in the "
                                      "projection and never started — check the id (runjournal inspect)")
        return state

    def _stop(self, run_id: str, action: str, reason: str, requested_by: str | None,
              dry_run: bool) -> ControlResult:
        RUN_ID.check_lookup(run_id)
        who = requested_by or default_operator()
        started = time.monotonic()
        state = self._known(run_id)
        if state is not None and state.status in _ENDED:
            raise ControlRefusedError(f"run {run_id} already ended ({state.status.value}); nothing to {action}")
        if state is not None and state.parked:
            raise ControlRefusedError(f"run {run_id} is parked ({state.status.value}: "
                                      f"{state.gap_reason or state.blocked_reason}); repair it first (runjournal "
                                      "inspect), or erase it")
        if action == "pause" and state is not None and state.status is RunStatus.PAUSED:
            raise ControlRefusedError(f"run {run_id} is paused already (by {state.requested_by}); "
                                      f"runjournal resume {run_id} continues it")
        if dry_run:
            owner = (state.owner if state else None) or "nobody"
            return ControlResult(run_id, action, f"would_{action}", f"owned by {owner}",
                                 status=_status(state), owner=state.owner if state else None)
        stored, request = self.controls.request(run_id, action, requested_by=who, reason=reason)
        result = ControlResult(run_id, action, "requested", status=_status(state),
                               owner=state.owner if state else None, request=request.as_dict())
        if not stored:
            result.detail = (f"a {request.action} requested by {request.requested_by} is pending and stands; "
                             "this request was not stored")
        self._carry_out(request, result, started)
        return result

    def _carry_out(self, request: ControlRequest, result: ControlResult, started: float) -> None:
        """Wait up to ``wait_s`` for ``request`` to be carried out — by its live owner, or by a recovery pass over
        the run here when nobody live owns it — filling ``result``."""
        version = self.controls.version()
        deadline = started + self.wait_s
        run_id = request.run_id
        while True:
            if result.seen is not True:
                result.seen = self._seen_by_all(version)
            if self.controls.get(run_id) != request:  # carried out (the owner or a pass removed it) or replaced
                self._finish(request, result)
                break
            try:
                report = self._pass(lambda job: job.recover(runs=[run_id]))  # refused while a live owner has it
            except RecoveryError:
                report = None
            if report is None and self.refused is not None:
                result.detail = self._left_to_service("stored; the owner carries it out at its next step, or, if "
                                                      "nobody live owns the run")
            if report is not None:
                outcome = next((o for o in report.runs if o.run_id == run_id), None)
                if outcome is not None and outcome.action in ("cancelled", "paused", "finished"):
                    self._finish(request, result)
                    break
                if outcome is not None:
                    result.detail = f"recovery pass: {outcome.action}{': ' + outcome.detail if outcome.detail else ''}"
            if time.monotonic() >= deadline:
                break
            time.sleep(self.poll_s)
        result.waited_ms = _ms(started)
        if result.outcome == "requested" and self.refused is not None and result.detail.startswith("recovery pass"):
            result.detail = self._left_to_service("stored")
        if result.outcome == "requested" and not result.detail:
            result.detail = (f"stored; the owner {result.owner or '(none yet)'} carries it out at its next step "
                             "(a tool call, a node, an approval wait)")

    def _finish(self, request: ControlRequest, result: ControlResult) -> None:
        state = self.job.store.get(partition_for(request.run_id, self._partitions), request.run_id)
        fold = self._fold(request.run_id)
        state = fold or state
        result.status = _status(state)
        result.owner = state.owner if state else None
        if state is not None and state.status is RunStatus.CANCELLED:
            result.outcome = "cancelled"
            result.detail = f"RUN_CANCELLED at seq {state.last_seq} ({state.error})"
        elif state is not None and state.status is RunStatus.PAUSED:
            result.outcome = "paused"
            result.detail = f"held for nobody at epoch {state.epoch}: runjournal resume {request.run_id}"
        elif state is not None and state.status in _ENDED:
            result.outcome = state.status.value.lower()
            result.detail = f"the run ended {state.status.value} before the {request.action} was carried out"
        else:  # not pending any more, not carried out: another operator replaced or withdrew it
            result.outcome = "withdrawn"
            now = self.controls.get(request.run_id)
            result.detail = (f"replaced by a {now.action} requested by {now.requested_by} before it was carried out"
                             if now is not None and now != request else
                             "the request was replaced or withdrawn by another operator before it was carried out")
        if result.outcome != "withdrawn":  # carried out, or the run ended: no new intent of it is sent — what
            result.seen = True  # ``seen`` promises, also when the owner acted before marking the request read

    def _fold(self, run_id: str) -> RunState | None:
        """The run's state folded from the journal to its end (the projection may lag behind what was just
        written)."""
        from runjournal.consumers.recovery.tail import end_offsets, fold_tails, read_snapshots

        job = self.job
        partition = partition_for(run_id, self._partitions)
        snapshots = read_snapshots(job.store, job.policy, {partition: {run_id}})
        bounds = end_offsets(self.settings, {partition})
        states, _reads = fold_tails(self.settings, job.store, job.codec, {partition: {run_id}}, bounds,
                                    policy=job.policy, timeout_s=job.read_timeout_s, snapshots=snapshots)
        return states.get(run_id)

    def _seen_by_all(self, version: int) -> bool:
        """True when every instance holding a lease has read the requests at ``version`` or later."""
        live = sorted(self.instances.live())
        if not live:
            return True
        pipe = self.redis.pipeline(transaction=False)
        for instance in live:
            pipe.get(self.keys.control_seen(instance))
            pipe.exists(self.keys.lease(instance))
        replies = pipe.execute()
        for i in range(len(live)):
            seen, alive = replies[2 * i], replies[2 * i + 1]
            if alive and (seen is None or int(seen) < version):
                return False
        return True


def _fork_id(run_id: str) -> str:
    """``<source>-fork-<8 hex>``, or ``fork-<32 hex>`` when that would pass the run-id length limit."""
    candidate = f"{run_id}-fork-{uuid.uuid4().hex[:8]}"
    return candidate if RUN_ID.problem(candidate) is None else f"fork-{uuid.uuid4().hex}"


def _status(state: RunState | None) -> str:
    return state.status.value if state is not None else "NOT_PROJECTED"


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


def bulk(operator: Operator, action: str, run_ids: list[str], act: Callable[[str], ControlResult]) -> list[
        ControlResult]:
    """Apply ``act`` to each run, collecting results; a run the action does not apply to is a ``refused`` result
    (the others go on)."""
    out = []
    for run_id in run_ids:
        try:
            out.append(act(run_id))
        except ControlRefusedError as exc:
            out.append(ControlResult(run_id, action, "refused", str(exc)))
    return out

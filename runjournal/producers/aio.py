"""The asyncio front end: :class:`AsyncJournal` and :class:`AsyncRunHandle`, the same journal from ``async`` code.

Nothing of the protocol is written twice. An ``AsyncJournal`` owns a :class:`~runjournal.producers.journal.Journal`
and a pool of **producer threads**; every step that publishes (and so may wait for the broker's ack) runs the
sync code in one of them and the event loop awaits its future. ``call`` and ``await_approval`` are step
machines (``runjournal.producers._steps``): their steps run in the producer threads, their effects on the loop —
a coroutine tool (``async def acall(args, key)`` or an ``async def __call__``) is awaited there, a sync tool runs
in the loop's default executor, never on the loop itself. So the loop never blocks on Kafka or Redis, and the
guarantees are the sync API's own: intent acknowledged before the tool, outcome after it (by the next commit in
group commit), the same keys.

Why threads and not ``confluent_kafka.aio.AIOProducer``: measured (``bench/README.md``, pair 7). ``AIOProducer``
wraps the same sync producer in a thread pool, drops ``headers`` (traceparent) and ``on_delivery`` (the
journal's lost-event tracking) and would need a second copy of the transaction and failure handling
(``_txn.py``) written for asyncio.

One run is one ordered stream: every step of an ``AsyncRunHandle`` runs under the run's lock in a producer thread
(``RunHandle.advance``), so concurrent tasks on one handle publish one at a time while their tools run
concurrently on the loop (give them ``step=`` names so their keys do not depend on the order). A task cancelled —
once or repeatedly — while a step runs gets CancelledError once that step has finished; an abandoned call stays
open (its outcome unknown to the handle), and its next attempt keeps the key (docs/operations/concurrency.md).
Many handles on one ``AsyncJournal`` run concurrently and share the journal's group commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from runjournal.producers._steps import CallSteps, Effect, Invoke, Reconcile
from runjournal.producers.approvals import ApprovalInbox, approval_steps
from runjournal.producers.control import ControlRequest, current_stop, reset_stop
from runjournal.producers.handle import RunHandle
from runjournal.producers.journal import Journal
from runjournal.producers.spend import AsyncReservation, reserve_step
from runjournal.producers.streams import AsyncStream

if TYPE_CHECKING:
    from runjournal.core.settings import Settings
    from runjournal.producers.plan import ApprovalStatus, RecoveryPlan
    from runjournal.producers.tools import Tool
    from runjournal.schemas import Event, EventType

__all__ = ["AsyncJournal", "AsyncRunHandle"]

T = TypeVar("T")


class AsyncJournal:
    """An agent instance's journal for asyncio code. Open with ``await AsyncJournal.open(settings, …)``.

    Args:
        journal: the sync :class:`Journal` it drives (its lease, producer, threads).
        executor: the producer threads; owned (shut down by :meth:`close`).

    Attributes:
        sync: the :class:`Journal` itself (for code that needs the sync API, e.g. ``continue_run``).
        producer_id: this incarnation's instance id.
    """

    def __init__(self, journal: Journal, executor: ThreadPoolExecutor) -> None:
        self.sync = journal
        self.producer_id = journal.producer_id
        self.settings = journal.settings
        self._pool = executor

    @classmethod
    async def open(cls, settings: Settings, *, producer_threads: int = 64, **journal_options: Any) -> AsyncJournal:
        """Start a :class:`Journal` (in a producer thread: it takes the lease and calls ``init_transactions``).

        Args:
            settings: as ``Journal``.
            producer_threads: size of the producer thread pool (default 64): how many steps may wait for the
                broker at once; concurrent durable publishes share commits, so more threads mean more sharing.
            journal_options: ``Journal``'s keyword arguments (``producer_id``, ``lease_ttl_ms`` …).

        Raises:
            As ``Journal``.
        """
        pool = ThreadPoolExecutor(producer_threads, thread_name_prefix="runjournal-producer")
        try:
            journal = await asyncio.wrap_future(pool.submit(lambda: Journal(settings, **journal_options)))
            await _start_threads(pool, producer_threads)
        except BaseException:
            pool.shutdown(wait=False)
            raise
        return cls(journal, pool)

    async def run_sync(self, fn: Callable[..., T], *args: Any, on_discarded: Callable[[T], None] | None = None) -> T:
        """Run ``fn(*args)`` in a producer thread and await it. If the awaiting task is cancelled — once or any
        number of times — the call still runs to its end (it may be mid-publish) before CancelledError propagates:
        nothing of the run is touched while a step of it runs elsewhere. ``on_discarded`` receives a result the
        cancellation discarded (the step finished, its caller is gone)."""
        fut = asyncio.wrap_future(self._pool.submit(fn, *args))
        cancelled: asyncio.CancelledError | None = None
        while not fut.done():
            try:
                await asyncio.shield(fut)
            except asyncio.CancelledError as exc:  # cancelled (again) while the step runs: wait for it, then propagate
                cancelled = cancelled or exc
        if cancelled is None:
            return fut.result()  # the step's value, or what it raised
        try:
            result = fut.result()
        except BaseException:  # noqa: BLE001 - the step failed after the caller left: the caller gets its cancellation
            raise cancelled from None
        if on_discarded is not None:
            on_discarded(result)
        raise cancelled

    def wrap(self, handle: RunHandle) -> AsyncRunHandle:
        """An async handle over a sync ``handle`` of this journal (e.g. one from ``continue_run``)."""
        return AsyncRunHandle(self, handle)

    async def start_run(self, tenant_id: str, agent: str, input: Any, run_id: str | None = None, *,
                        user_id: str | None = None, traceparent: str | None = None) -> AsyncRunHandle:
        """As :meth:`Journal.start_run` (RUN_STARTED; ``RunExistsError`` for an existing id)."""
        handle = await self.run_sync(lambda: self.sync.start_run(
            tenant_id, agent, input, run_id, user_id=user_id, traceparent=traceparent))
        return AsyncRunHandle(self, handle)

    async def resume(self, run_id: str, *, traceparent: str | None = None) -> AsyncRunHandle:
        """As :meth:`Journal.resume` (``NoRecoveryPlanError`` without a plan assigned here)."""
        handle = await self.run_sync(lambda: self.sync.resume(run_id, traceparent=traceparent))
        return AsyncRunHandle(self, handle)

    async def claim_assignment(self, timeout_s: float) -> str | None:
        """As :meth:`Journal.claim_assignment`: the next run assigned here, waiting up to ``timeout_s`` s."""
        return await self.run_sync(self.sync.claim_assignment, timeout_s)

    async def flush(self) -> None:
        """Commit the open transaction (as :meth:`Journal.flush`)."""
        await self.run_sync(self.sync.flush)

    async def close(self) -> None:
        """Close the journal (as :meth:`Journal.close`), then the producer threads. Idempotent."""
        try:
            await self.run_sync(self.sync.close)
        finally:
            self._pool.shutdown(wait=False)

    async def __aenter__(self) -> AsyncJournal:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class AsyncRunHandle:
    """One run's writer for asyncio code: the methods of :class:`RunHandle`, awaited. Get one from
    :meth:`AsyncJournal.start_run` / :meth:`AsyncJournal.resume`. ``async with handle:`` publishes RUN_FAILED
    when an exception escapes, as the sync handle does.

    Attributes:
        sync: the :class:`RunHandle` it drives (use it only from the handle's own steps).
    """

    def __init__(self, journal: AsyncJournal, handle: RunHandle) -> None:
        self.journal = journal
        self.sync = handle

    # -- identity and state (no I/O) ------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.sync.run_id

    @property
    def tenant_id(self) -> str:
        """The run's tenant."""
        return self.sync.tenant_id

    @property
    def epoch(self) -> int:
        """The run's epoch as this handle writes it."""
        return self.sync.epoch

    @property
    def plan(self) -> RecoveryPlan | None:
        """The recovery plan the run resumed from, or None."""
        return self.sync.plan

    @property
    def finished(self) -> bool:
        """True once the run ended through this handle."""
        return self.sync.finished

    @property
    def last_seq(self) -> int:
        """The seq of the last event published."""
        return self.sync.last_seq

    def approval(self, call_id: str) -> ApprovalStatus | None:
        """As :meth:`RunHandle.approval`."""
        return self.sync.approval(call_id)

    # -- operations ---------------------------------------------------------------------------------------
    async def _op(self, fn: Callable[..., T], *args: Any) -> T:
        return await self.journal.run_sync(fn, *args)  # the sync handle takes the run's lock

    async def emit(self, type: EventType | str, payload: dict[str, Any], *, node_id: str | None = None,
                   durable: bool | None = None) -> Event:
        """As :meth:`RunHandle.emit`."""
        return await self._op(lambda: self.sync.emit(type, payload, node_id=node_id, durable=durable))

    async def message(self, role: str, content: str, *, user_id: str | None = None) -> Event:
        """As :meth:`RunHandle.message` (MESSAGE: memory only, never recovery)."""
        return await self._op(lambda: self.sync.message(role, content, user_id=user_id))

    async def correction(self, subject: str, text: str, *, user_id: str | None = None) -> Event:
        """As :meth:`RunHandle.correction`."""
        return await self._op(lambda: self.sync.correction(subject, text, user_id=user_id))

    async def request_approval(self, call_id: str, reason: str, tool: str | None = None, *,
                               args: Any = None) -> Event:
        """As :meth:`RunHandle.request_approval` (durable; ``args`` recorded as canonical JSON)."""
        return await self._op(lambda: self.sync.request_approval(call_id, reason, tool, args=args))

    async def succeed(self, output: Any = None) -> Event:
        """As :meth:`RunHandle.succeed` (durable; ends the run)."""
        return await self._op(self.sync.succeed, output)

    async def fail(self, error: str | BaseException) -> Event:
        """As :meth:`RunHandle.fail` (durable; ends the run)."""
        return await self._op(self.sync.fail, error)

    @contextlib.asynccontextmanager
    async def node(self, name: str) -> AsyncIterator[str]:
        """As :meth:`RunHandle.node`: NODE_STARTED on entry, NODE_SUCCEEDED / NODE_FAILED on exit (the sync
        handle's own context manager, entered and exited in a producer thread). Yields the node path."""
        manager = self.sync.node(name)
        path = await self._op(manager.__enter__)
        try:
            yield path
        except BaseException as exc:
            if not await self._op(manager.__exit__, type(exc), exc, exc.__traceback__):
                raise
            return  # pragma: no cover - RunHandle.node never swallows
        await self._op(manager.__exit__, None, None, None)

    async def call(self, tool: Tool, args: dict[str, Any], *, side_effect: bool | None = None,
                   step: str | None = None) -> Any:
        """As :meth:`RunHandle.call` — the same steps, the tool awaited on the loop (module docstring).

        Raises:
            As :meth:`RunHandle.call`. A cancellation while the tool runs leaves the call intended (its
            outcome unknown), exactly like an interrupted sync call.
        """
        token = current_stop(self.sync.pending_request)  # what stop_requested() shows the tool (this task only)
        try:
            return await self._drive(self.sync.call_steps(tool, args, side_effect=side_effect, step=step))
        finally:
            reset_stop(token)

    async def await_approval(self, inbox: ApprovalInbox, call_id: str, reason: str, *, tool: str | None = None,
                             args: Any = None, timeout_s: float = 300.0, poll_s: float = 0.1) -> bool:
        """As ``runjournal.producers.approvals.await_approval`` (the same steps; the wait is ``asyncio.sleep``)."""
        return bool(await self._drive(approval_steps(self.sync, inbox, call_id, reason, tool=tool, args=args,
                                                     timeout_s=timeout_s, poll_s=poll_s)))

    async def _drive(self, steps: CallSteps) -> Any:
        """Run the steps in producer threads (under the run's lock) and their effects on the loop, until the call
        returns or raises. A cancellation while a step runs waits for that step (``run_sync``); while an effect
        runs, the interruption is thrown into the steps (the call stays intended, nothing is published)."""
        value: Any = None
        error: BaseException | None = None
        ended = False  # the generator returned or raised: nothing to abandon
        try:
            while True:
                try:
                    done, out, _delivered = await self.journal.run_sync(
                        self.sync.advance_call, steps, value, error,
                        on_discarded=lambda result: self.sync.undeliver(result[2]))  # the value never reached us
                except asyncio.CancelledError:
                    raise  # the step ran to its end (run_sync): the generator is suspended or finished, not running
                except BaseException:
                    ended = True  # the protocol raised it (the call's own outcome)
                    raise
                if done:
                    ended = True
                    return out
                value, error = None, None
                try:
                    value = await _perform(out)
                except Exception as exc:  # noqa: BLE001 - thrown back into the protocol, which decides
                    error = exc
                except BaseException as exc:
                    with contextlib.suppress(BaseException):  # the call stays intended; no I/O, re-raises exc
                        await self.journal.run_sync(self.sync.advance, steps, None, exc)
                    ended = True
                    raise
        finally:
            if not ended:  # abandoned mid-call (cancelled): an intended call stays open, as in the sync API
                await self.journal.run_sync(self.sync.close_steps, steps)

    async def sleep(self, seconds: float | None = None, *, until_ms: int | None = None,
                    step: str | None = None) -> None:
        """As :meth:`RunHandle.sleep` (the same steps; an in-process wait is ``asyncio.sleep``)."""
        await self._drive(self.sync.sleep_steps(seconds, until_ms=until_ms, step=step))

    async def wait_signal(self, name: str, *, timeout_s: float | None = None, poll_s: float = 0.2,
                          step: str | None = None) -> Any:
        """As :meth:`RunHandle.wait_signal` (the same steps; the polls are ``asyncio.sleep``)."""
        return await self._drive(self.sync.wait_signal_steps(name, timeout_s=timeout_s, poll_s=poll_s, step=step))

    async def reserve(self, model: str, *, input_tokens: int, output_tokens: int, user_id: str | None = None,
                      step: str | None = None) -> AsyncReservation:
        """As :meth:`RunHandle.reserve` — the same reserve step (``runjournal.producers.spend.reserve_step``) driven by
        :meth:`call`; returns an :class:`~runjournal.producers.spend.AsyncReservation` to ``await r.settle(usage)``.

        Awaited like every other step of this handle, and an async context manager (left without a settle: settled
        at the estimate)::

            async with await run.reserve("gpt-4o", input_tokens=1200, output_tokens=512) as r:
                resp = await client.chat.completions.create(...)
                await r.settle(resp.usage)

        Args:
            model, input_tokens, output_tokens, user_id, step: as :meth:`RunHandle.reserve` (tokens: whole, >= 0).

        Raises:
            BudgetExceededError: a budget would pass its limit (``left``: what may still be reserved); nothing was
                charged.
            SpendValueError / UnknownModelError / InvalidIdError: bad input; nothing was published.
            As :meth:`call` otherwise.
        """
        tool, args, key = reserve_step(self.sync, model, input_tokens=input_tokens, output_tokens=output_tokens,
                                       user_id=user_id, step=step)
        result = await self.call(tool, args, step=key)
        return AsyncReservation(self, result, step=step, recorded=not tool.invoked)

    def pending_request(self) -> ControlRequest | None:
        """As :meth:`RunHandle.pending_request` (no I/O: the instance's last read)."""
        return self.sync.pending_request()

    def stream(self, name: str | None = None) -> AsyncStream:
        """As :meth:`RunHandle.stream`: ``async with run.stream() as s: await s.write("tok")``."""
        return AsyncStream(lambda: self.sync.stream(name), self.journal.run_sync)

    async def stop_if_requested(self) -> None:
        """As :meth:`RunHandle.stop_if_requested` (raises ``RunCancelledError`` / ``RunPausedError``)."""
        await self._op(self.sync.stop_if_requested)

    async def step_boundary(self) -> None:
        """As :meth:`RunHandle.step_boundary` (raises ``RunCancelledError`` / ``RunPausedError``)."""
        await self._op(self.sync.step_boundary)

    async def __aenter__(self) -> AsyncRunHandle:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._op(self.sync.__exit__, exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"Async{self.sync!r}"


async def _start_threads(pool: ThreadPoolExecutor, n: int) -> None:
    """Start all ``n`` threads now: a pool starts a thread inside ``submit`` (on the loop) the first time it is
    short of one — at open time, not in the middle of the application's first burst of runs."""
    barrier = threading.Barrier(n)

    def meet() -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=10)

    await asyncio.gather(*(asyncio.wrap_future(pool.submit(meet)) for _ in range(n)))


async def _perform(effect: Effect) -> Any:
    """Perform one effect on the loop: await a coroutine tool, run a sync one in the default executor."""
    if isinstance(effect, Invoke):
        tool = effect.tool
        acall = getattr(tool, "acall", None)
        if callable(acall):
            return await acall(effect.args, effect.idempotency_key)
        if inspect.iscoroutinefunction(type(tool).__call__):
            return await tool(effect.args, effect.idempotency_key)
        return await asyncio.to_thread(tool, effect.args, effect.idempotency_key)
    if isinstance(effect, Reconcile):
        areconcile = getattr(effect.tool, "areconcile", None)
        if callable(areconcile):
            return await areconcile(effect.idempotency_key)
        return await asyncio.to_thread(effect.tool.reconcile, effect.idempotency_key)  # type: ignore[attr-defined]
    await asyncio.sleep(effect.seconds)
    return None

"""LangGraph on the journal (``pip install 'runjournal[langgraph]'``).

* :class:`JournalRuns` — one journal run per LangGraph thread (``run_id = thread_id``): started on first use,
  or attached after ``Journal.resume`` / ``continue_run`` hand the run to this instance.
* :class:`JournalCheckpointSaver` — a ``BaseCheckpointSaver`` (sync and async methods) whose checkpoints and
  pending writes are records in the journal's transaction, projected into Redis for reads
  (``runjournal.adapters._checkpoints``). It passes ``langgraph-checkpoint-conformance`` (all base checks).
* :func:`journaled_tool_node` — a ``ToolNode`` whose every tool call goes through ``RunHandle.call`` keyed by
  the model's ``tool_call_id`` (``call(step=…)``): a graph resumed from its checkpoint re-runs the tool node,
  and the journal — not the graph — decides: a committed call returns its recorded result, an unknown one is
  reconciled by key, a new one runs once. LangGraph nodes are at-least-once; the effects inside them are not.
* :meth:`JournalRuns.call` (async :meth:`JournalRuns.acall`) — a call a node makes itself, keyed by its graph task
  and its number in the task (not by the handle's count of the run's calls, which a graph resumed from its
  checkpoint does not replay: an earlier node's key would answer a later node's call).
* :class:`GraphNodeJournal` — a LangChain callback handler (``runs.graph_nodes``) that journals every node the
  graph runs: NODE_STARTED / NODE_SUCCEEDED / NODE_FAILED with the node's name as ``node_id`` (``outer/inner``
  inside a subgraph), so the run's projected state lists the graph's nodes. :meth:`JournalRuns.compile` compiles
  a graph with the checkpointer and this handler.
* :class:`GraphSpendJournal` — a callback handler (``runs.graph_spend``) that reserves spend before every chat model
  or LLM call the graph makes and settles it with the usage the model reports (``RunHandle.reserve``; issue 32,
  docs/guide/spend.md). On when the settings configure spend (``JournalRuns(spend=…)`` overrides);
  :meth:`JournalRuns.compile` adds it then.

Durable waits and operator controls (docs/design/decisions/0047-operator-controls.md, 0050-durable-waits.md): a node
waits for an external event with :meth:`JournalRuns.wait_signal` (its payload is the answer: ``runjournal signal
RUN_ID NAME --payload JSON``, ``Operator.signal``) or sleeps with :meth:`JournalRuns.sleep` — recorded steps keyed
by name (or by the graph task), so a node re-run from its checkpoint or after an ``interrupt()`` does not wait
again. An operator's cancel or pause is carried out at every graph node's entry and after every journaled tool
call; a tool sees it while it runs through ``runjournal.producers.stop_requested()``; ``graph.invoke`` raises
``RunCancelledError`` / ``RunPausedError`` (a long wait: ``RunWaitingError``) and the stopped node keeps no outcome.

Crash resume: ``recover`` hands the run to a live instance, which does ``runs.attach(journal.resume(run_id))``
and ``graph.invoke(None, {"configurable": {"thread_id": run_id}})``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any
from uuid import UUID

try:
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.messages import ToolMessage
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_checkpoint_metadata,
    )
    from langgraph.checkpoint.base import writes_sort_key as _sort_key
    from langgraph.errors import GraphBubbleUp, GraphInterrupt
    from langgraph.prebuilt import ToolNode
except ModuleNotFoundError as exc:  # pragma: no cover - the core install
    raise ModuleNotFoundError(f"runjournal.adapters.langgraph needs {exc.name}: pip install 'runjournal[langgraph]'",
                              name=exc.name) from exc

from runjournal.adapters._checkpoints import SEP, FrameworkRecordStore, Record, join_field
from runjournal.adapters.spend import DEFAULT_OUTPUT_TOKENS, estimate_input_tokens, output_limit, spend_enabled
from runjournal.adapters.tools import JournaledTool, Reconciler
from runjournal.core.ids import NODE_NAME, NODE_PATH, THREAD_ID
from runjournal.producers import Journal, RunHandle, canonical_value, digest
from runjournal.producers.aio import AsyncJournal, AsyncRunHandle
from runjournal.producers.errors import JournalError, PlanMismatchError, RunExistsError, RunStoppedError
from runjournal.producers.handle import error_text
from runjournal.producers.spend import Reservation, Usage
from runjournal.producers.tools import Tool
from runjournal.schemas import EventType

__all__ = ["GraphNodeJournal", "GraphSpendJournal", "JournalCheckpointSaver", "JournalRuns", "TaskStepError",
           "ThreadNotOwnedError", "journaled_tool_node"]

log = logging.getLogger("runjournal.adapters.langgraph")


@dataclass
class _TaskSteps:
    """One execution of a graph task: the steps of one kind it has taken so far."""

    n: int = 0
    """How many (the latest one's number)."""
    failed: str | None = None
    """The tool and args digest of the latest call when it raised: the same call made next is its next attempt,
    under the same step. Set only once a call raised — two calls in flight at once never share a step."""


_TASK_STEPS_KEPT = 4096
"""How many task executions' counts a :class:`JournalRuns` keeps (least recently used first out): an execution's
count is needed while it runs; thousands of executions later it is long over."""


class TaskStepError(JournalError):
    """A node's default-keyed call or sleep could not be given a step that is safe: its config names a graph task but
    is not a node's own (no callback run id to count in), or the same step is in flight in this process already. Give
    it ``step=`` (a name unique in the run): otherwise a second call could be answered with the first one's record
    and its effect silently dropped."""


class ThreadNotOwnedError(RunExistsError):
    """A thread's run exists but this instance holds no handle for it: it belongs to another instance or awaits
    recovery. Resume it here (``journal.claim_assignment`` + ``journal.resume``, then ``runs.attach``)."""


class JournalRuns:
    """Thread id → the run handle this instance writes it with. Thread-safe.

    Args:
        journal: a :class:`Journal`, or an :class:`AsyncJournal` (its producer threads run the async methods).
        tenant_id, agent: of runs started here.
        spend: reserve and settle spend around every model call of the graphs compiled here
            (:class:`GraphSpendJournal`); None (default): when the journal's settings configure spend (prices or
            budgets: ``runjournal.adapters.spend``).

    Attributes:
        graph_nodes: the :class:`GraphNodeJournal` of these runs — among a graph's callbacks (:meth:`compile` puts
            it there), every node the graph runs is journaled on its thread's run.
        graph_spend: the :class:`GraphSpendJournal` of these runs (:meth:`compile` adds it when it is enabled).
    """

    def __init__(self, journal: Journal | AsyncJournal, *, tenant_id: str = "default", agent: str = "langgraph",
                 spend: bool | None = None):
        self.async_journal = journal if isinstance(journal, AsyncJournal) else None
        self.journal: Journal = journal.sync if isinstance(journal, AsyncJournal) else journal
        self.tenant_id = tenant_id
        self.agent = agent
        self._handles: dict[str, RunHandle] = {}
        self._async: dict[str, AsyncRunHandle] = {}
        self._lock = threading.Lock()
        self._steps_in_flight: set[tuple[str, str]] = set()
        self._task_steps: OrderedDict[tuple[Any, str, str], _TaskSteps] = OrderedDict()
        self.store = FrameworkRecordStore(self.journal)
        self.graph_nodes = GraphNodeJournal(self)
        self.graph_spend = GraphSpendJournal(self, enabled=spend_enabled(self.journal.settings, spend))

    def compile(self, graph: Any, *, checkpoint: bool = True, **options: Any) -> Any:
        """``graph`` (a LangGraph ``StateGraph``) compiled on the journal: checkpointed by a
        :class:`JournalCheckpointSaver` on these runs, and every node it runs journaled (:attr:`graph_nodes` among
        the compiled graph's callbacks; invoke-time callbacks are added to it) — and, when spend is on, every model
        call it makes reserved and settled (:attr:`graph_spend`).

        Args:
            graph: the graph builder (anything with LangGraph's ``compile(checkpointer=…, **options)``).
            checkpoint: False compiles without the checkpointer (a graph that re-runs from its start on resume,
                its tool calls answered by the journal); default True.
            options: passed to ``graph.compile`` (``interrupt_before``, ``store``, ``name`` …; not
                ``checkpointer``).

        Returns:
            The compiled graph (LangGraph's ``CompiledStateGraph``).
        """
        app = graph.compile(checkpointer=JournalCheckpointSaver(self), **options) if checkpoint \
            else graph.compile(**options)
        return app.with_config(callbacks=[self.graph_nodes, self.graph_spend] if self.graph_spend.enabled
                               else [self.graph_nodes])

    def handle(self, thread_id: str) -> RunHandle:
        """The thread's handle; a thread never seen starts its run (RUN_STARTED, ``run_id = thread_id``).

        Raises:
            InvalidIdError: ``thread_id`` breaks the run-id rules (``runjournal.core.ids.THREAD_ID``).
            ThreadNotOwnedError: the run exists and is not attached here.
        """
        THREAD_ID.check(thread_id)
        with self._lock:
            handle = self._handles.get(thread_id)
            if handle is None:
                try:
                    handle = self.journal.start_run(self.tenant_id, self.agent, {"thread_id": thread_id},
                                                    run_id=thread_id)
                except RunExistsError as exc:
                    raise ThreadNotOwnedError(thread_id, exc.started_by) from exc
                self._handles[thread_id] = handle
            return handle

    def stream(self, graph: Any, input: Any, config: RunnableConfig, *, stream_mode: str = "messages",
               name: str | None = None, **options: Any) -> Iterator[Any]:
        """``graph.stream(input, config, stream_mode=…)``, every chunk also appended to the thread's durable stream
        (``run.stream()``, docs/guide/streams.md): a chat UI reading the run's stream survives this process's crash.

        Args:
            graph: a compiled graph. input, config: as ``graph.stream`` (``config`` names the thread).
            stream_mode: one LangGraph stream mode (``messages``: each chunk's text; ``updates``, ``values``,
                ``custom``: the chunk as JSON, non-JSON values as their ``str``).
            name: the stream segment's name (default ``langgraph.<stream_mode>``).
            options: more ``graph.stream`` keyword arguments.

        Yields:
            The graph's chunks, unchanged.
        """
        handle = self.handle(_thread_of(config))
        with handle.stream(name or f"langgraph.{stream_mode}") as out:
            for chunk in graph.stream(input, config, stream_mode=stream_mode, **options):
                out.write(_stream_chunk(chunk, stream_mode))
                yield chunk

    def async_handle(self, thread_id: str) -> AsyncRunHandle:
        """:meth:`handle` as an :class:`AsyncRunHandle` (one per thread; needs an AsyncJournal)."""
        if self.async_journal is None:
            raise TypeError("JournalRuns was given a sync Journal; give it an AsyncJournal for async graphs")
        handle = self.handle(thread_id)
        with self._lock:
            wrapped = self._async.get(thread_id)
            if wrapped is None or wrapped.sync is not handle:
                wrapped = self._async[thread_id] = self.async_journal.wrap(handle)
            return wrapped

    def attach(self, handle: RunHandle | AsyncRunHandle, *, rebuild: bool = True) -> None:
        """Write the thread ``handle.run_id`` with ``handle`` (a resumed or continued run); with ``rebuild``
        its checkpoints are re-projected from the journal first (the topic is the authority)."""
        sync = handle.sync if isinstance(handle, AsyncRunHandle) else handle
        if rebuild:
            self.store.rebuild(sync.run_id)
        with self._lock:
            self._handles[sync.run_id] = sync
            if isinstance(handle, AsyncRunHandle):
                self._async[sync.run_id] = handle

    # -- calls a graph node makes itself ---------------------------------------------------------------------------
    def call(self, config: RunnableConfig | str, tool: Tool, args: dict[str, Any], *, step: str | None = None,
             side_effect: bool | None = None) -> Any:
        """Make a journaled call from inside a graph node: ``tool(args, idempotency_key)`` under the side-effect
        protocol on the node's run (``RunHandle.call``), keyed by the graph task it runs in, and return its recorded
        result. Use it, not ``runs.handle(thread_id).call(...)``, for every call a node of a checkpointed graph makes
        itself (:func:`journaled_tool_node` keys the model's tool calls by ``tool_call_id``).

        Why: the handle's own key is the call's order among the run's top-level calls, counted by the handle. A graph
        resumed from its checkpoint (``runs.attach(journal.resume(run_id))``, ``graph.invoke(None, config)``) does not
        execute again the nodes that finished before it, so the resumed handle counts from 0 and a later node's first
        call gets the key of an earlier node's recorded call: a different tool or args raises ``PlanMismatchError``;
        the same tool and args is answered with the earlier node's result and never runs — a dropped side effect.

        The default step is ``runjournal.call:<task>#<n>``: ``<task>`` the graph task's checkpoint namespace
        (``node:<task id>``, ``outer:<id>|inner:<id>`` in a subgraph, digested past 200 bytes), which LangGraph keeps
        when it executes the task again from its checkpoint (after a crash, an ``interrupt()``, a retry) and changes
        on a loop's next visit of the node, for each parallel branch and each ``Send``; ``<n>`` counts the calls made
        so far in this execution of the task. So a task re-executed after a crash inside it gets its calls' recorded
        outcomes (a committed call is not run again, an unknown one is reconciled by key), and a loop's visits, two
        nodes or two calls of one node are distinct calls, even with the same tool and args. A call made again after
        it raised (same tool and args, nothing between) is its next attempt under the same step, as with
        ``RunHandle.call``. Calls and :meth:`sleep` count separately: a call's key depends only on the calls before
        it in the task, and the sleep keys journaled before calls were counted stay as they were.

        Calls a node makes concurrently (threads, ``asyncio.gather``) each count in their own context: give them
        ``step=`` names. Outside a task (``config`` a thread id, or a config without ``checkpoint_ns``) the call is
        ``runs.handle(thread_id).call(tool, args, step=step)``: keyed by its order among the run's top-level calls.

        After the call, in a node, the node is a step boundary (as after a :func:`journaled_tool_node` call): an
        operator's cancel or pause pending on the run is carried out; the tool saw it through ``stop_requested()``
        while it ran.

        Args:
            config: the node's ``RunnableConfig`` (its ``configurable.thread_id`` is the run id), or the thread id.
            tool: a ``runjournal.producers.Tool`` (``JournaledTool`` wraps a function).
            args: JSON values (``RunHandle.call``).
            step: the call's stable name in the run (``RunHandle.call(step=…)``) instead of the task's.
            side_effect: overrides ``tool.side_effect``.

        Returns:
            The result as recorded (``RunHandle.call``).

        Raises:
            The tool's own exception (a definite failure, recorded).
            OutcomeUnknownError: the tool failed after its request may have left, or an unknown outcome could not be
                settled (call again: the same step reconciles it).
            PlanMismatchError: the run's record of this step is another tool's or other args (the node's code
                changed between the crash and the resume, or its calls depend on something that is not replayed).
            RecordedFailureError, ApprovalDeniedError, UnrecordableResultError, OutcomeNotDurableError,
            ResultUnavailableError: as ``RunHandle.call``.
            RunCancelledError, RunPausedError: an operator's request, carried out after the call.
            InvalidIdError: a bad ``step`` or thread id. NonCanonicalValueError: ``args`` without a canonical JSON
                form (nothing published). ThreadNotOwnedError: as :meth:`handle`.
            DeliveryError, ProducerFencedError, LeaseLapsedError, RunClosedError: publishing failed
                (``RunHandle.call``).
        """
        handle = self.handle(_thread_of(config))
        key, counter, made = _call_step(self, config, tool, args, step)
        with self._in_flight(handle.run_id, key if counter is not None else None):
            try:
                result = handle.call(tool, args, side_effect=side_effect, step=key)
            except BaseException:
                if counter is not None:
                    counter.failed = made  # the same call made next is its next attempt
                raise
        if not isinstance(config, str):
            handle.step_boundary()
        return result

    async def acall(self, config: RunnableConfig | str, tool: Tool, args: dict[str, Any], *,
                    step: str | None = None, side_effect: bool | None = None) -> Any:
        """:meth:`call` in an async node (needs an AsyncJournal; the call is ``AsyncRunHandle.call``). Raises as
        :meth:`call`."""
        handle = self.async_handle(_thread_of(config))
        key, counter, made = _call_step(self, config, tool, args, step)
        with self._in_flight(handle.run_id, key if counter is not None else None):
            try:
                result = await handle.call(tool, args, side_effect=side_effect, step=key)
            except BaseException:
                if counter is not None:
                    counter.failed = made
                raise
        if not isinstance(config, str):
            await handle.step_boundary()
        return result

    @contextlib.contextmanager
    def _in_flight(self, run_id: str, key: str | None) -> Iterator[None]:
        """Hold the default-keyed step ``key`` of ``run_id`` while its call runs; a second call of the same step at
        once (two calls of one node that counted alike in copies of its context) is :class:`TaskStepError`."""
        if key is None:
            yield
            return
        with self._lock:
            if (run_id, key) in self._steps_in_flight:
                raise TaskStepError(f"step {key!r} of run {run_id} is in flight already: calls made at once in one "
                                    "node (asyncio.gather, threads) need their own step= names")
            self._steps_in_flight.add((run_id, key))
        try:
            yield
        finally:
            with self._lock:
                self._steps_in_flight.discard((run_id, key))

    # -- durable waits in a graph node (docs/design/decisions/0050-durable-waits.md) ------------------------------
    def wait_signal(self, config: RunnableConfig | str, name: str, *, timeout_s: float | None = None,
                    poll_s: float = 0.2, step: str | None = None) -> Any:
        """Wait, inside a graph node, for the signal ``name`` of the node's run and return its payload — how a node
        waits for a human or a webhook: ``runjournal signal THREAD_ID NAME --payload JSON`` or
        ``Operator(settings).signal(thread_id, name, payload)`` delivers it, exactly once, also before the node waits.
        The payload is journaled (a ``runjournal.signal`` step keyed by ``step``): a node re-run from its checkpoint,
        after an ``interrupt()``, on a resumed run or in a loop gets the recorded payload at once, without waiting.

        Args:
            config: the node's ``RunnableConfig`` (its ``configurable.thread_id`` is the run id), or the thread id.
            name: the signal's name (the call-id rules: no ``|`` or ``/``).
            timeout_s: give up after this many seconds, by Redis's clock, from the first wait (its end time is
                journaled too); None (default) waits without end.
            poll_s: how often the inbox is read while the node waits in this process, s (default 0.2).
            step: the wait's stable name in the run (default ``runjournal.signal:<name>``: every wait for ``name`` in
                the run is one step, as the signal is delivered once).

        Returns:
            The signal's payload (a JSON value, as recorded).

        Raises:
            SignalTimeoutError: ``timeout_s`` passed without the signal (the same after a resume).
            RunWaitingError: the wait outlasted the Journal's ``hold_after_s``: the run was released (the node keeps
                no outcome); the recovery sweep hands it to a live instance when the signal arrives, which
                ``attach``-es it and continues the graph with ``invoke(None, config)``.
            RunCancelledError, RunPausedError: an operator's request met while the node waited.
            InvalidIdError: a bad ``name``, ``step`` or thread id. ThreadNotOwnedError: as :meth:`handle`.
        """
        return self.handle(_thread_of(config)).wait_signal(name, timeout_s=timeout_s, poll_s=poll_s,
                                                           step=_signal_step(name, step))

    async def await_signal(self, config: RunnableConfig | str, name: str, *, timeout_s: float | None = None,
                           poll_s: float = 0.2, step: str | None = None) -> Any:
        """:meth:`wait_signal` in an async node (needs an AsyncJournal; the polls are ``asyncio.sleep``)."""
        return await self.async_handle(_thread_of(config)).wait_signal(name, timeout_s=timeout_s, poll_s=poll_s,
                                                                       step=_signal_step(name, step))

    def sleep(self, config: RunnableConfig | str, seconds: float | None = None, *, until_ms: int | None = None,
              step: str | None = None) -> None:
        """Sleep, inside a graph node, ``seconds`` (or until ``until_ms``, ms since the Unix epoch) by Redis's clock,
        durably: the end time is journaled (a ``runjournal.timer`` step), so a node re-run from its checkpoint or
        after an ``interrupt()`` passes a sleep that is over at once (and waits only for what is left of one that is
        not). A loop's next visit of the node is a new task: it sleeps again.

        Args:
            config: the node's ``RunnableConfig``, or the thread id (then, without ``step``, the sleep is keyed like
                any call of the handle: by its order among the run's top-level calls).
            seconds: how long, s (>= 0); or ``until_ms``, not both.
            step: the sleep's stable name in the run (default: the graph task — its checkpoint namespace, which a
                re-execution of the task keeps — and the count of sleeps before it in this execution of the task).

        Raises:
            RunWaitingError: the sleep outlasts the Journal's ``hold_after_s``: the run was released; the recovery
                sweep resumes it on a live instance when it is due (``attach``, then ``invoke(None, config)``).
            RunCancelledError, RunPausedError: an operator's request met while the node slept.
            ValueError: neither or both of ``seconds`` and ``until_ms``, or a negative ``seconds``.
            InvalidIdError: a bad ``step`` or thread id. ThreadNotOwnedError: as :meth:`handle`.
        """
        self.handle(_thread_of(config)).sleep(seconds, until_ms=until_ms, step=_sleep_step(self, config, step))

    async def asleep(self, config: RunnableConfig | str, seconds: float | None = None, *,
                     until_ms: int | None = None, step: str | None = None) -> None:
        """:meth:`sleep` in an async node (needs an AsyncJournal; the wait is ``asyncio.sleep``)."""
        key = _sleep_step(self, config, step)
        await self.async_handle(_thread_of(config)).sleep(seconds, until_ms=until_ms, step=key)


def _stream_chunk(chunk: Any, mode: str) -> Any:
    """What a LangGraph stream chunk puts on the run's stream: a message chunk's text (``messages``), else the
    chunk as JSON (values that are not JSON as their ``str``)."""
    if mode == "messages" and isinstance(chunk, tuple) and chunk and hasattr(chunk[0], "content"):
        return _text_of(chunk[0])
    return json.loads(json.dumps(chunk, default=str))


def _thread_of(config: RunnableConfig | str) -> str:
    return THREAD_ID.check(config) if isinstance(config, str) else _thread(config)


def _signal_step(name: str, step: str | None) -> str:
    return step if step is not None else f"runjournal.signal:{name}"


def _task_step(runs: JournalRuns, config: RunnableConfig | str, step: str | None, kind: str,
               call: str | None = None) -> tuple[str | None, _TaskSteps | None]:
    """The default step of a ``kind`` step (``call``, ``timer``) in a graph task, and the task's counter of them.

    The step is ``runjournal.<kind>:<task>#<n>``: ``<task>`` the task's checkpoint namespace (``node:<task id>``;
    ``outer:<id>|inner:<id>`` in a subgraph; its sha256 when longer than 200 bytes) — the same when LangGraph
    executes the task again from its checkpoint, and another one on a loop's next visit of the node or for a
    parallel branch or ``Send`` — and ``<n>`` the number of the step among this kind's in this execution of the task.
    An execution is the node's callback run id (``config["callbacks"].parent_run_id``: a new one for every execution
    and every retry attempt, the same for everything the node passes its config to — coroutines it gathers, threads
    it starts), so the count is shared by all of them, under :class:`JournalRuns`' lock: two calls never count alike.
    A ``call`` (tool name and args digest) equal to the latest one of the execution when that one raised is its next
    attempt: the same ``n``. ``(step, None)`` when ``step`` is given; ``(None, None)`` outside a task (a thread id,
    or a config without a checkpoint namespace): the handle's own keying applies.

    Raises:
        TaskStepError: a config with a checkpoint namespace but no callback run id (not a node's config): give
            ``step=``."""
    if step is not None or isinstance(config, str):
        return step, None
    task = str((config.get("configurable") or {}).get("checkpoint_ns") or "")
    if not task:
        return None, None
    execution = getattr(config.get("callbacks"), "parent_run_id", None)
    if execution is None:
        raise TaskStepError(f"a {kind} with a config that names a graph task ({task}) but is not a node's own (no "
                            "callback run id): pass the node's config, or give it step= (a name unique in the run)")
    with runs._lock:  # noqa: SLF001 - the registry's own lock, shared with this module's helpers
        counters = runs._task_steps  # noqa: SLF001
        counter = counters.get((execution, kind, task))
        if counter is None:
            counter = counters[(execution, kind, task)] = _TaskSteps()
            while len(counters) > _TASK_STEPS_KEPT:
                counters.popitem(last=False)  # the oldest executions' counts: long over
        else:
            counters.move_to_end((execution, kind, task))
        if call is None or counter.failed != call:
            counter.n += 1
        counter.failed = None
        n = counter.n
    if len(task.encode("utf-8")) > 200:  # a deep subgraph's namespace: its digest (STEP allows 256 bytes)
        task = hashlib.sha256(task.encode("utf-8")).hexdigest()
    return f"runjournal.{kind}:{task}#{n}", counter


def _sleep_step(runs: JournalRuns, config: RunnableConfig | str, step: str | None) -> str | None:
    """The default step of a sleep in a graph task (:func:`_task_step`, kind ``timer``); None outside a task."""
    return _task_step(runs, config, step, "timer")[0]


def _call_step(runs: JournalRuns, config: RunnableConfig | str, tool: Tool, args: dict[str, Any],
               step: str | None) -> tuple[str | None, _TaskSteps | None, str | None]:
    """The default step of a node's own call in a graph task (:func:`_task_step`, kind ``call``), the task's
    counter, and the call's tool and args digest.

    Raises:
        NonCanonicalValueError: ``args`` has no canonical JSON form (as ``RunHandle.call``; nothing counted).
        TaskStepError: as :func:`_task_step`."""
    if step is not None or isinstance(config, str):
        return step, None, None
    made = f"{tool.name}\x00{digest(canonical_value(args, 'args'))}"
    return (*_task_step(runs, config, None, "call", made), made)


@dataclass
class _NodeRun:
    """One node path's open tasks on one run (a node fanned out by ``Send`` runs several at once)."""

    tasks: int = 0
    """Tasks of the node running now: NODE_STARTED went out with the first, the outcome goes with the last."""
    error: BaseException | None = None
    """The first error one of them raised (the node failed)."""
    paused: bool = False
    """One of them stopped without an outcome (an ``interrupt()``, a cancellation): the node stays RUNNING."""


@dataclass
class _RunNodes:
    """What one run's handle has journaled of the graph's nodes."""

    attempts: dict[str, int]
    """node path -> the attempt of its latest NODE_STARTED (seeded from the recovery plan of a resumed run)."""
    open: dict[str, _NodeRun] = dataclass_field(default_factory=dict)
    """node path -> its running tasks."""


class GraphNodeJournal(BaseCallbackHandler):
    """Journals every node a LangGraph graph runs on its thread's run (``thread_id`` = run id): NODE_STARTED before
    the node's code, NODE_SUCCEEDED after it returned, NODE_FAILED (its error, ``retryable`` from the error's
    attribute) when it raised — so the run's projected state, the console and ``runjournal inspect`` list the
    graph's nodes with their status. Get it as ``runs.graph_nodes``; :meth:`JournalRuns.compile` puts it among the
    compiled graph's callbacks (or pass it yourself: ``graph.with_config(callbacks=[runs.graph_nodes])``).

    * ``node_id`` and ``node_path`` are the node's name; a subgraph's node is ``outer/inner``; the n-th task a
      step pushed (``Send``, a functional ``@task``) is ``name#n`` (n from LangGraph's own task path, so the same
      after a resume). Names follow ``runjournal.core.ids.NODE_NAME`` (no ``/`` or ``#``); a node whose name
      breaks it fails before it runs, with ``InvalidIdError``.
    * ``attempt`` counts the executions of the path on the run — a loop's visits, LangGraph's retries and a re-run
      after a crash alike: it continues from the recovery plan on a resumed run (so a resumed graph's re-run of
      the node it crashed in is its next attempt, never a second node).
    * Parallel branches are separate nodes. Tasks of one path running at once (a subgraph's node inside two
      pushed tasks) are one execution: started with the first, ended with the last (failed if any failed).
    * A node stopped by ``interrupt()`` (or cancelled, or stopped by an operator's request or a long wait:
      ``RunStoppedError``) publishes no outcome: it stays RUNNING until the graph resumes it.
      ``Command(graph=PARENT)`` is a normal end.
    * Every node's entry is a step boundary (``RunHandle.step_boundary``): an operator's cancel or pause pending on
      the run is carried out there, before NODE_STARTED.
    * The events ride beside the handle's node stack (``RunHandle.node``), not on it: the node path that derives
      a call's idempotency key is unchanged, so every call keeps the key it had without this journal
      (docs/design/decisions/0048-graph-nodes-beside-the-key-path.md).

    The events are non-durable, like ``RunHandle.node``'s; one that cannot be published stops the node with the
    journal's error (a failed NODE_FAILED is added to the node's own error as a note instead).
    """

    raise_error = True
    """A node whose event cannot be journaled fails (a fenced instance stops at its next node)."""

    def __init__(self, runs: JournalRuns) -> None:
        self.runs = runs
        self.seen = False
        """True once a graph ran a node with this handler (the checkpointer warns when it is never attached)."""
        self.warned = False
        self._lock = threading.Lock()
        self._tasks: dict[UUID, tuple[RunHandle, str]] = {}
        self._runs: weakref.WeakKeyDictionary[RunHandle, _RunNodes] = weakref.WeakKeyDictionary()

    def on_chain_start(self, serialized: dict[str, Any] | None, inputs: Any, *, run_id: UUID,
                       parent_run_id: UUID | None = None, tags: list[str] | None = None,
                       metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """A graph task started: the first task of its node publishes NODE_STARTED (other chains: nothing).

        Raises:
            InvalidIdError: the node's name (or the thread id) breaks its rule; the node does not run.
            ThreadNotOwnedError: the thread's run is not attached to this instance.
            RunCancelledError, RunPausedError: an operator's request pending on the run was carried out here (a
                step boundary, ``RunHandle.step_boundary``); the node does not run.
            Publishing errors as ``RunHandle.emit``.
        """
        path = _task_path(kwargs.get("name"), tags, metadata)
        if path is None:
            return
        self.seen = True
        handle = self.runs.handle(_thread({"configurable": metadata}))
        handle.step_boundary()  # an operator's cancel / pause stops the run before the node (as RunHandle.node)
        with self.runs.journal.run_lock(handle.run_id):
            nodes = self._nodes(handle)
            node = nodes.open.get(path)
            if node is None:
                attempt = nodes.attempts.get(path, 0) + 1
                handle.emit(EventType.NODE_STARTED, {"node_path": path, "attempt": attempt}, node_id=path)
                nodes.attempts[path] = attempt
                node = nodes.open[path] = _NodeRun()
            node.tasks += 1
        with self._lock:
            self._tasks[run_id] = (handle, path)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None,
                     **kwargs: Any) -> None:
        """A graph task returned: the node's last task publishes NODE_SUCCEEDED (or NODE_FAILED when another of
        its tasks failed). Raises publishing errors as ``RunHandle.emit``."""
        self._end(run_id, None)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, parent_run_id: UUID | None = None,
                       **kwargs: Any) -> None:
        """A graph task raised: the node's last task publishes NODE_FAILED (an interrupt or a cancellation: no
        outcome). A NODE_FAILED that cannot be published is noted on ``error``, which propagates as it is."""
        self._end(run_id, error)

    def _nodes(self, handle: RunHandle) -> _RunNodes:
        """The run's node record for ``handle`` (a resumed run's new handle starts from its plan's attempts)."""
        with self._lock:
            nodes = self._runs.get(handle)
            if nodes is None:
                plan = handle.plan
                nodes = self._runs[handle] = _RunNodes(dict(plan.node_attempts) if plan is not None else {})
            return nodes

    def _end(self, task: UUID, error: BaseException | None) -> None:
        with self._lock:
            entry = self._tasks.pop(task, None)
        if entry is None:
            return  # not a graph task (or its start was not journaled)
        handle, path = entry
        with self.runs.journal.run_lock(handle.run_id):
            nodes = self._nodes(handle)
            node = nodes.open[path]
            node.tasks -= 1
            if isinstance(error, GraphInterrupt | RunStoppedError) or (
                    error is not None and not isinstance(error, Exception)):
                node.paused = True  # interrupted, or the run stopped (cancel, pause, a long wait): no outcome
            elif error is not None and not isinstance(error, GraphBubbleUp) and node.error is None:
                node.error = error
            if node.tasks:
                return
            del nodes.open[path]
            if node.error is not None:
                _node_failed(handle, path, node.error)
            elif not node.paused:
                handle.emit(EventType.NODE_SUCCEEDED, {"node_path": path}, node_id=path)


_SPEND_TASKS_KEPT = 4096
"""How many graph tasks' counts of model calls a :class:`GraphSpendJournal` keeps (least recently used out)."""


class GraphSpendJournal(BaseCallbackHandler):
    """Reserves spend before every model call a graph makes and settles it after, from the usage the model reports
    (``RunHandle.reserve`` on the thread's run; docs/guide/spend.md). Get it as ``runs.graph_spend``;
    :meth:`JournalRuns.compile` adds it to the graph's callbacks when it is enabled (``JournalRuns(spend=…)``; by
    default when the settings configure spend: ``runjournal.adapters.spend``), or pass it yourself.

    * **Reserve** on ``on_chat_model_start`` / ``on_llm_start``: the model is :attr:`model` when set, else the
      request's ``model`` / ``model_name`` parameter, else LangChain's ``ls_model_name``, else the model class's
      ``_type`` (prices: ``Settings.spend_prices``; an unpriced name while prices are set is
      ``UnknownModelError``). The estimate: input tokens ``ceil(characters of the prompt's text / 4)`` (every
      message's content as text), output tokens the request's ``max_tokens`` (or ``max_completion_tokens``,
      ``max_output_tokens``, ``max_new_tokens``, ``num_predict``), else :attr:`output_tokens` (default 1024).
    * **Settle** on ``on_llm_end`` with ``response.llm_output["token_usage"]`` (or ``["usage"]``: OpenAI's
      ``prompt_tokens`` / ``completion_tokens`` or ``input_tokens`` / ``output_tokens``), else the sum of the
      generations' ``message.usage_metadata``; a response reporting neither settles at the estimate
      (``estimated``). On ``on_llm_error`` it settles at the estimate (the call may have been billed).
    * **Keys.** A model call in a graph task is the step ``runjournal.spend:<task>#<n>`` (reserve: ``…/reserve``,
      settle: ``…/settle``): ``<task>`` the task's checkpoint namespace (its sha256 past 200 bytes), which LangGraph
      keeps when it executes the task again from its checkpoint, and ``<n>`` the call's number among the model calls
      of this execution of the task (counted from 1 at each start of the task: a retry, a re-run after an
      ``interrupt()`` or a crash). So a node re-executed on a resumed run meets its recorded reservations and
      settles: nothing is charged twice (the re-made request's usage is not charged either, as decision 0053 says
      of re-executed code). Where the re-made call reports other usage than the recorded settle, the recorded settle
      stands (the mismatch is logged); one whose prompt differs from the recorded call's (another estimate) raises
      ``PlanMismatchError``, as any re-executed call with other arguments. Model calls made concurrently in one node
      number in the order they start.
      A model call outside a graph task on a journaled thread is keyed as the handle keys any call.
    * A refused reservation raises ``BudgetExceededError`` out of the model call (the handler raises its errors):
      the node fails with it and so does ``graph.invoke``; the model is not called.

    Args:
        runs: the thread → run registry.
        enabled: whether :meth:`JournalRuns.compile` adds it (the handler itself acts whenever it is attached).

    Attributes:
        model: the model name every reservation names (None: from the request, above).
        output_tokens: the output estimate of a request without an output limit (tokens).
    """

    raise_error = True
    """A refused reservation (or one that cannot be journaled) stops the model call."""

    def __init__(self, runs: JournalRuns, *, enabled: bool = True) -> None:
        self.runs = runs
        self.enabled = enabled
        self.model: str | None = None
        self.output_tokens = DEFAULT_OUTPUT_TOKENS
        self._lock = threading.Lock()
        self._tasks: dict[UUID, tuple[str, str]] = {}
        self._counts: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._open: dict[UUID, Reservation] = {}

    # -- graph tasks: where a model call's count restarts ------------------------------------------------------
    def on_chain_start(self, serialized: dict[str, Any] | None, inputs: Any, *, run_id: UUID,
                       parent_run_id: UUID | None = None, tags: list[str] | None = None,
                       metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """A graph task's execution starts: its count of model calls restarts (other chains: nothing).

        Raises:
            InvalidIdError: the node's name breaks its rule (as :class:`GraphNodeJournal`)."""
        if _task_path(kwargs.get("name"), tags, metadata) is None:
            return
        meta = metadata or {}
        task = (str(meta.get("thread_id")), str(meta.get("langgraph_checkpoint_ns") or meta.get("langgraph_node")))
        with self._lock:
            self._tasks[run_id] = task
            self._counts[task] = 0
            self._counts.move_to_end(task)
            while len(self._counts) > _SPEND_TASKS_KEPT:
                self._counts.popitem(last=False)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None,
                     **kwargs: Any) -> None:
        """A graph task ended: its count is dropped."""
        self._task_done(run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, parent_run_id: UUID | None = None,
                       **kwargs: Any) -> None:
        """A graph task raised: its count is dropped."""
        self._task_done(run_id)

    def _task_done(self, run_id: UUID) -> None:
        with self._lock:
            task = self._tasks.pop(run_id, None)
            if task is not None:
                self._counts.pop(task, None)

    # -- model calls ---------------------------------------------------------------------------------------------
    def on_chat_model_start(self, serialized: dict[str, Any], messages: list[list[Any]], *, run_id: UUID,
                            parent_run_id: UUID | None = None, tags: list[str] | None = None,
                            metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """Reserve the chat model call's estimate (class docstring).

        Raises:
            BudgetExceededError: a budget would pass its limit; the model is not called, nothing was charged.
            UnknownModelError / SpendValueError: no price for the model, or a bad estimate.
            ThreadNotOwnedError: the thread's run is not attached here. As ``RunHandle.call`` for publishing.
        """
        chars = sum(len(_text_of(m)) for batch in messages for m in batch)
        self._reserve(run_id, chars, metadata, kwargs)

    def on_llm_start(self, serialized: dict[str, Any], prompts: list[str], *, run_id: UUID,
                     parent_run_id: UUID | None = None, tags: list[str] | None = None,
                     metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """Reserve the (text) LLM call's estimate. Raises as :meth:`on_chat_model_start`."""
        self._reserve(run_id, sum(len(p) for p in prompts), metadata, kwargs)

    def on_llm_end(self, response: Any, *, run_id: UUID, parent_run_id: UUID | None = None,
                   **kwargs: Any) -> None:
        """Settle the call's reservation with the usage the model reported (at the estimate when it reported
        none).

        Raises:
            SpendValueError: the reported usage is not whole token counts. As ``RunHandle.call`` for publishing.
        """
        with self._lock:
            held = self._open.pop(run_id, None)
        if held is not None:
            usage = _reported_usage(response)
            self._settle(held, usage if usage is not None else held.estimated_usage(), estimated=usage is None)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, parent_run_id: UUID | None = None,
                     **kwargs: Any) -> None:
        """Settle the call's reservation at its estimate (the request may have been billed). A settle that fails is
        noted on ``error`` (which propagates as it is); the reservation then stays open (unknown spend)."""
        with self._lock:
            held = self._open.pop(run_id, None)
        if held is None:
            return
        try:
            self._settle(held, held.estimated_usage(), estimated=True)
        except Exception as exc:  # noqa: BLE001 - the model's own error is the one to propagate
            error.add_note(f"its spend reservation {held.key} was not settled: {error_text(exc)}")

    def _reserve(self, run_id: UUID, chars: int, metadata: dict[str, Any] | None, kwargs: dict[str, Any]) -> None:
        meta = metadata or {}
        if meta.get("thread_id") is None:
            return  # not a journaled graph's call: no run to charge
        handle = self.runs.handle(_thread({"configurable": meta}))
        params = kwargs.get("invocation_params") or {}
        model = self.model or params.get("model") or params.get("model_name") or meta.get("ls_model_name") \
            or params.get("_type") or "unknown"
        held = handle.reserve(str(model), input_tokens=estimate_input_tokens(chars),
                              output_tokens=output_limit(params, self.output_tokens), step=self._step(meta))
        with self._lock:
            self._open[run_id] = held

    def _step(self, meta: dict[str, Any]) -> str | None:
        """``runjournal.spend:<task>#<n>`` (class docstring), or None outside a graph task."""
        ns = meta.get("langgraph_checkpoint_ns")
        if not ns:
            return None
        task = (str(meta.get("thread_id")), str(ns))
        with self._lock:
            n = self._counts.get(task, 0) + 1
            self._counts[task] = n
            self._counts.move_to_end(task)
        name = str(ns)
        if len(name.encode("utf-8")) > 200:
            name = hashlib.sha256(name.encode("utf-8")).hexdigest()
        return f"runjournal.spend:{name}#{n}"

    @staticmethod
    def _settle(held: Reservation, usage: Usage | dict[str, Any], *, estimated: bool) -> None:
        try:
            held.settle(usage, estimated=estimated)
        except PlanMismatchError:
            if not held.recorded:
                raise
            # a re-executed call reported other usage than the recorded settle: the recorded settle stands
            log.info("spend reservation %s: the re-made model call reported other usage than its recorded settle; "
                     "the recorded settle stands", held.key)


def _text_of(message: Any) -> str:
    """A message's content as text (a content-block list as its JSON-ish text: the estimate counts characters)."""
    content = getattr(message, "content", message)
    return content if isinstance(content, str) else str(content)


def _reported_usage(response: Any) -> Usage | None:
    """The usage a LangChain ``LLMResult`` reports: ``llm_output["token_usage"]`` / ``["usage"]``, else the sum of
    the generations' ``message.usage_metadata``; None when it reports neither.

    Raises:
        SpendValueError: a reported count is not a whole number >= 0."""
    output = getattr(response, "llm_output", None) or {}
    for key in ("token_usage", "usage"):
        value = output.get(key) if isinstance(output, dict) else None
        if isinstance(value, dict) and value:
            return Usage.of(value)
    found, inp, out = False, 0, 0
    for batch in getattr(response, "generations", None) or []:
        for generation in batch:
            meta = getattr(getattr(generation, "message", None), "usage_metadata", None)
            if meta:
                found, usage = True, Usage.of(meta)
                inp, out = inp + usage.input_tokens, out + usage.output_tokens
    return Usage(input_tokens=inp, output_tokens=out) if found else None


def _node_failed(handle: RunHandle, path: str, error: BaseException) -> None:
    """NODE_FAILED of ``path`` (unless the handle can no longer write); a publish that fails is noted on ``error``."""
    if not handle.writable:
        return
    payload = {"node_path": path, "error": error_text(error), "retryable": bool(getattr(error, "retryable", False))}
    try:
        handle.emit(EventType.NODE_FAILED, payload, node_id=path)
    except JournalError as exc:
        error.add_note(f"NODE_FAILED of {path} was not published: {error_text(exc)}")


def _task_path(name: Any, tags: list[str] | None, metadata: dict[str, Any] | None) -> str | None:
    """The node path of a graph task's run, or None for any other chain. A task is the run LangGraph starts for a
    node: named as the node, tagged ``graph:step:<step>`` (not inherited by what runs inside it). Its checkpoint
    namespace (``outer:<task id>|inner:<task id>``) gives the names of the subgraphs it runs in.

    Raises:
        InvalidIdError: a name breaks ``runjournal.core.ids.NODE_NAME``.
    """
    meta = metadata or {}
    node = meta.get("langgraph_node")
    if node is None or name != node or f"graph:step:{meta.get('langgraph_step')}" not in (tags or ()):
        return None
    namespace = str(meta.get("langgraph_checkpoint_ns") or node)
    names = [NODE_NAME.check(part.split(":", 1)[0]) for part in namespace.split("|")]  # LangGraph's NS_SEP, NS_END
    index = _push_index(meta.get("langgraph_path"))
    if index is not None:
        names[-1] = f"{names[-1]}#{index + 1}"
    return NODE_PATH.check("/".join(names))


def _push_index(task_path: Any) -> int | None:
    """The index of a pushed task (a ``Send``: ``("__pregel_push", idx, False)``; a functional ``@task`` call:
    ``("__pregel_push", parent path, idx, …)``) — deterministic from the checkpoint — or None for a node's own
    task (``("__pregel_pull", name)``)."""
    if not isinstance(task_path, tuple) or not task_path or task_path[0] != "__pregel_push":
        return None
    for part in task_path[1:3]:
        if isinstance(part, int) and not isinstance(part, bool):
            return part
    return None


def _unjournaled_nodes(nodes: GraphNodeJournal, thread_id: str) -> None:
    """Warn, once per registry, that a graph checkpointed here has run a step without ``nodes`` among its callbacks:
    its nodes are missing from the run's state (the console and ``inspect`` show none)."""
    if nodes.seen or nodes.warned:
        return
    nodes.warned = True
    log.warning("LangGraph thread %s runs without runjournal's node journal: its graph nodes will not show in the "
                "run's state, the console or `runjournal inspect`; compile the graph with `runs.compile(graph)` "
                "(or add `runs.graph_nodes` to its callbacks)", thread_id)


def _typed(pair: tuple[str, bytes]) -> list[str]:
    return [pair[0], base64.b64encode(pair[1]).decode("ascii")]


def _untyped(item: Sequence[str]) -> tuple[str, bytes]:
    return item[0], base64.b64decode(item[1])


class JournalCheckpointSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer on the journal (module docstring). ``invoke`` uses the sync methods,
    ``ainvoke`` the async ones (which run the sync ones in the AsyncJournal's producer threads).

    Args:
        runs: the thread → run registry (shared with :func:`journaled_tool_node`).
        serde: LangGraph serializer (default ``JsonPlusSerializer``).
    """

    def __init__(self, runs: JournalRuns, *, serde: Any = None) -> None:
        super().__init__(serde=serde)
        self.runs = runs
        self.store = runs.store

    # -- writes ------------------------------------------------------------------------------------------------
    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        """Record a checkpoint (its new channel blobs first), durable before returning; project it.

        Raises ``InvalidIdError`` when the thread id, the namespace, the checkpoint id or a channel name holds a
        control character (U+001F joins the record's field), before anything is written."""
        thread_id, ns = _thread(config), config["configurable"].get("checkpoint_ns", "")
        self.runs.handle(thread_id)  # the thread's run is ours (or starts now)
        if (metadata or {}).get("source") == "loop" and int((metadata or {}).get("step") or 0) >= 1:
            _unjournaled_nodes(self.runs.graph_nodes, thread_id)  # step >= 1: written after that step's nodes ran
        stripped = dict(checkpoint)
        values: dict[str, Any] = stripped.pop("channel_values", {})  # type: ignore[assignment]
        records = [Record("blob", join_field(ns, k, str(v)), json.dumps(
            _typed(self.serde.dumps_typed(values[k])) if k in values else ["empty", ""]))
            for k, v in new_versions.items()]
        entry = {"checkpoint": _typed(self.serde.dumps_typed(stripped)),
                 "metadata": _typed(self.serde.dumps_typed(get_checkpoint_metadata(config, metadata))),
                 "parent": config["configurable"].get("checkpoint_id")}
        records.append(Record("cp", join_field(ns, checkpoint["id"]), json.dumps(entry)))
        self.store.write(thread_id, records)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        """Record a task's pending writes (insert-if-absent per (task, idx); special channels upserted)."""
        thread_id, ns = _thread(config), config["configurable"].get("checkpoint_ns", "")
        cid = config["configurable"]["checkpoint_id"]
        self.runs.handle(thread_id)
        fields = [join_field(ns, cid, task_id, str(WRITES_IDX_MAP.get(c, i))) for i, (c, _) in enumerate(writes)]
        with self.store.lock(thread_id):  # insert-if-absent: the read and the write are one step of the run
            present = self.store.get(thread_id, "w", fields)
            records = [Record("w", field, json.dumps([task_path, c, *_typed(self.serde.dumps_typed(v))]))
                       for field, (c, v), old in zip(fields, writes, present, strict=True)
                       if old is None or int(field.rsplit(SEP, 1)[1]) < 0]
            if records:
                self.store.write(thread_id, records)

    def delete_thread(self, thread_id: str) -> None:
        """Tombstone every record of the thread and drop its projection (the run's events stay)."""
        self.store.forget(thread_id)

    # -- reads -------------------------------------------------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by ``config`` (or the thread's latest in its namespace), from the projection."""
        thread_id, ns = _thread(config), config["configurable"].get("checkpoint_ns", "")
        entries = self.store.entries(thread_id, "cp")
        wanted = get_checkpoint_id(config)
        if wanted is None:
            ids = [f.split(SEP, 1)[1] for f in entries if f.split(SEP, 1)[0] == ns]
            if not ids:
                return None
            wanted = max(ids)
        raw = entries.get(SEP.join((ns, wanted)))
        if raw is None:
            return None
        return self._tuple(thread_id, ns, wanted, json.loads(raw))

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first, by thread (all when ``config`` is None), namespace, id, metadata filter,
        ``before`` cursor and ``limit``."""
        threads = [_thread(config)] if config is not None else self.store.threads()
        want_ns = config["configurable"].get("checkpoint_ns") if config is not None else None
        want_id = get_checkpoint_id(config) if config is not None else None
        before_id = get_checkpoint_id(before) if before is not None else None
        left = limit
        for thread_id in threads:
            rows = [(*f.split(SEP, 1), raw) for f, raw in self.store.entries(thread_id, "cp").items()]
            for ns, cid, raw in sorted(rows, key=lambda r: r[1], reverse=True):
                if (want_ns is not None and ns != want_ns) or (want_id and cid != want_id) or \
                        (before_id and cid >= before_id):
                    continue
                entry = json.loads(raw)
                metadata = self.serde.loads_typed(_untyped(entry["metadata"]))
                if filter and not all(metadata.get(k) == v for k, v in filter.items()):
                    continue
                if left is not None and left <= 0:
                    return
                if left is not None:
                    left -= 1
                yield self._tuple(thread_id, ns, cid, entry)

    def _tuple(self, thread_id: str, ns: str, cid: str, entry: dict[str, Any]) -> CheckpointTuple:
        checkpoint = self.serde.loads_typed(_untyped(entry["checkpoint"]))
        versions = checkpoint.get("channel_versions", {})
        channels = list(versions)
        blobs = self.store.get(thread_id, "blob", [SEP.join((ns, k, str(versions[k]))) for k in channels])
        values = {}
        for channel, raw in zip(channels, blobs, strict=True):
            if raw is not None and (item := json.loads(raw))[0] != "empty":
                values[channel] = self.serde.loads_typed(_untyped(item))
        head = SEP.join((ns, cid)) + SEP
        writes = []
        for field, raw in self.store.entries(thread_id, "w").items():
            if field.startswith(head):
                task_id, idx = field[len(head):].rsplit(SEP, 1)
                task_path, channel, *value = json.loads(raw)
                writes.append((_sort_key(task_path, task_id, int(idx)), (task_id, channel, value)))
        writes.sort(key=lambda w: w[0])
        parent = entry.get("parent")
        return CheckpointTuple(
            config={"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}},
            checkpoint={**checkpoint, "channel_values": values},
            metadata=self.serde.loads_typed(_untyped(entry["metadata"])),
            parent_config={"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": parent}}
            if parent else None,
            pending_writes=[(t, c, self.serde.loads_typed(_untyped(v))) for _, (t, c, v) in writes],
        )

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Monotonic ``{n:032}.{random:016}`` versions, as LangGraph's own savers."""
        import random

        n = 0 if current is None else (current if isinstance(current, int) else int(str(current).split(".")[0]))
        return f"{n + 1:032}.{random.random():016}"

    # -- async twins (the sync methods in the journal's producer threads) --------------------------------------
    async def _sync(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.runs.async_journal is not None:
            return await self.runs.async_journal.run_sync(lambda: fn(*args, **kwargs))
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """As :meth:`get_tuple`."""
        out: CheckpointTuple | None = await self._sync(self.get_tuple, config)
        return out

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        """As :meth:`list`."""
        rows = await self._sync(lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for row in rows:
            yield row

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        """As :meth:`put`."""
        out: RunnableConfig = await self._sync(self.put, config, checkpoint, metadata, new_versions)
        return out

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        """As :meth:`put_writes`."""
        await self._sync(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """As :meth:`delete_thread`."""
        await self._sync(self.delete_thread, thread_id)


def journaled_tool_node(tools: Sequence[Any], runs: JournalRuns, *, side_effects: dict[str, bool] | None = None,
                        reconcile: dict[str, Reconciler] | None = None, timeout_ms: int = 30_000,
                        **tool_node_options: Any) -> ToolNode:
    """A ``ToolNode`` whose tool calls go through the journal (module docstring).

    Each call is ``handle.call(tool, args, step=tool_call_id)`` on the thread's run: intent durable before the
    tool, the idempotency key available to it as ``runjournal.adapters.current_idempotency_key()``, the
    ToolMessage's content recorded as the result. Tool errors propagate (``handle_tool_errors=False``), so a
    failure is journaled as FAILED or, when the request may have left, stays unknown and is reconciled.

    Operator controls: while a tool runs, ``runjournal.producers.stop_requested()`` shows it an operator's cancel or
    pause pending on the run (a long tool may check it and return early; what it returns is recorded as usual).
    After each call the node is a step boundary: the request is carried out and ``RunCancelledError`` /
    ``RunPausedError`` leaves the node (and ``graph.invoke``); no intent follows a RUN_CANCELLED.

    Args:
        tools: LangChain tools (or functions), as for ``ToolNode``.
        runs: the registry shared with the checkpointer.
        side_effects: tool name → side-effecting (default True for every tool: the safe default).
        reconcile: tool name → ``reconcile(key) -> Outcome | None`` whose ``result`` is the ToolMessage content.
        timeout_ms: every tool's provider timeout, ms (default 30 000).
        tool_node_options: passed to ``ToolNode`` (not ``wrap_tool_call`` / ``handle_tool_errors``).
    """
    effects, hooks = side_effects or {}, reconcile or {}

    def journaled(request: Any, fn: Callable[..., Any]) -> JournaledTool:
        name = request.tool_call["name"]
        return JournaledTool(fn, name=name, side_effect=effects.get(name, True), timeout_ms=timeout_ms,
                             reconcile=hooks.get(name))

    def wrap(request: Any, execute: Callable[[Any], Any]) -> Any:
        handle = runs.handle(_thread(request.runtime.config))
        content = handle.call(journaled(request, lambda **_: _content(execute(request))),
                              dict(request.tool_call["args"]), step=request.tool_call["id"])
        handle.step_boundary()  # the tool may have returned early on a request: the run stops here
        return _message(request, content)

    async def awrap(request: Any, execute: Callable[[Any], Any]) -> Any:
        handle = runs.async_handle(_thread(request.runtime.config))

        async def run(**_: Any) -> Any:
            return _content(await execute(request))

        content = await handle.call(journaled(request, run), dict(request.tool_call["args"]),
                                    step=request.tool_call["id"])
        await handle.step_boundary()
        return _message(request, content)

    return ToolNode(tools, wrap_tool_call=wrap, awrap_tool_call=awrap, handle_tool_errors=False,
                    **tool_node_options)


def _content(result: Any) -> Any:
    if not isinstance(result, ToolMessage):
        raise TypeError(f"a journaled tool must answer with content, not {type(result).__name__} (e.g. a Command)")
    return result.content


def _message(request: Any, content: Any) -> ToolMessage:
    return ToolMessage(content=content, tool_call_id=request.tool_call["id"], name=request.tool_call["name"])


def _thread(config: Any) -> str:
    """The config's ``thread_id`` as text, checked as a run id (``runjournal.core.ids.THREAD_ID``: it *is* the run
    id, in Redis hash tags and record keys) — ``InvalidIdError`` before anything is written."""
    try:
        thread_id = str(config["configurable"]["thread_id"])
    except (KeyError, TypeError) as exc:
        raise ValueError("the graph's config needs configurable.thread_id (the journal run id)") from exc
    return THREAD_ID.check(thread_id)

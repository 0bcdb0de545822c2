"""The OpenAI Agents SDK on the journal (``pip install 'runjournal[openai-agents]'``).

* :func:`journal_function_tool` — a ``FunctionTool`` whose invocation goes through ``AsyncRunHandle.call``
  keyed by the model's ``call_id`` (``step=``): intent durable before the function, the idempotency key
  available as ``runjournal.adapters.current_idempotency_key()``, the output recorded; a resumed run returns
  the recorded output instead of calling the function again.
* :class:`JournalRunHooks` — ``RunHooks`` that put every tool call (wrapped or not: hosted tools, MCP) on the
  run's timeline as NODE_STARTED / NODE_SUCCEEDED (node ``tool-<call_id>``), and — when spend is on — reserve
  spend before every model call and settle it with the usage the SDK reports (``AsyncRunHandle.reserve``; issue 32,
  docs/guide/spend.md).
* :class:`JournalSession` — an Agents SDK ``Session`` whose items are records in the journal's transaction
  (``{prefix}.checkpoints``, kind ``item``), projected into Redis for reads; message turns are also MESSAGE
  events (memory input, never recovery).
* :func:`run_agent` / :func:`resume_agent` — ``needs_approval`` interruptions mapped onto the journal's
  durable approvals: the paused ``RunState`` is recorded (durable), then APPROVAL_REQUESTED; the run waits on
  the approval inbox (``runjournal approve RUN_ID CALL_ID``). Killed while waiting, the run is recovered onto
  a live instance, where ``resume_agent`` loads the recorded state, waits for the same decision (the journal
  says it was asked: it is not asked again), approves or rejects the interruption and runs on — the tool
  runs once.
* :func:`stream_agent` — ``Runner.run_streamed`` with its tools on the journal, every streamed event also appended
  to the run's durable stream (``run.stream()``, decision 0055, docs/guide/streams.md): text deltas as text, items
  and agent changes as small JSON, so a chat UI reading the run's stream survives this process's crash.

Run state snapshots are loaded from the journal only (``RunState.from_json``: not authenticated).
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

try:
    from agents import Agent, RunHooks, Runner
    from agents.run_state import RunState
    from agents.tool import FunctionTool
except ModuleNotFoundError as exc:  # pragma: no cover - the core install
    raise ModuleNotFoundError(f"runjournal.adapters.openai_agents needs {exc.name}: "
                              "pip install 'runjournal[openai-agents]'", name=exc.name) from exc

from runjournal.adapters._checkpoints import FrameworkRecordStore, Record
from runjournal.adapters.spend import DEFAULT_OUTPUT_TOKENS, estimate_input_tokens, spend_enabled
from runjournal.adapters.tools import JournaledTool, Reconciler
from runjournal.producers.aio import AsyncRunHandle
from runjournal.producers.approvals import ApprovalInbox
from runjournal.producers.errors import PlanMismatchError
from runjournal.producers.spend import AsyncReservation, Usage
from runjournal.schemas import EventType

__all__ = ["JournalRunHooks", "JournalSession", "journal_function_tool", "resume_agent", "run_agent", "stream_agent"]

log = logging.getLogger("runjournal.adapters.openai_agents")

_RUN: contextvars.ContextVar[AsyncRunHandle | None] = contextvars.ContextVar("runjournal_agents_run", default=None)
_STATE_FIELD = "agents-run-state"


def _current_run() -> AsyncRunHandle:
    run = _RUN.get()
    if run is None:
        raise RuntimeError("a journaled function tool ran outside run_agent / resume_agent (no run handle bound)")
    return run


def journal_function_tool(tool: FunctionTool, *, side_effect: bool = True, timeout_ms: int = 30_000,
                          reconcile: Reconciler | None = None) -> FunctionTool:
    """``tool`` with its invocation journaled (module docstring); everything else (schema, ``needs_approval``)
    unchanged. Build the tool with ``failure_error_function=None`` so its errors reach the journal (as FAILED,
    or unknown when the request may have left) instead of being turned into an output string first.

    Args:
        tool: a ``FunctionTool`` (e.g. from ``@function_tool``).
        side_effect, timeout_ms, reconcile: as :class:`~runjournal.adapters.tools.JournaledTool`.
    """
    invoke = tool.on_invoke_tool

    async def on_invoke(ctx: Any, arguments: str) -> Any:
        async def run(**_: Any) -> Any:
            return await invoke(ctx, arguments)

        journaled = JournaledTool(run, name=tool.name, side_effect=side_effect, timeout_ms=timeout_ms,
                                  reconcile=reconcile)
        args = json.loads(arguments or "{}")
        return await _current_run().call(journaled, args if isinstance(args, dict) else {"arguments": args},
                                         step=str(ctx.tool_call_id))

    return dataclasses.replace(tool, on_invoke_tool=on_invoke)


def _node_name(call_id: str) -> str:
    """``tool-<call_id>`` with ``/``, ``#`` and unprintable characters as ``_``: a node path the journal accepts
    (``runjournal.core.ids.NODE_PATH``) whatever the SDK's call id holds — it only names a timeline entry."""
    return "tool-" + "".join(c if c not in "/#" and (c.isprintable() or c == " ") else "_" for c in call_id[:200])


class JournalRunHooks(RunHooks[Any]):
    """Every tool call on the run's timeline: NODE_STARTED on start, NODE_SUCCEEDED on end (non-durable); and, when
    spend is on, a reservation before every model call settled after it with the usage the SDK reports.

    Spend (``runjournal.adapters.spend``; docs/guide/spend.md):

    * **Reserve** in :meth:`on_llm_start` (``AsyncRunHandle.reserve``): the model is ``model`` when given, else the
      agent's ``model`` when it is a name, else the model object's ``model`` attribute, else the SDK's default
      model. The estimate: input tokens ``ceil(characters of the system prompt and the input items as JSON / 4)``;
      output tokens the agent's ``model_settings.max_tokens``, else ``output_tokens`` (default 1024).
    * **Settle** in :meth:`on_llm_end` with ``ModelResponse.usage`` (``input_tokens`` / ``output_tokens``); a
      response that reports no usage (no request, no tokens) settles at the estimate (``estimated``). The SDK has no
      hook for a model call that raised: :func:`run_agent` / :func:`resume_agent` settle what is left open at the
      estimate when the run raises (:meth:`settle_open`); a new model call of the same agent settles a stale one
      first.
    * **Keys.** The n-th model call of the run is the step ``runjournal.spend:agents#<n>`` (``…/reserve``,
      ``…/settle``), n counted by these hooks and never below the SDK's own count of requests (``usage.requests``,
      kept in a recorded ``RunState``): a run executed again from its start (``run_agent`` on a resumed run) meets
      its recorded reservations and settles — nothing is charged twice — and one continued from its recorded state
      (``resume_agent``) numbers on after the calls already made. Where a re-made call reports other usage than the
      recorded settle, the recorded settle stands (logged).
    * A refused reservation raises ``BudgetExceededError`` out of ``Runner.run``; the model is not called. A
      re-executed call whose input differs from the recorded call's (another estimate) raises ``PlanMismatchError``.

    Args:
        run: the run's async handle.
        spend: reserve and settle around model calls; None (default): when the journal's settings configure spend
            (prices or budgets).
        model: the model name every reservation names (priced by ``Settings.spend_prices``).
        output_tokens: the output estimate when the agent sets no ``max_tokens`` (tokens).
    """

    def __init__(self, run: AsyncRunHandle, *, spend: bool | None = None, model: str | None = None,
                 output_tokens: int = DEFAULT_OUTPUT_TOKENS) -> None:
        self.run = run
        self.spend = spend_enabled(run.journal.settings, spend)
        self.model = model
        self.output_tokens = output_tokens
        self._calls = 0
        self._open: dict[int, AsyncReservation] = {}

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        """NODE_STARTED ``tool-<call_id>``."""
        node = _node_name(str(getattr(context, "tool_call_id", None) or getattr(tool, "name", "tool")))
        await self.run.emit(EventType.NODE_STARTED, {"node_path": node, "attempt": 1}, node_id=node)

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        """NODE_SUCCEEDED ``tool-<call_id>``."""
        node = _node_name(str(getattr(context, "tool_call_id", None) or getattr(tool, "name", "tool")))
        await self.run.emit(EventType.NODE_SUCCEEDED, {"node_path": node}, node_id=node)

    async def on_llm_start(self, context: Any, agent: Any, system_prompt: str | None, input_items: list[Any]) -> None:
        """Reserve the model call's estimate (class docstring); nothing when spend is off.

        Raises:
            BudgetExceededError: a budget would pass its limit; the model is not called, nothing was charged.
            UnknownModelError / SpendValueError: no price for the model, or a bad estimate.
            As ``AsyncRunHandle.call`` for publishing.
        """
        if not self.spend:
            return
        stale = self._open.pop(id(agent), None)
        if stale is not None:  # the agent's previous call raised (no on_llm_end): billed or not, the estimate stands
            await _settle(stale, stale.estimated_usage(), estimated=True)
        usage = getattr(context, "usage", None)
        self._calls = max(self._calls, int(getattr(usage, "requests", 0) or 0)) + 1
        chars = len(system_prompt or "") + len(json.dumps(input_items, default=str))
        settings = getattr(agent, "model_settings", None)
        limit = getattr(settings, "max_tokens", None)
        held = await self.run.reserve(_model_name(self.model, agent), input_tokens=estimate_input_tokens(chars),
                                      output_tokens=limit if isinstance(limit, int) and limit > 0
                                      else self.output_tokens, step=f"runjournal.spend:agents#{self._calls}")
        self._open[id(agent)] = held

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        """Settle the call's reservation with ``response.usage`` (at the estimate when it reports none).

        Raises:
            SpendValueError: the reported usage is not whole token counts. As ``AsyncRunHandle.call`` for publishing.
        """
        held = self._open.pop(id(agent), None)
        if held is None:
            return
        usage = getattr(response, "usage", None)
        inp, out = int(getattr(usage, "input_tokens", 0) or 0), int(getattr(usage, "output_tokens", 0) or 0)
        if usage is None or (not getattr(usage, "requests", 0) and not inp and not out):
            await _settle(held, held.estimated_usage(), estimated=True)
        else:
            await _settle(held, Usage(input_tokens=inp, output_tokens=out), estimated=False)

    async def settle_open(self) -> int:
        """Settle every reservation still open (its model call raised: the SDK calls no hook) at its estimate;
        returns how many. :func:`run_agent` / :func:`resume_agent` call it when the run raises.

        Raises:
            As ``AsyncRunHandle.call`` for publishing (the reservations not settled stay open: unknown spend).
        """
        held, self._open = list(self._open.values()), {}
        for reservation in held:
            await _settle(reservation, reservation.estimated_usage(), estimated=True)
        return len(held)


def _model_name(model: str | None, agent: Any) -> str:
    """The name a reservation names (:class:`JournalRunHooks`)."""
    if model:
        return model
    named = getattr(agent, "model", None)
    if isinstance(named, str) and named:
        return named
    inner = getattr(named, "model", None)
    if isinstance(inner, str) and inner:
        return inner
    from agents.models import get_default_model

    return str(get_default_model())


async def _settle(held: AsyncReservation, usage: Usage, *, estimated: bool) -> None:
    try:
        await held.settle(usage, estimated=estimated)
    except PlanMismatchError:
        if not held.recorded:
            raise
        log.info("spend reservation %s: the re-made model call reported other usage than its recorded settle; the "
                 "recorded settle stands", held.key)


class JournalSession:
    """An Agents SDK ``Session`` backed by the journal (module docstring); ``session_id`` is the run id.

    Args:
        run: the run's async handle.
        store: the journal's adapter record store (``FrameworkRecordStore(journal)``).
    """

    session_settings = None

    def __init__(self, run: AsyncRunHandle, store: FrameworkRecordStore) -> None:
        self.run = run
        self.store = store
        self.session_id = run.run_id

    def _fields(self) -> list[str]:
        return sorted(self.store.fields(self.session_id, "item"))

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The session's items, oldest first (the last ``limit`` when given)."""
        def read() -> list[Any]:
            fields = self._fields()
            if limit is not None:
                fields = fields[-limit:] if limit > 0 else []
            return [json.loads(raw) for raw in self.store.get(self.session_id, "item", fields) if raw is not None]
        items: list[Any] = await self.run.journal.run_sync(read)
        return items

    async def add_items(self, items: list[Any]) -> None:
        """Record ``items`` (durable), then MESSAGE events for its text turns."""
        def write() -> None:
            with self.store.lock(self.session_id):  # read the next index and write it as one step of the run
                fields = self._fields()
                start = int(fields[-1]) + 1 if fields else 0
                records = [Record("item", f"{start + i:012d}", json.dumps(item, default=str))
                           for i, item in enumerate(items)]
                if records:
                    self.store.write(self.session_id, records)
        await self.run.journal.run_sync(write)
        for item in items:
            role, content = (item.get("role"), item.get("content")) if isinstance(item, dict) else (None, None)
            if isinstance(role, str) and isinstance(content, str):
                await self.run.message(role, content)

    async def pop_item(self) -> Any:
        """Remove and return the newest item (a tombstone), or None."""
        def pop() -> Any:
            with self.store.lock(self.session_id):
                fields = self._fields()
                if not fields:
                    return None
                (raw,) = self.store.get(self.session_id, "item", fields[-1:])
                self.store.write(self.session_id, [Record("item", fields[-1], None)])
                return None if raw is None else json.loads(raw)
        return await self.run.journal.run_sync(pop)

    async def clear_session(self) -> None:
        """Remove every item (tombstones)."""
        def clear() -> None:
            with self.store.lock(self.session_id):
                records = [Record("item", f, None) for f in self._fields()]
                if records:
                    self.store.write(self.session_id, records)
        await self.run.journal.run_sync(clear)


async def run_agent(agent: Agent[Any], input: Any, *, run: AsyncRunHandle, inbox: ApprovalInbox,
                    store: FrameworkRecordStore, approval_timeout_s: float = 300.0, **runner_options: Any) -> Any:
    """``Runner.run(agent, input)`` with its tool approvals on the journal (module docstring); returns the result.

    ``runner_options`` go to ``Runner.run`` (``run_config``, ``session``, ``hooks`` …). With ``hooks`` a
    :class:`JournalRunHooks`, a run that raises first settles the spend reservations its failed model call left open,
    at their estimates (:meth:`JournalRunHooks.settle_open`). Raises ``ApprovalTimeoutError`` when no decision came
    within ``approval_timeout_s`` (the request stays durable); ``BudgetExceededError`` when a model call's
    reservation is refused.
    """
    token = _RUN.set(run)
    try:
        result = await Runner.run(agent, input, **runner_options)
        while result.interruptions:
            state = result.to_state()
            await _record_state(run, store, state)
            await _decide(run, inbox, state, approval_timeout_s)
            result = await Runner.run(agent, state, **runner_options)
        await _record_state(run, store, None)
        return result
    except Exception as exc:
        await _settle_open(runner_options.get("hooks"), exc)
        raise
    finally:
        _RUN.reset(token)


async def resume_agent(agent: Agent[Any], *, run: AsyncRunHandle, inbox: ApprovalInbox, store: FrameworkRecordStore,
                       approval_timeout_s: float = 300.0, **runner_options: Any) -> Any:
    """Continue a recovered run from its recorded ``RunState`` (waiting for the decisions it was paused on).

    Raises:
        LookupError: the run recorded no paused state (it was not waiting for an approval): run it again
            with :func:`run_agent` — its journaled tools return their recorded outputs.
    """
    await run.journal.run_sync(store.rebuild, run.run_id)
    (raw,) = await run.journal.run_sync(store.get, run.run_id, "state", [_STATE_FIELD])
    if raw is None:
        raise LookupError(f"run {run.run_id} recorded no paused agent state")
    state = await RunState.from_json(agent, json.loads(raw))
    token = _RUN.set(run)
    try:
        await _decide(run, inbox, state, approval_timeout_s)
        result = await Runner.run(agent, state, **runner_options)
    except Exception as exc:
        await _settle_open(runner_options.get("hooks"), exc)
        raise
    finally:
        _RUN.reset(token)
    if result.interruptions:
        return await run_agent(agent, result.to_state(), run=run, inbox=inbox, store=store,
                               approval_timeout_s=approval_timeout_s, **runner_options)
    await _record_state(run, store, None)
    return result


async def stream_agent(agent: Agent[Any], input: Any, *, run: AsyncRunHandle, name: str | None = None,
                       **runner_options: Any) -> AsyncIterator[Any]:
    """``Runner.run_streamed(agent, input)`` with its journaled tools on ``run``; yields the SDK's stream events
    unchanged and appends each to the run's durable stream (segment ``name``, default ``agents.stream``).

    What a reader of the run's stream gets (``runjournal.consumers.streams``, ``GET /streams/{run_id}``): the
    model's text deltas (``response.output_text.delta``) as text; ``{"event": <item event name>, "item": <item
    type>, "tool": <name, for a tool call>}`` for the SDK's run-item events; ``{"event": "agent_updated", "agent":
    <name>}`` for a hand-off. Other raw events (created, in progress, done) are not appended. The segment ends
    when the stream does (or with the error that ended it); a crash leaves it open, and the run's next owner
    marks the gap. Tool approvals (``needs_approval``) are :func:`run_agent`'s: a streamed run that stops on an
    interruption raises ``RuntimeError`` naming it.

    Raises:
        StreamError: a chunk refused (``StreamDataError``, ``StreamChunkTooLargeError``).
        As ``Runner.run_streamed`` and ``AsyncRunHandle.call`` for the run itself.
    """
    token = _RUN.set(run)
    try:  # the SDK starts its run task here: the task's context carries the run for journal_function_tool
        result = Runner.run_streamed(agent, input, **runner_options)
    finally:
        _RUN.reset(token)
    async with run.stream(name or "agents.stream") as out:
        async for event in result.stream_events():
            chunk = _stream_chunk(event)
            if chunk is not None:
                await out.write(chunk)
            yield event
    if result.interruptions:
        raise RuntimeError(f"run {run.run_id} stopped on {len(result.interruptions)} tool approval(s): a run "
                           "that needs approvals goes through run_agent (its approvals are durable)")


def _stream_chunk(event: Any) -> Any:
    """What the durable stream keeps of one SDK stream event (:func:`stream_agent`), or None."""
    kind = getattr(event, "type", None)
    if kind == "raw_response_event":
        data = event.data
        return data.delta if getattr(data, "type", None) == "response.output_text.delta" else None
    if kind == "run_item_stream_event":
        item = event.item
        out = {"event": event.name, "item": getattr(item, "type", None)}
        tool = getattr(getattr(item, "raw_item", None), "name", None)
        if event.name == "tool_called" and isinstance(tool, str):
            out["tool"] = tool
        return out
    if kind == "agent_updated_stream_event":
        return {"event": "agent_updated", "agent": event.new_agent.name}
    return None


async def _settle_open(hooks: Any, error: BaseException) -> None:
    """Settle the spend reservations ``hooks`` left open when the run raised ``error`` (a failed settle is noted on
    ``error``, which propagates as it is)."""
    if isinstance(hooks, JournalRunHooks):
        try:
            await hooks.settle_open()
        except Exception as exc:  # noqa: BLE001 - the run's own error is the one to propagate
            error.add_note(f"open spend reservations were not settled: {exc}")


async def _record_state(run: AsyncRunHandle, store: FrameworkRecordStore, state: Any) -> None:
    data = None if state is None else json.dumps(state.to_json())
    await run.journal.run_sync(store.write, run.run_id, [Record("state", _STATE_FIELD, data)])


def _arguments(raw_item: Any) -> Any:
    """The interrupted tool call's arguments (the model's JSON text decoded) for the approver; the text itself when it
    is not JSON; None when the item carries none."""
    text = getattr(raw_item, "arguments", None)
    if not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


async def _decide(run: AsyncRunHandle, inbox: ApprovalInbox, state: Any, timeout_s: float) -> None:
    """Each interruption: a durable approval (asked once, across crashes); approve or reject it in ``state``."""
    for item in state.get_interruptions():
        call_id = str(getattr(item.raw_item, "call_id", None) or item.raw_item.id)
        name = getattr(item, "tool_name", None) or getattr(item.raw_item, "name", "tool")
        granted = await run.await_approval(inbox, call_id, f"{name} needs approval", tool=name,
                                           args=_arguments(item.raw_item), timeout_s=timeout_s)
        if granted:
            state.approve(item)
        else:
            state.reject(item)

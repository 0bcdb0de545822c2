"""The OpenAI Agents SDK on the journal (``pip install 'runjournal[openai-agents]'``).

* :func:`journal_function_tool` — a ``FunctionTool`` whose invocation goes through ``AsyncRunHandle.call``
  keyed by the model's ``call_id`` (``step=``): intent durable before the function, the idempotency key
  available as ``runjournal.adapters.current_idempotency_key()``, the output recorded; a resumed run returns
  the recorded output instead of calling the function again.
* :class:`JournalRunHooks` — ``RunHooks`` that put every tool call (wrapped or not: hosted tools, MCP) on the
  run's timeline as NODE_STARTED / NODE_SUCCEEDED (node ``tool-<call_id>``).
* :class:`JournalSession` — an Agents SDK ``Session`` whose items are records in the journal's transaction
  (``{prefix}.checkpoints``, kind ``item``), projected into Redis for reads; message turns are also MESSAGE
  events (memory input, never recovery).
* :func:`run_agent` / :func:`resume_agent` — ``needs_approval`` interruptions mapped onto the journal's
  durable approvals: the paused ``RunState`` is recorded (durable), then APPROVAL_REQUESTED; the run waits on
  the approval inbox (``runjournal approve RUN_ID CALL_ID``). Killed while waiting, the run is recovered onto
  a live instance, where ``resume_agent`` loads the recorded state, waits for the same decision (the journal
  says it was asked: it is not asked again), approves or rejects the interruption and runs on — the tool
  runs once.

Run state snapshots are loaded from the journal only (``RunState.from_json``: not authenticated).
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
from typing import Any

try:
    from agents import Agent, RunHooks, Runner
    from agents.run_state import RunState
    from agents.tool import FunctionTool
except ModuleNotFoundError as exc:  # pragma: no cover - the core install
    raise ModuleNotFoundError(f"runjournal.adapters.openai_agents needs {exc.name}: "
                              "pip install 'runjournal[openai-agents]'", name=exc.name) from exc

from runjournal.adapters._checkpoints import FrameworkRecordStore, Record
from runjournal.adapters.tools import JournaledTool, Reconciler
from runjournal.producers.aio import AsyncRunHandle
from runjournal.producers.approvals import ApprovalInbox
from runjournal.schemas import EventType

__all__ = ["JournalRunHooks", "JournalSession", "journal_function_tool", "resume_agent", "run_agent"]

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
    """Every tool call on the run's timeline: NODE_STARTED on start, NODE_SUCCEEDED on end (non-durable)."""

    def __init__(self, run: AsyncRunHandle) -> None:
        self.run = run

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        """NODE_STARTED ``tool-<call_id>``."""
        node = _node_name(str(getattr(context, "tool_call_id", None) or getattr(tool, "name", "tool")))
        await self.run.emit(EventType.NODE_STARTED, {"node_path": node, "attempt": 1}, node_id=node)

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        """NODE_SUCCEEDED ``tool-<call_id>``."""
        node = _node_name(str(getattr(context, "tool_call_id", None) or getattr(tool, "name", "tool")))
        await self.run.emit(EventType.NODE_SUCCEEDED, {"node_path": node}, node_id=node)


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

    ``runner_options`` go to ``Runner.run`` (``run_config``, ``session``, ``hooks`` …). Raises
    ``ApprovalTimeoutError`` when no decision came within ``approval_timeout_s`` (the request stays durable).
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
    finally:
        _RUN.reset(token)
    if result.interruptions:
        return await run_agent(agent, result.to_state(), run=run, inbox=inbox, store=store,
                               approval_timeout_s=approval_timeout_s, **runner_options)
    await _record_state(run, store, None)
    return result


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

"""A journaled-tool wrapper: any function (sync or async) as a :class:`~runjournal.producers.tools.Tool`.

``run.call(journaled(send_email), {"to": "bob"})`` (or ``await arun.call(...)``) runs ``send_email`` under the
side-effect protocol: TOOL_CALL_INTENDED acknowledged by the broker before the function is called, the
idempotency key handed to it, TOOL_CALL_COMMITTED / FAILED after it, unknown outcomes reconciled through the
``reconcile`` hook. The key reaches the function two ways:

* as a keyword argument, when the function declares a parameter named ``idempotency_key`` (configurable);
* through :func:`current_idempotency_key` — a context variable set for the duration of the call, for code
  that cannot take an extra argument (a LangChain tool, an Agents SDK function tool, a client deep inside).

The framework adapters (``langgraph.py``, ``openai_agents.py``) build on this class.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Callable
from typing import Any

from runjournal.producers.tools import Outcome

__all__ = ["JournaledTool", "current_idempotency_key", "journaled"]

_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("runjournal_idempotency_key", default=None)

Reconciler = Callable[[str], "Outcome | None"]


def current_idempotency_key() -> str | None:
    """The idempotency key of the journaled call running in this context (thread or task), or None outside one.

    Pass it to the provider (an ``Idempotency-Key`` header, a client request token): a call re-run after a
    crash carries the same key, so the provider can deduplicate it.
    """
    return _KEY.get()


class JournaledTool:
    """A function as a journaled tool (module docstring). Satisfies ``Tool`` (and ``Reconcilable`` when a
    ``reconcile`` hook is given); async drivers use :meth:`acall` / :meth:`areconcile`.

    Args:
        fn: the function, called as ``fn(**args)`` (plus ``idempotency_key=key`` when it takes that
            parameter); sync or ``async def``.
        name: the tool name recorded in the journal (default ``fn.__name__``); keep it stable.
        side_effect: True (default) when the call changes the world: intent and outcome are durable.
        timeout_ms: the longest the provider may still act on a request after it was sent, ms (default
            30 000); an unknown outcome is reconciled only after it passed.
        reconcile: ``reconcile(key) -> Outcome | None`` (sync or async): the provider's record of a call by
            key; None when it cannot tell. Without it an unknown outcome raises ``OutcomeUnknownError``
            (ask a human through the approval inbox).
        key_param: the parameter name that receives the key (default ``idempotency_key``).
        outcome_commit: ``"strict"`` to have this tool's outcome committed before ``call`` returns even when the
            journal group-commits (a ``reconcile`` that may answer None); None: the journal's mode.
    """

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None, side_effect: bool = True,
                 timeout_ms: int = 30_000, reconcile: Reconciler | None = None,
                 key_param: str = "idempotency_key", outcome_commit: str | None = None) -> None:
        if outcome_commit not in (None, "strict"):
            raise ValueError(f"outcome_commit is 'strict' or None (the journal's mode), got {outcome_commit!r}")
        self.outcome_commit = outcome_commit
        self.fn = fn
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self.side_effect = side_effect
        self.timeout_ms = timeout_ms
        self._reconcile = reconcile
        self._takes_key = _accepts(fn, key_param)
        self._key_param = key_param
        if reconcile is None:
            self.reconcile = None  # the protocol checks ``callable(tool.reconcile)``

    def _kwargs(self, args: dict[str, Any], key: str) -> dict[str, Any]:
        return {**args, self._key_param: key} if self._takes_key else dict(args)

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        """Run the function with ``args`` and the key (sync; an ``async def`` function runs on a new loop)."""
        token = _KEY.set(idempotency_key)
        try:
            out = self.fn(**self._kwargs(args, idempotency_key))
            if inspect.isawaitable(out):
                return asyncio.run(_await(out))
            return out
        finally:
            _KEY.reset(token)

    async def acall(self, args: dict[str, Any], idempotency_key: str) -> Any:
        """Run the function on the event loop when it is ``async def``, else in the loop's default executor."""
        token = _KEY.set(idempotency_key)
        try:
            if inspect.iscoroutinefunction(self.fn):
                return await self.fn(**self._kwargs(args, idempotency_key))
            ctx = contextvars.copy_context()
            return await asyncio.to_thread(ctx.run, self.fn, **self._kwargs(args, idempotency_key))
        finally:
            _KEY.reset(token)

    def reconcile(self, idempotency_key: str) -> Outcome | None:  # type: ignore[no-redef]
        """The provider's record of ``idempotency_key`` through the hook (an async hook runs on a new loop)."""
        assert self._reconcile is not None
        out = self._reconcile(idempotency_key)
        if inspect.isawaitable(out):
            return asyncio.run(_await(out))  # type: ignore[no-any-return]
        return out

    async def areconcile(self, idempotency_key: str) -> Outcome | None:
        """:meth:`reconcile` for async drivers."""
        if self._reconcile is None:
            return None
        if inspect.iscoroutinefunction(self._reconcile):
            return await self._reconcile(idempotency_key)  # type: ignore[no-any-return]
        return await asyncio.to_thread(self._reconcile, idempotency_key)

    def __repr__(self) -> str:
        return f"JournaledTool({self.name!r}, side_effect={self.side_effect})"


def journaled(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """``@journaled`` / ``@journaled(name=…, reconcile=…)`` / ``journaled(fn, …)``: a :class:`JournaledTool`."""
    if fn is None:
        return lambda f: JournaledTool(f, **options)
    return JournaledTool(fn, **options)


def _accepts(fn: Callable[..., Any], param: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return param in params


async def _await(awaitable: Any) -> Any:
    return await awaitable

"""The side-effect protocol as a step machine: one implementation, driven by the sync and the async front ends.

``RunHandle.call`` is written once, as a generator (``RunHandle.call_steps``). Everything that decides —
the key, the recorded state, intent before effect, the outcome after it — runs *inside* the generator; the
three things that touch the tool's world are handed out as effects, which the driver performs and sends
back (or throws back, for an exception):

* :class:`Invoke` — run the tool with ``(args, idempotency_key)``;
* :class:`Reconcile` — ask the tool's provider what happened to a key;
* :class:`Sleep` — wait out the tool's timeout before reconciling (docs/design/protocol.md § Zombies, step 3).

:func:`drive` is the synchronous driver (``RunHandle.call``: the tool runs in the caller's thread).
``runjournal.producers.aio`` drives the same generator from asyncio: the generator's own steps (which publish
and wait for the broker's ack) run in the journal's producer threads, the effects run on the event loop
(a coroutine tool is awaited there). Neither driver decides anything, so both give the same guarantees.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from runjournal.producers.tools import Outcome, Tool

__all__ = ["CallSteps", "Effect", "Invoke", "Reconcile", "Sleep", "advance", "drive"]


@dataclass(frozen=True, slots=True)
class Invoke:
    """Run ``tool(args, idempotency_key)``; send back its result, or throw back what it raised."""

    tool: Tool
    """The tool (sync ``__call__``; an async driver awaits ``acall`` when the tool has one)."""
    args: dict[str, Any]
    """The call's arguments, as the caller passed them."""
    idempotency_key: str
    """The key to hand to the provider."""


@dataclass(frozen=True, slots=True)
class Reconcile:
    """Ask ``tool.reconcile(idempotency_key)`` (an async driver awaits ``areconcile`` when present)."""

    tool: Tool
    """The tool whose provider is asked."""
    idempotency_key: str
    """The key of the call whose outcome is unknown."""


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait ``seconds`` (s) before the next step; send back None."""

    seconds: float
    """How long, seconds (> 0)."""


Effect = Invoke | Reconcile | Sleep
#: A call in progress: yields effects, receives their results, returns the call's recorded value.
CallSteps = Generator[Effect, Any, Any]


def perform(effect: Effect) -> Any:
    """Perform one effect synchronously, in the calling thread."""
    if isinstance(effect, Invoke):
        return effect.tool(effect.args, effect.idempotency_key)
    if isinstance(effect, Reconcile):
        outcome: Outcome | None = effect.tool.reconcile(effect.idempotency_key)  # type: ignore[attr-defined]
        return outcome
    time.sleep(effect.seconds)
    return None


def advance(steps: CallSteps, value: Any = None, error: BaseException | None = None) -> tuple[bool, Any]:
    """Run the generator to its next effect: ``(False, effect)``, or ``(True, returned value)`` when it ended.

    ``error`` is thrown into the generator (the effect raised it); otherwise ``value`` is sent. Exceptions
    the generator raises propagate. Returning a flag rather than letting ``StopIteration`` escape keeps the
    step usable through ``concurrent.futures`` (a future cannot carry a StopIteration).
    """
    try:
        effect = steps.throw(error) if error is not None else steps.send(value)
    except StopIteration as stop:
        return True, stop.value
    return False, effect


def drive(steps: CallSteps, step: Callable[[CallSteps, Any, BaseException | None], tuple[bool, Any]] = advance) -> Any:
    """Drive a call's steps to the end in this thread, performing each effect here; returns the call's value.

    ``step`` advances the generator (default :func:`advance`; a run handle passes its own, which holds the run's
    lock while a step runs, so concurrent calls on one run publish one at a time while their tools run in
    parallel)."""
    value: Any = None
    error: BaseException | None = None
    while True:
        done, out = step(steps, value, error)
        if done:
            return out
        value, error = None, None
        try:
            value = perform(out)
        except BaseException as exc:  # noqa: BLE001 - thrown back into the protocol, which decides
            error = exc

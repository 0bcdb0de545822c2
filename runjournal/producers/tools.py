"""The ``Tool`` protocol: what ``RunHandle.call`` needs from a side-effecting (or read-only) tool.

docs/design/protocol.md § The side-effect protocol. A tool receives the call's idempotency key and should
pass it to its provider (an ``Idempotency-Key`` header, a client request token, a unique
constraint), so a call that is re-run after a crash is deduplicated by the provider.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["BUILTIN_PREFIX", "Outcome", "Reconcilable", "Tool", "ToolOutcomeUnknownError", "is_builtin"]

BUILTIN_PREFIX = "runjournal."
"""Names of the journal's own built-in tools start with it: ``runjournal.timer``, ``runjournal.signal``
(``producers.waits``), ``runjournal.spend.reserve`` / ``.settle`` (``producers.spend``)."""


def is_builtin(tool: str) -> bool:
    """True for a built-in tool's name (a durable wait, a spend step): a step of the journal's, not an agent's tool —
    what compares an agent's calls with its script or its provider's witness leaves these out."""
    return tool.startswith(BUILTIN_PREFIX)


class ToolOutcomeUnknownError(Exception):
    """Raised by a tool when it cannot tell whether its request acted (sent, but no answer came back).

    ``RunHandle.call`` then publishes no outcome: the call stays intended, the caller gets
    ``OutcomeUnknownError`` (chained), and the call is settled later by ``reconcile(idempotency_key)``
    or a human approval — never blindly run again. Failures that leave the outcome unknown are also
    recognised without this type (a timeout or reset after the request left, see
    ``runjournal.producers._unknown``); set ``outcome_unknown = False`` on an exception to say a
    failure is definite (nothing was executed), or ``True`` to say it is unknown.
    """

    outcome_unknown = True


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the provider says happened to a call, looked up by idempotency key (``Tool.reconcile``)."""

    executed: bool
    """True: the provider executed the call (it may still have failed, see ``error``)."""
    result: Any = None
    """The call's JSON-serialisable result when executed successfully."""
    error: str | None = None
    """The provider's error text when it executed and failed; None otherwise."""


@runtime_checkable
class Tool(Protocol):
    """A callable tool, journaled by ``RunHandle.call``.

    Attributes:
        name: stable tool name (recorded in every TOOL_CALL_* event; part of the recovery plan).
        side_effect: True when the call changes the world (email, payment, booking). Its intent and
            outcome are durable; a read-only tool (False) is journaled non-durably and may simply run
            again after a crash.
        timeout_ms: the longest the provider may still act on a request after it was sent, in ms.
            Recorded in TOOL_CALL_INTENDED; the recovery job reconciles an unknown outcome only after
            the instance's lease expired *and* this much time passed (docs/design/protocol.md § Zombies, step 3).
            ``call`` does not enforce it.

    Optional attribute ``outcome_commit = "strict"``: commit this tool's outcome before ``call`` returns even when
    the journal group-commits outcomes (``Journal(outcome_commit="group")``, the default). Group commit relies on
    ``reconcile`` answering for every key it was called with; set it when the provider may answer None ("cannot
    tell"): a crash in the group window would then leave an unknown that needs a human, where strict leaves
    COMMITTED.
    """

    name: str
    side_effect: bool
    timeout_ms: int

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        """Run the call with ``args``, passing ``idempotency_key`` to the provider; return a JSON value.

        The result is recorded as canonical JSON and the caller receives it read back from that text
        (``runjournal.producers._recorded``); a value JSON cannot carry exactly raises
        ``UnrecordableResultError`` after the call is recorded as committed.

        Raise any exception on failure; set ``retryable = True`` on it when a retry may succeed. Raise
        :class:`ToolOutcomeUnknownError` (or let a timeout / connection reset after the request left
        propagate) when the request may have acted: the call is then reconciled, not retried.
        """
        ...


@runtime_checkable
class Reconcilable(Protocol):
    """A tool that can ask its provider what happened to a call (optional part of :class:`Tool`)."""

    def reconcile(self, idempotency_key: str) -> Outcome | None:
        """The provider's record of the call with ``idempotency_key``; None when it cannot tell."""
        ...

"""What a run handle needs from the journal that created it (:class:`JournalPort`).

:class:`~runjournal.producers.handle.RunHandle` and its ``call`` half depend on this protocol, not on
:class:`~runjournal.producers.journal.Journal`, so the journal → handle import runs one way and other
journals (an asyncio front end) can create the same handles.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from concurrent.futures import Future

    from runjournal.producers.errors import DeliveryError
    from runjournal.producers.results import ResultStore
    from runjournal.schemas import Event

__all__ = ["JournalPort", "OutcomeCommit"]

#: How a reconcilable side effect's outcome is acknowledged (``Journal(outcome_commit=…)``).
OutcomeCommit = Literal["group", "strict"]


class JournalPort(Protocol):
    """The journal side of a run handle (implemented by :class:`~runjournal.producers.journal.Journal`)."""

    producer_id: str
    """This instance's producer id (``transactional.id`` and lease derive from it)."""
    inline_result_bytes: int
    """Results up to this many bytes (UTF-8 JSON) ride inline in TOOL_CALL_COMMITTED; larger go by reference."""
    results: ResultStore
    """Reads results stored by reference (Redis cache first, then ``{prefix}.payloads``)."""
    max_result_bytes: int
    """Largest result (and call arguments) recorded, bytes (``Settings.max_result_bytes``)."""
    outcome_retries: int
    """Bounded retries of the event stating a tool's outcome before ``OutcomeNotDurableError``."""
    outcome_commit: OutcomeCommit
    """``group``: a reconcilable tool's TOOL_CALL_COMMITTED rides the next commit; ``strict``: committed before
    ``call`` returns (``Journal``'s docstring)."""
    run_events_warn: int
    """A run's event budget (``Settings.run_events_warn``; 0: none): reported once per handle when reached."""
    run_events_max: int
    """A run's hard event limit (``Settings.run_events_max``; 0: none): new work past it is refused."""

    @property
    def fence_count(self) -> int:
        """How many times this instance was found fenced; a handle made before a fence stops writing."""
        ...

    @property
    def lapsed(self) -> bool:
        """True once the instance's lease lapsed (it is fenced for good)."""
        ...

    def event_budget_reached(self, run_id: str, seq: int) -> None:
        """A handle of ``run_id`` reached the run's event budget (``Settings.run_events_warn``) at ``seq``."""
        ...

    def publish(self, event: Event, *, durable: bool,
                on_lost: Callable[[DeliveryError], None] | None = None, deferred: bool = False,
                smaller: Callable[[], Event | None] | None = None) -> None:
        """Publish one event of the run; with ``durable`` return only after the broker acknowledged it; with
        ``deferred`` (not durable) it is a tool's outcome the next commit acknowledges."""
        ...

    def publish_payload(self, run_id: str, text: str) -> str:
        """Write a result larger than ``inline_result_bytes`` to ``{prefix}.payloads`` (committed) and return its
        ``kafka:`` reference (``runjournal.producers.results``)."""
        ...

    def run_lock(self, run_id: str) -> threading.RLock:
        """The lock every writer of ``run_id`` in this instance holds while it decides and publishes."""
        ...

    def release_run(self, run_id: str) -> None:
        """Forget ``run_id`` as owned by this instance (after its terminal event)."""
        ...

    def probe_lease(self, window_ms: int = 0) -> Future[bool]:
        """Start reading the instance's lease now, for a later :meth:`check_still_owner`."""
        ...

    def check_still_owner(self, probe: Future[bool] | None = None, window_ms: int = 0) -> None:
        """Raise ``LeaseLapsedError`` unless this instance still holds its lease (``probe``: a read started
        earlier by :meth:`probe_lease`)."""
        ...

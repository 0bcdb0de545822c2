"""The design's stores as named contracts: six Protocols, two planes (docs/design/protocol.md § Planes and stores).

Execution plane — what the program *has done*; recovery and the ContextManager take facts from here only:

=========================  ===============================  ==========================================
contract                   implementation                   module
=========================  ===============================  ==========================================
:class:`EventStore`        the Kafka topic ``{prefix}.events``  ``runjournal.consumers.context.execution_stores``
:class:`StateStore`        the Redis projection             ``runjournal.consumers.context.execution_stores``
:class:`ExecutionRecordStore`  the Redis projection         ``runjournal.consumers.context.execution_stores``
:class:`CheckpointStore`   projected state + applied offset ``runjournal.consumers.context.execution_stores``
=========================  ===============================  ==========================================

Cognition plane — what the model may *know*; advisory, loaded only after the execution facts are settled:

=========================  ===============================  ==========================================
:class:`MemoryStore`       a Qdrant memory collection       ``runjournal.consumers.memory``
:class:`Retriever`         a Qdrant knowledge collection    ``runjournal.consumers.knowledge``
=========================  ===============================  ==========================================

Every implementation names its :class:`Plane` and :class:`Authority` (``plane``, ``authority`` attributes), so a
cross-use is caught where stores are wired together (:func:`require_plane`), not by luck. No class spans both
planes. The import-linter contracts in ``pyproject.toml`` keep recovery and the execution stores from importing
memory or knowledge; this module imports neither (the cognition shapes live in :mod:`runjournal.stores._cognition`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Protocol, runtime_checkable

from runjournal.model import ExecutionRecord, RunState
from runjournal.schemas.events import Event
from runjournal.stores._cognition import Evidence, KnowledgeScope, MemoryHit, MemoryItem, Scope
from runjournal.stores._execution import Checkpoint, EventPosition, StoredEvent
from runjournal.stores.errors import PlaneError

__all__ = ["Authority", "CheckpointStore", "EventStore", "ExecutionRecordStore", "MemoryReader", "MemoryStore",
           "Plane", "Retriever", "StateStore", "require_plane"]


class Plane(StrEnum):
    """Which trust plane a store belongs to."""

    EXECUTION = "execution"
    """What the program has done: events, run state, execution records, checkpoints."""
    COGNITION = "cognition"
    """What the model may know: learned memory and external knowledge."""


class Authority(StrEnum):
    """How far a store's answers may be trusted."""

    AUTHORITATIVE = "authoritative"
    """The source of truth (the events topic)."""
    DERIVED = "derived"
    """Folded from the source of truth exactly once; authoritative for recovery at the offset it covers."""
    ADVISORY = "advisory"
    """May inform a model; never decides what a run has done."""


def require_plane(store: object, plane: Plane, role: str) -> None:
    """Refuse ``store`` in ``role`` unless it declares ``plane`` (a cross-use is a contract violation).

    Raises:
        PlaneError: ``store.plane`` is missing or another plane (e.g. a memory store offered as a StateStore).
    """
    actual = getattr(store, "plane", None)
    if actual != plane:
        raise PlaneError(f"{role} must be a {plane.value}-plane store; {type(store).__name__} is "
                         f"{actual.value if isinstance(actual, Plane) else 'of no declared plane'}")


@runtime_checkable
class EventStore(Protocol):
    """Immutable runtime events, in order per run.

    * scope: every run of every tenant; one run is one ordered stream (its partition is murmur2(run_id)).
    * consistency: authoritative. An append returns only once the broker acknowledged it (acks=all,
      idempotent producer); reads are ``read_committed`` (aborted transactions are never seen).
    * mutability: append-only. A record is never changed; an erase writes a tombstone on its key.
    * authority: :attr:`Authority.AUTHORITATIVE` — every other execution store is folded from it.
    """

    plane: Plane
    authority: Authority

    def append(self, events: Sequence[Event]) -> list[EventPosition]:
        """Append ``events`` (keys ``{run_id}:{epoch}:{seq}``) and wait for the broker's acknowledgement.

        Returns:
            One :class:`EventPosition` per event, in order.

        Raises:
            RunjournalError: the broker refused or did not acknowledge within the timeout.
        """
        ...

    def read_run(self, run_id: str) -> list[StoredEvent]:
        """Every record of ``run_id`` in offset order (tombstones and undecodable records included)."""
        ...

    def read_from(self, partition: int, offset: int, *, limit: int = 1000) -> list[StoredEvent]:
        """Up to ``limit`` records of ``partition`` from ``offset`` on, in offset order (fewer at the end)."""
        ...


@runtime_checkable
class StateStore(Protocol):
    """Current run state, one per run, with its optimistic version.

    * scope: one state per run id (its tenant inside); never searched by content.
    * consistency: derived exactly once from the :class:`EventStore`; the version is the run's applied
      ``(partition, offset)`` — a state is never older than its version says and never skips an event.
    * mutability: read-only to everyone but the projector, whose one atomic write per partition batch is a
      compare-and-set on the partition's applied offset (a batch folded from a stale view is refused).
    * authority: :attr:`Authority.DERIVED`; never read from a vector store, memory or a transcript.
    """

    plane: Plane
    authority: Authority

    def get(self, run_id: str) -> RunState | None:
        """The run's current state, or None when the run is unknown (not yet projected, or erased)."""
        ...

    def version(self, run_id: str) -> tuple[int, int] | None:
        """The state's optimistic version ``(partition, applied offset)``, or None when unknown."""
        ...


@runtime_checkable
class ExecutionRecordStore(Protocol):
    """Tool/node attempts, idempotency keys and side-effect commit status.

    * scope: per run, per tool call (``call_id``).
    * consistency: derived exactly once with the run's state (same atomic write).
    * mutability: read-only to everyone but the projector; a COMMITTED record is sticky.
    * authority: :attr:`Authority.DERIVED` and authoritative for recovery: only a record decides whether an
      effect happened; a memory or a document saying so never does.
    """

    plane: Plane
    authority: Authority

    def records(self, run_id: str) -> Mapping[str, ExecutionRecord]:
        """call_id -> record of every tool call of ``run_id`` (empty when none or unknown)."""
        ...

    def record(self, run_id: str, call_id: str) -> ExecutionRecord | None:
        """One call's record, or None."""
        ...


@runtime_checkable
class CheckpointStore(Protocol):
    """A state snapshot plus the offset and pending metadata it covers: where replay/recovery may start.

    * scope: per run (and per partition for the applied offset).
    * consistency: derived; ``checkpoint.state`` is exactly the fold of the run's records up to
      ``checkpoint.offset`` — the tail after it is read from the :class:`EventStore`.
    * mutability: written only with the state, by the projector's atomic batch.
    * authority: :attr:`Authority.DERIVED`.
    """

    plane: Plane
    authority: Authority

    def checkpoint(self, run_id: str) -> Checkpoint | None:
        """The run's latest checkpoint, or None when the run has none."""
        ...

    def applied_offset(self, partition: int) -> int:
        """The last offset of ``partition`` reflected in the checkpoints (-1: none)."""
        ...


@runtime_checkable
class MemoryReader(Protocol):
    """The read half of :class:`MemoryStore` (what readers in other processes get)."""

    plane: Plane
    authority: Authority

    def search(self, scope: Scope, query: str, *, limit: int = 10, all_statuses: bool = False,
               where: Mapping[str, str] | None = None) -> list[MemoryHit]:
        """The ``limit`` items of ``scope`` nearest to ``query``, best first (active only unless ``all_statuses``).

        Raises:
            ScopeError: ``scope`` is not a memory Scope (a knowledge scope is a cross-use), or ``where``
                names an identity key.
            PlaneError: the backend returned a point that is not memory (never expected; nothing is returned).
        """
        ...


@runtime_checkable
class MemoryStore(MemoryReader, Protocol):
    """Learned cross-run guidance, with provenance.

    * scope: a tenant is required on every write and every search (the item's owner; optionally user and
      agent). One tenant never sees another's memory.
    * consistency: eventual (the extractor may lag or be down); idempotent writes (ids from event id).
    * mutability: written only by the memory extractor (and erased by ``erase``); a newer item on the same
      ``(tenant, user, subject)`` supersedes the older (kept as history, not returned by default).
    * authority: :attr:`Authority.ADVISORY`. Never holds knowledge, never states what a run has done.
    """

    def upsert(self, items: Sequence[MemoryItem]) -> int:
        """Write ``items`` idempotently and settle supersession; returns the number of points written.

        Raises:
            ScopeError: an item has no owner (Scope with a tenant).
        """
        ...

    def delete_by_run(self, run_id: str) -> int:
        """Erase every item extracted from ``run_id``, in every tenant (admin); returns points deleted."""
        ...


@runtime_checkable
class Retriever(Protocol):
    """External knowledge evidence, ranked, with provenance.

    * scope: a shared corpus — never tenant-private data; a :class:`KnowledgeScope` only narrows by
      corpus or document. A memory :class:`Scope` is refused (cross-use).
    * consistency: as of the last ingest; each section carries the document version it came from, and a
      changed section supersedes the old one.
    * mutability: read-only at query time (``retrieve`` never writes, and never writes memory); only
      ``runjournal knowledge ingest`` changes the corpus.
    * authority: :attr:`Authority.ADVISORY` — evidence may inform a model; it never proves an effect happened.
    """

    plane: Plane
    authority: Authority

    def retrieve(self, query: str, scope: KnowledgeScope | None = None, *, limit: int = 5) -> list[Evidence]:
        """Up to ``limit`` sections relevant to ``query``, best first, each with its provenance.

        Raises:
            ScopeError: ``scope`` is not a KnowledgeScope.
            ProvenanceError: a stored point lacks provenance (nothing is returned).
        """
        ...

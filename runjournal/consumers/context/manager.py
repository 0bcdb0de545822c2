"""The ContextManager: a model's next context, execution facts first, advice after.

``build_context(run_id, query)``:

1. **Facts** — the run's state and execution records, from the :class:`~runjournal.stores.StateStore` and
   :class:`~runjournal.stores.ExecutionRecordStore` only (never memory, never a document, never a transcript),
   with the version ``(partition, offset)`` they are as of. A store of another plane is refused when the
   manager is built (:class:`~runjournal.stores.PlaneError`).
2. **Then advice** — memory items of the run's own tenant and user (the scope comes from the settled facts,
   not from the caller) and knowledge evidence, each labelled ``advisory`` with its provenance. An advisory
   item that speaks of a tool whose record is not committed carries a ``conflicts_with`` note naming the
   record: it stays advice, and the record wins.

Nothing returned can change a recorded fact: every shape is frozen, the facts are copies, and no method
derives a fact from advice. Memory or knowledge being unavailable leaves a note, never a failure — advice
is optional; facts are not (a StateStore failure raises).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from runjournal.core.errors import RunjournalError
from runjournal.model import RunState
from runjournal.stores import (
    ExecutionRecordStore,
    KnowledgeScope,
    MemoryReader,
    Plane,
    Retriever,
    Scope,
    StateStore,
    StoreContractError,
    require_plane,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from runjournal.core.settings import Settings

__all__ = ["ADVISORY_LABEL", "AdvisoryItem", "CallFact", "Context", "ContextManager", "ExecutionFacts"]

log = logging.getLogger("runjournal.consumers.context")

#: The label every advisory item carries.
ADVISORY_LABEL = "advisory — may be stale or wrong; never an execution fact (the journal's records decide)"


@dataclass(frozen=True, slots=True)
class CallFact:
    """One tool call as the journal records it."""

    call_id: str
    """The call's id within the run."""
    tool: str
    """Tool name."""
    status: str
    """:class:`~runjournal.model.CallStatus` value (COMMITTED, OUTCOME_UNKNOWN …)."""
    effect_committed: bool
    """True only when the journal says the effect happened (COMMITTED, or RECONCILED as COMMITTED)."""
    attempts: int
    """TOOL_CALL_INTENDED events seen."""
    idempotency_key: str
    """The key passed to the provider."""


@dataclass(frozen=True, slots=True)
class ExecutionFacts:
    """What the program has done, from the execution stores (``authority`` = ``fact``)."""

    run_id: str
    """The run."""
    known: bool
    """False when the StateStore has no state for the run (not yet projected, or erased)."""
    status: str | None = None
    """:class:`~runjournal.model.RunStatus` value."""
    epoch: int = 0
    """Ownership epoch."""
    tenant_id: str | None = None
    """Owning tenant (the memory scope derives from it)."""
    user_id: str | None = None
    """The run's user."""
    agent: str | None = None
    """The run's agent."""
    as_of: tuple[int, int] | None = None
    """The state's version ``(partition, offset)``: facts include every event up to it."""
    calls: tuple[CallFact, ...] = ()
    """Every tool call's record, in call_id order."""
    pending_approvals: tuple[str, ...] = ()
    """call_ids awaiting a human."""
    authority: str = "fact"
    """Always ``fact``."""


@dataclass(frozen=True, slots=True)
class AdvisoryItem:
    """One memory item or knowledge section in a context (``authority`` = ``advisory``)."""

    source: str
    """``memory`` or ``knowledge``."""
    text: str
    """The remembered statement, or the evidence passage."""
    score: float
    """Similarity to the query (cosine)."""
    provenance: Mapping[str, Any]
    """Memory: run_id, event_id, topic/partition/offset …; knowledge: path, section, content_sha256,
    document_version, ingested_at (read-only mapping)."""
    conflicts_with: tuple[str, ...] = ()
    """Records this item seems to speak of and which are not committed: the record wins."""
    label: str = ADVISORY_LABEL
    """Always :data:`ADVISORY_LABEL`."""
    authority: str = "advisory"
    """Always ``advisory``."""


@dataclass(frozen=True, slots=True)
class Context:
    """A model's context for one turn: facts first, then advice."""

    run_id: str
    """The run."""
    query: str
    """What the advice was retrieved for."""
    facts: ExecutionFacts
    """From the execution stores only."""
    memory: tuple[AdvisoryItem, ...] = ()
    """Memory items of the run's tenant and user, best first."""
    knowledge: tuple[AdvisoryItem, ...] = ()
    """Knowledge evidence, best first."""
    notes: tuple[str, ...] = field(default=())
    """Why some advice is missing (run unknown, store unavailable)."""

    def call_status(self, call_id: str) -> str | None:
        """The recorded status of ``call_id`` (from the facts; advice is never consulted), or None."""
        return next((c.status for c in self.facts.calls if c.call_id == call_id), None)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able: ``{"run_id", "query", "facts", "memory", "knowledge", "notes"}`` (facts first)."""
        f = self.facts
        facts = {"authority": f.authority, "known": f.known, "status": f.status, "epoch": f.epoch,
                 "tenant_id": f.tenant_id, "user_id": f.user_id, "agent": f.agent,
                 "as_of": list(f.as_of) if f.as_of else None, "pending_approvals": list(f.pending_approvals),
                 "calls": [{"call_id": c.call_id, "tool": c.tool, "status": c.status,
                            "effect_committed": c.effect_committed, "attempts": c.attempts} for c in f.calls]}
        def advice(items: tuple[AdvisoryItem, ...]) -> list[dict[str, Any]]:
            return [{"authority": a.authority, "label": a.label, "source": a.source, "text": a.text,
                     "score": round(a.score, 4), "provenance": dict(a.provenance),
                     "conflicts_with": list(a.conflicts_with)} for a in items]
        return {"run_id": self.run_id, "query": self.query, "facts": facts, "memory": advice(self.memory),
                "knowledge": advice(self.knowledge), "notes": list(self.notes)}

    def render(self) -> str:
        """Plain text for a model prompt: the facts block first, then each advisory item with its label."""
        f = self.facts
        lines = [f"EXECUTION FACTS (journal, as of {f.as_of}) — authoritative:"]
        if not f.known:
            lines.append("  the journal has no projected state for this run yet")
        else:
            lines.append(f"  run {f.run_id}: {f.status}, epoch {f.epoch}")
            lines += [f"  call {c.call_id} {c.tool}: {c.status}" for c in f.calls]
        for title, items in (("MEMORY", self.memory), ("KNOWLEDGE", self.knowledge)):
            if items:
                lines.append(f"{title} — {ADVISORY_LABEL}:")
                for a in items:
                    src = a.provenance.get("section") or a.provenance.get("run_id")
                    warn = f" [conflicts with the journal: {'; '.join(a.conflicts_with)}]" if a.conflicts_with else ""
                    lines.append(f"  - {a.text} (from {src}){warn}")
        return "\n".join(lines)


class ContextManager:
    """Builds :class:`Context` objects (see the module docstring).

    Args:
        state: the StateStore (execution plane); facts come from here.
        records: the ExecutionRecordStore (execution plane).
        memory: a MemoryReader (cognition plane), or None for no memory.
        knowledge: a Retriever (cognition plane), or None for no knowledge.
        memory_limit, knowledge_limit: items of each kind per context (defaults 5 and 3).
        knowledge_scope: narrows the corpus (default: all of it).

    Raises:
        PlaneError: a store of the wrong plane in a role (e.g. a memory store as ``state``).
    """

    def __init__(self, state: StateStore, records: ExecutionRecordStore, memory: MemoryReader | None = None,
                 knowledge: Retriever | None = None, *, memory_limit: int = 5, knowledge_limit: int = 3,
                 knowledge_scope: KnowledgeScope | None = None) -> None:
        require_plane(state, Plane.EXECUTION, "the ContextManager's state store")
        require_plane(records, Plane.EXECUTION, "the ContextManager's execution record store")
        for store, role in ((memory, "memory"), (knowledge, "knowledge")):
            if store is not None:
                require_plane(store, Plane.COGNITION, f"the ContextManager's {role} store")
        self.state, self.records, self.memory, self.knowledge = state, records, memory, knowledge
        self.memory_limit, self.knowledge_limit = memory_limit, knowledge_limit
        self.knowledge_scope = knowledge_scope

    @classmethod
    def open(cls, settings: Settings, *, memory: bool = True, knowledge: bool = True,
             **kwargs: Any) -> ContextManager:
        """The default wiring: the Redis projection for facts; memory and knowledge read from any process
        (:mod:`runjournal.consumers.cognition`)."""
        from runjournal.consumers.cognition import open_memory_reader, open_retriever
        from runjournal.consumers.context.execution_stores import RedisRunStore

        run_store = RedisRunStore.open(settings)
        return cls(run_store, run_store, open_memory_reader(settings) if memory else None,
                   open_retriever(settings) if knowledge else None, **kwargs)

    def build_context(self, run_id: str, query: str) -> Context:
        """Facts of ``run_id`` first, then memory and knowledge for ``query`` (see the module docstring).

        Raises:
            redis.RedisError (or the StateStore's own error): the facts cannot be read — no context without facts.
        """
        facts = self._facts(run_id)  # 1: settled before any advice is loaded
        notes: list[str] = []
        memory: tuple[AdvisoryItem, ...] = ()
        if self.memory is not None:
            if facts.tenant_id is None:
                notes.append("memory skipped: the run's tenant is not known from the journal yet")
            else:
                reader, scope = self.memory, Scope(facts.tenant_id, user_id=facts.user_id)
                memory = self._advice(notes, "memory", lambda: [
                    ("memory", h.text, h.score, {**h.provenance, "kind": h.kind, "subject": h.subject,
                                                 "status": h.status, "created_at": h.freshness.get("created_at")})
                    for h in reader.search(scope, query, limit=self.memory_limit)
                    if h.encrypted is None], facts)  # a sealed item this process cannot open is no advice
        knowledge: tuple[AdvisoryItem, ...] = ()
        if self.knowledge is not None:
            retriever = self.knowledge
            knowledge = self._advice(notes, "knowledge", lambda: [
                ("knowledge", e.text, e.score, {"path": e.path, "section": e.section, "corpus": e.corpus,
                                                "content_sha256": e.content_sha256, "ingested_at": e.ingested_at,
                                                "document_version": e.document_version})
                for e in retriever.retrieve(query, self.knowledge_scope, limit=self.knowledge_limit)], facts)
        return Context(run_id=run_id, query=query, facts=facts, memory=memory, knowledge=knowledge, notes=tuple(notes))

    def _facts(self, run_id: str) -> ExecutionFacts:
        state: RunState | None = self.state.get(run_id)
        if state is None:
            return ExecutionFacts(run_id=run_id, known=False)
        records = self.records.records(run_id)
        calls = tuple(CallFact(call_id=cid, tool=r.tool, status=r.status.value, effect_committed=r.effect_committed,
                               attempts=r.attempts, idempotency_key=r.idempotency_key)
                      for cid, r in sorted(records.items()))
        return ExecutionFacts(run_id=run_id, known=True, status=state.status.value, epoch=state.epoch,
                              tenant_id=state.tenant_id, user_id=state.user_id, agent=state.agent,
                              as_of=(state.applied_partition, state.applied_offset), calls=calls,
                              pending_approvals=tuple(sorted(state.pending_approvals)))

    def _advice(self, notes: list[str], source: str, fetch: Any, facts: ExecutionFacts) -> tuple[AdvisoryItem, ...]:
        try:
            found = fetch()
        except StoreContractError:
            raise  # a cross-use is a bug, not an outage
        except RunjournalError as exc:
            notes.append(f"{source} unavailable: {type(exc).__name__}: {exc}")
            log.warning("advice unavailable", extra={"source": source, "error": str(exc)})
            return ()
        return tuple(AdvisoryItem(source=src, text=text, score=float(score), provenance=MappingProxyType(dict(prov)),
                                  conflicts_with=_conflicts(text, facts)) for src, text, score, prov in found)


_WORD = re.compile(r"[a-z0-9]+")


def _conflicts(text: str, facts: ExecutionFacts) -> tuple[str, ...]:
    """Records whose tool ``text`` seems to mention (a word of the tool's name longer than 3 letters) and whose
    effect the journal does not record as committed."""
    words = set(_WORD.findall(text.lower()))
    out = []
    for c in facts.calls:
        if c.effect_committed:
            continue
        if any(len(w) > 3 and w in words for w in _WORD.findall(c.tool.lower())):
            out.append(f"call {c.call_id} ({c.tool}) is {c.status} in the journal")
    return tuple(out)

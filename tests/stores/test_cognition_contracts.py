"""Contract suites of the cognition stores, shared by every implementation, on ONE Qdrant instance.

* MemoryReader / MemoryStore — the embedded store itself, and a reader in another role going through the
  owner's read API (``open_memory_reader``).
* Retriever — the embedded knowledge base, and ``open_retriever`` through the owner's API.

Memory and knowledge share the instance (one directory, one client) and keep different contracts: memory
writes need an owner (a tenant scope) and supersede; knowledge needs provenance, holds no tenant data and
is read-only at query time. A cross-use — a memory search meeting knowledge, a retriever meeting memory, a
memory scope on the corpus — fails the contract with a named error.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from qdrant_client import models

from runjournal.consumers.cognition import CognitionOwner, open_memory_reader, open_retriever
from runjournal.core.settings import Settings
from runjournal.stores import (
    Authority,
    ItemKind,
    KnowledgeScope,
    MemoryItem,
    MemoryReader,
    MemoryStore,
    Plane,
    PlaneError,
    Provenance,
    ProvenanceError,
    Retriever,
    Scope,
    ScopeError,
)
from runjournal.testing import HashingEmbedder

POLICY = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "knowledge" / "tau-bench-airline-policy.md"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def item(text: str, *, tenant: str = "acme", user: str | None = "u1", subject: str | None = "email", at_s: int = 0,
         run_id: str = "r1", event: str | None = None) -> MemoryItem:
    return MemoryItem(text=text, kind=ItemKind.FACT, subject=subject, scope=Scope(tenant, user_id=user),
                      created_at=T0 + timedelta(seconds=at_s),
                      provenance=Provenance(run_id=run_id, event_id=event or f"e-{text}", event_type="MESSAGE",
                                            topic="t.events", partition=0, offset=at_s, schema="test",
                                            extractor="test"))


def everything(owner: CognitionOwner) -> dict[str, dict]:
    """Every point of both collections: ``{collection: {id: payload}}``."""
    out: dict[str, dict] = {}
    for coll in (owner.memory.collection, owner.knowledge.collection):
        points, _ = owner.memory.client.scroll(coll, limit=100_000, with_payload=True)
        out[coll] = {str(p.id): p.payload for p in points}
    return out


@pytest.fixture
def qsettings(tmp_path: Path) -> Settings:
    return Settings.load(stack_dir=tmp_path / "stack", qdrant_path=tmp_path / "qdrant", topic_prefix="cc")


@pytest.fixture
def owner(qsettings: Settings, tmp_path: Path) -> Iterator[CognitionOwner]:
    """One Qdrant instance with both collections filled, serving the read API."""
    with CognitionOwner.open(qsettings, HashingEmbedder()) as o:
        o.memory.upsert([item("The confirmation email was sent to bob", at_s=1),
                         item("I prefer window seats", subject="seat_preference", at_s=2),
                         item("The globex secret", tenant="globex", user=None, subject=None, at_s=3)])
        doc = tmp_path / "policy.md"
        shutil.copy(POLICY, doc)
        o.knowledge.ingest(doc)
        yield o


@pytest.fixture(params=["embedded", "owner-api"])
def memory(request: pytest.FixtureRequest, owner: CognitionOwner, qsettings: Settings) -> Iterator[MemoryReader]:
    if request.param == "embedded":
        yield owner.memory
        return
    reader = open_memory_reader(qsettings, embedder_factory=HashingEmbedder, wait_s=5)
    yield reader
    reader.close()


@pytest.fixture(params=["embedded", "owner-api"])
def retriever(request: pytest.FixtureRequest, owner: CognitionOwner, qsettings: Settings) -> Iterator[Retriever]:
    if request.param == "embedded":
        yield owner.knowledge
        return
    reader = open_retriever(qsettings, embedder_factory=HashingEmbedder, wait_s=5)
    yield reader
    reader.close()


class TestMemoryContract:
    def test_it_is_an_advisory_cognition_store(self, memory: MemoryReader) -> None:
        assert isinstance(memory, MemoryReader)
        assert (memory.plane, memory.authority) == (Plane.COGNITION, Authority.ADVISORY)

    def test_a_search_needs_its_tenant_and_never_crosses_it(self, memory: MemoryReader) -> None:
        hits = memory.search(Scope("acme"), "secret email seats", limit=10)
        assert hits and {h.scope["tenant_id"] for h in hits} == {"acme"}
        assert [h.text for h in memory.search(Scope("globex"), "secret")] == ["The globex secret"]
        with pytest.raises(ScopeError):
            memory.search(KnowledgeScope(), "email")  # type: ignore[arg-type]  # a corpus scope is not an owner

    def test_hits_are_memory_with_provenance_never_knowledge(self, memory: MemoryReader) -> None:
        hits = memory.search(Scope("acme", user_id="u1"), "travel insurance book flight passengers", limit=20)
        assert hits and all(h.authority == "advisory" and h.provenance["run_id"] == "r1" for h in hits)
        assert not any("Book flight" in h.text for h in hits)

    def test_a_newer_item_supersedes_the_older(self, memory: MemoryReader, owner: CognitionOwner) -> None:
        owner.memory.upsert([item("The confirmation email was NOT sent", at_s=9)])
        active = memory.search(Scope("acme", user_id="u1"), "confirmation email", where={"subject": "email"})
        assert [h.text for h in active] == ["The confirmation email was NOT sent"]
        both = memory.search(Scope("acme", user_id="u1"), "confirmation email", all_statuses=True,
                             where={"subject": "email"})
        assert sorted(h.status for h in both) == ["active", "superseded"]


def test_memory_writes_need_an_owner(owner: CognitionOwner) -> None:
    assert isinstance(owner.memory, MemoryStore)
    with pytest.raises(ScopeError):
        item("no owner", tenant="")
    ownerless = MemoryItem(text="x", kind=ItemKind.FACT, subject=None, scope=None, created_at=T0,  # type: ignore[arg-type]
                           provenance=item("x").provenance)
    with pytest.raises(ScopeError):
        owner.memory.upsert([ownerless])


class TestRetrieverContract:
    def test_it_is_an_advisory_cognition_store(self, retriever: Retriever) -> None:
        assert isinstance(retriever, Retriever)
        assert (retriever.plane, retriever.authority) == (Plane.COGNITION, Authority.ADVISORY)

    def test_evidence_is_ranked_and_carries_provenance(self, retriever: Retriever) -> None:
        found = retriever.retrieve("travel insurance dollars per passenger", limit=3)
        assert len(found) == 3 and [e.score for e in found] == sorted((e.score for e in found), reverse=True)
        for e in found:
            assert e.path.endswith("policy.md") and len(e.content_sha256) == 64 and e.document_version
            assert e.ingested_at and e.section and e.authority == "advisory"

    def test_it_is_read_only_at_query_time_and_never_writes_memory(self, retriever: Retriever,
                                                                  owner: CognitionOwner) -> None:
        before = everything(owner)
        for q in ("cancel", "refund certificate", "the email was sent"):
            retriever.retrieve(q)
        assert everything(owner) == before
        assert not hasattr(retriever, "upsert")

    def test_a_memory_scope_is_refused(self, retriever: Retriever) -> None:
        with pytest.raises(ScopeError):
            retriever.retrieve("email", Scope("acme"))  # type: ignore[arg-type]


# -- cross-uses fail the contract ----------------------------------------------------------------------------
def _stray(owner: CognitionOwner, collection: str, payload: dict, text: str) -> None:
    """A point written into ``collection`` by a writer that mixes the planes (a ``search_everything`` design)."""
    vector = owner.memory.embedder.embed([text])[0].tolist()
    owner.memory.client.upsert(collection, points=[models.PointStruct(
        id="00000000-0000-0000-0000-0000000000aa", vector=vector, payload={**payload, "text": text})], wait=True)


def test_a_memory_search_that_meets_knowledge_fails(owner: CognitionOwner) -> None:
    evidence = owner.knowledge.retrieve("travel insurance", limit=1)[0]
    payload = {"store": "knowledge", "status": "active", "scope": {"tenant_id": "acme", "user_id": None},
               "section": evidence.section, "path": evidence.path}
    _stray(owner, owner.memory.collection, payload, "travel insurance is 30 dollars per passenger")
    with pytest.raises(PlaneError):
        owner.memory.search(Scope("acme"), "travel insurance is 30 dollars per passenger")


def test_a_retrieval_that_meets_memory_or_tenant_data_fails(owner: CognitionOwner) -> None:
    [hit] = owner.memory.search(Scope("acme", user_id="u1"), "window seats", limit=1)
    payload = {"store": "knowledge", "status": "active", "section_id": "stray", "section": "Seats",
               "heading_path": ["Seats"], "path": "/x.md", "content_sha256": "0" * 64, "document_version": "v",
               "ingested_at": "2026-01-01T00:00:00.000Z", "scope": hit.scope}  # tenant data in the shared corpus
    _stray(owner, owner.knowledge.collection, payload, "I prefer window seats and aisle seats")
    with pytest.raises(PlaneError):
        owner.knowledge.retrieve("I prefer window seats and aisle seats", limit=10)


def test_knowledge_without_provenance_is_refused_at_query_time(owner: CognitionOwner) -> None:
    kb = owner.knowledge
    vector = kb.embedder.embed(["an unsourced claim about refunds"])[0].tolist()
    kb.client.upsert(kb.collection, points=[models.PointStruct(
        id="00000000-0000-0000-0000-000000000001", vector=vector,
        payload={"store": "knowledge", "status": "active", "section_id": "x", "section": "Refund",
                 "text": "an unsourced claim about refunds"})], wait=True)  # no path, sha256, version, ingested_at
    with pytest.raises(ProvenanceError):
        kb.retrieve("an unsourced claim about refunds", limit=20)

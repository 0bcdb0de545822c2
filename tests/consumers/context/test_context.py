"""The ContextManager: execution facts first (StateStore / ExecutionRecordStore only), then advice labelled
advisory with provenance; nothing it returns can change a recorded fact.

Real broker and Redis for the facts (published, then projected by the real projector); one embedded Qdrant
owner for memory and knowledge, read through its API as an agent process would.
"""

from __future__ import annotations

import dataclasses
import shutil
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from runjournal.consumers.cognition import CognitionOwner, open_memory_reader, open_retriever
from runjournal.consumers.context import ADVISORY_LABEL, ContextManager
from runjournal.consumers.context.execution_stores import KafkaEventStore, RedisRunStore
from runjournal.core.settings import Settings
from runjournal.deploy.procs import free_port
from runjournal.schemas import Event, EventType
from runjournal.stores import PlaneError
from runjournal.testing import HashingEmbedder
from tests.stores.test_cognition_contracts import POLICY, item
from tests.support.provider import project

pytestmark = pytest.mark.integration
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def crashed_send(run_id: str) -> list[Event]:
    """send_email intended, then the run resumed under epoch 2 without an outcome: OUTCOME_UNKNOWN."""
    def ev(seq: int, epoch: int, etype: EventType, payload: dict) -> Event:
        return Event(event_id=str(uuid.uuid4()), run_id=run_id, tenant_id="tenant-a", seq=seq, epoch=epoch,
                     producer_id="agent-a", type=etype, payload=payload, node_id="send",
                     occurred_at=T0 + timedelta(milliseconds=seq))
    tool = {"call_id": "send", "tool": "send_email", "idempotency_key": "k-send", "args_digest": "a"}
    return [ev(1, 1, EventType.RUN_STARTED, {"agent": "mailer", "input_json": "{}", "user_id": "u1"}),
            ev(2, 1, EventType.TOOL_CALL_INTENDED, {**tool, "side_effect": True, "attempt": 1, "timeout_ms": 1000,
                                                    "args_json": "{}"}),
            ev(3, 2, EventType.RUN_RESUMED, {"previous_epoch": 1, "recovered_by": "rec", "plan_json": "{}",
                                             "assigned_to": "agent-b"})]


@pytest.fixture
def wired(topics: Settings, tmp_path: Path) -> Iterator[tuple[ContextManager, CognitionOwner, RedisRunStore]]:
    KafkaEventStore(topics).append(crashed_send("mail-1"))
    project(topics)
    with CognitionOwner.open(topics, HashingEmbedder()) as owner:
        owner.memory.upsert([item("The confirmation email has been sent to bob.", tenant="tenant-a", run_id="mail-1"),
                             item("globex: the email was sent", tenant="globex", user=None, subject=None)])
        doc = tmp_path / "policy.md"
        shutil.copy(POLICY, doc)
        owner.knowledge.ingest(doc)
        runs = RedisRunStore.open(topics)
        manager = ContextManager(runs, runs, open_memory_reader(topics, embedder_factory=HashingEmbedder),
                                 open_retriever(topics, embedder_factory=HashingEmbedder))
        yield manager, owner, runs


def test_a_memory_saying_sent_stays_advice_beside_an_unknown_outcome(
        wired: tuple[ContextManager, CognitionOwner, RedisRunStore]) -> None:
    manager, _owner, runs = wired
    version = runs.version("mail-1")
    ctx = manager.build_context("mail-1", "was the confirmation email sent")
    (call,) = ctx.facts.calls
    assert (call.tool, call.status, call.effect_committed) == ("send_email", "OUTCOME_UNKNOWN", False)
    assert ctx.facts.authority == "fact" and ctx.facts.as_of == version
    said = ctx.memory[0]
    assert said.text == "The confirmation email has been sent to bob." and said.authority == "advisory"
    assert said.label == ADVISORY_LABEL and said.provenance["run_id"] == "mail-1"
    assert said.conflicts_with == ("call send (send_email) is OUTCOME_UNKNOWN in the journal",)
    assert ctx.call_status("send") == "OUTCOME_UNKNOWN"  # the record wins
    text = ctx.render()
    assert text.index("EXECUTION FACTS") < text.index("MEMORY") and "conflicts with the journal" in text
    # nothing returned can change a recorded fact
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.status = "COMMITTED"  # type: ignore[misc]
    with pytest.raises(TypeError):
        said.provenance["run_id"] = "other"  # type: ignore[index]
    assert runs.record("mail-1", "send").status.value == "OUTCOME_UNKNOWN" and runs.version("mail-1") == version
    as_dict = ctx.as_dict()
    assert list(as_dict)[:3] == ["run_id", "query", "facts"]
    assert {e["authority"] for e in as_dict["memory"] + as_dict["knowledge"]} == {"advisory"}


def test_the_memory_scope_comes_from_the_facts_and_knowledge_has_provenance(
        wired: tuple[ContextManager, CognitionOwner, RedisRunStore]) -> None:
    manager, _owner, _runs = wired
    ctx = manager.build_context("mail-1", "the email was sent")
    assert all(a.provenance.get("run_id") == "mail-1" for a in ctx.memory)  # tenant-a's, never globex's
    assert ctx.knowledge and all(a.provenance["path"].endswith("policy.md") and len(a.provenance["content_sha256"])
                                 == 64 for a in ctx.knowledge)
    unknown = manager.build_context("never-ran", "travel insurance")
    assert not unknown.facts.known and unknown.memory == () and unknown.knowledge
    assert unknown.notes == ("memory skipped: the run's tenant is not known from the journal yet",)


def test_a_context_never_takes_a_fact_from_memory_or_knowledge(
        wired: tuple[ContextManager, CognitionOwner, RedisRunStore]) -> None:
    _manager, owner, runs = wired
    with pytest.raises(PlaneError):
        ContextManager(owner.memory, runs)  # type: ignore[arg-type]
    with pytest.raises(PlaneError):
        ContextManager(runs, owner.knowledge)  # type: ignore[arg-type]
    with pytest.raises(PlaneError):
        ContextManager(runs, runs, memory=runs)  # type: ignore[arg-type]


def test_unavailable_advice_leaves_a_note_never_a_failure(topics: Settings) -> None:
    KafkaEventStore(topics).append(crashed_send("mail-2"))
    project(topics)
    dead = topics.model_copy(update={"qdrant_url": f"http://127.0.0.1:{free_port()}"})
    runs = RedisRunStore.open(topics)
    manager = ContextManager(runs, runs, open_memory_reader(dead, embedder_factory=HashingEmbedder),
                             open_retriever(dead, embedder_factory=HashingEmbedder))
    ctx = manager.build_context("mail-2", "email")
    assert ctx.facts.calls[0].status == "OUTCOME_UNKNOWN" and ctx.memory == () == ctx.knowledge
    assert [n.split(":")[0] for n in ctx.notes] == ["memory unavailable", "knowledge unavailable"]

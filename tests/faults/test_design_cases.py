"""The design's four verification cases (the seed's "how to verify" table) as named tests.

1. *Vector DB = Memory = RAG* — on one database the three contracts enforce different scope and consistency
   rules: :func:`test_design_case_1_one_qdrant_three_contracts` (here).
2. *Crash recovery relies on the transcript* — the effect succeeded, the transcript was never appended, the
   process crashed: resume still sees the action done — ``tests/consumers/recovery/test_recovery.py::
   test_crash_after_effect_before_transcript_resume_sees_it_done`` (real SIGKILL, real provider ledger).
3. *Replay re-runs production side effects* — replaying a run with ``send_email`` never raises the provider's
   call count — ``tests/consumers/ops/test_replay.py::test_replay_of_a_historical_run_containing_send_email_
   does_not_increase_the_provider_call_count``.
4. *Event log without version/schema* — an old event fixture in new code migrates or fails as unsupported —
   ``tests/schemas/test_old_events.py::test_old_event_fixture_in_new_code_migrates_or_fails_with_an_explicit_unsupported_error``.

Cases 2-4 live beside the machinery they exercise; :func:`test_design_cases_2_to_4_are_named_tests` keeps
their names from drifting away from this table.
"""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest

from runjournal.consumers.cognition import CognitionOwner
from runjournal.consumers.context import ContextManager
from runjournal.consumers.context.execution_stores import KafkaEventStore, RedisRunStore
from runjournal.core.settings import Settings
from runjournal.stores import KnowledgeScope, PlaneError, Scope, ScopeError
from runjournal.testing import HashingEmbedder
from tests.consumers.context.test_context import crashed_send
from tests.stores.test_cognition_contracts import POLICY, _stray, everything, item
from tests.support.provider import project

CASES_2_TO_4 = {
    "tests.consumers.recovery.test_recovery": "test_crash_after_effect_before_transcript_resume_sees_it_done",
    "tests.consumers.ops.test_replay":
        "test_replay_of_a_historical_run_containing_send_email_does_not_increase_the_provider_call_count",
    "tests.schemas.test_old_events":
        "test_old_event_fixture_in_new_code_migrates_or_fails_with_an_explicit_unsupported_error",
}


@pytest.mark.integration
def test_design_case_1_one_qdrant_three_contracts(topics: Settings, tmp_path: Path) -> None:
    KafkaEventStore(topics).append(crashed_send("mail-1"))
    project(topics)
    runs = RedisRunStore.open(topics)
    with CognitionOwner.open(topics, HashingEmbedder()) as owner:  # one Qdrant instance: memory + knowledge
        # Memory: a write needs an owner; a newer item supersedes the older.
        with pytest.raises(ScopeError):
            item("no owner", tenant="")
        owner.memory.upsert([item("The confirmation email has been sent.", tenant="tenant-a", at_s=1,
                                  run_id="mail-1"),
                             item("Run mail-1 SUCCEEDED; send_email COMMITTED", tenant="tenant-a", at_s=2,
                                  run_id="mail-1")])
        [active] = owner.memory.search(Scope("tenant-a", user_id="u1"), "email sent", where={"subject": "email"})
        assert active.text.startswith("Run mail-1 SUCCEEDED")
        assert owner.memory.search(Scope("other"), "email sent") == []
        # Knowledge: provenance on every evidence, shared (no tenant), read-only at query time.
        doc = tmp_path / "policy.md"
        shutil.copy(POLICY, doc)
        owner.knowledge.ingest(doc)
        before = everything(owner)
        evidence = owner.knowledge.retrieve("the email was sent", KnowledgeScope())
        assert evidence and all(e.path and e.content_sha256 and e.document_version for e in evidence)
        assert everything(owner) == before
        with pytest.raises(ScopeError):
            owner.knowledge.retrieve("email", Scope("tenant-a"))  # type: ignore[arg-type]
        # State: never read from Qdrant. Memory claims SUCCEEDED/COMMITTED; the journal's stores say otherwise.
        state = runs.get("mail-1")
        assert state.status.value == "RUNNING" and runs.record("mail-1", "send").status.value == "OUTCOME_UNKNOWN"
        ctx = ContextManager(runs, runs, owner.memory, owner.knowledge).build_context("mail-1", "was it sent")
        assert ctx.facts.status == "RUNNING" and ctx.call_status("send") == "OUTCOME_UNKNOWN"
        assert ctx.memory and all(a.authority == "advisory" for a in ctx.memory)
        # A cross-use fails the contract: a context taking facts from memory, a memory search meeting knowledge.
        with pytest.raises(PlaneError):
            ContextManager(owner.memory, runs)  # type: ignore[arg-type]
        _stray(owner, owner.memory.collection, {"store": "knowledge", "status": "active",
                                                "scope": {"tenant_id": "tenant-a", "user_id": "u1"}},
               "send_email COMMITTED per the deployment doc")
        with pytest.raises(PlaneError):
            owner.memory.search(Scope("tenant-a", user_id="u1"), "send_email COMMITTED per the deployment doc")


def test_design_cases_2_to_4_are_named_tests() -> None:
    for module, name in CASES_2_TO_4.items():
        fn = getattr(importlib.import_module(module), name, None)
        assert callable(fn), f"design case test {module}::{name} is gone"
        marks = {m.name for m in getattr(importlib.import_module(module), "pytestmark", [])}
        assert "integration" in marks, f"{module} must run on the real stack"

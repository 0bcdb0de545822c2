"""Issue 14 (f), case 8: a memory item's owner and order come from the journal itself.

Both failed on the code before issue 14: the owner came from a process-local LRU filled by RUN_STARTED (a
restarted extractor stored ``user_id=None``), and ties at the same millisecond were broken by a random event id.
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime

import pytest

from runjournal.consumers.memory import MemoryExtractor, QdrantMemoryStore, Scope
from runjournal.core.settings import Settings
from runjournal.schemas import Event, EventType
from runjournal.testing import HashingEmbedder
from tests.support.workload import publish

pytestmark = pytest.mark.integration
AT = datetime(2026, 3, 1, 12, 0, 0, 123000, tzinfo=UTC)


def _ev(run: str, seq: int, etype: EventType, payload: dict, *, user_tenant: str = "acme") -> Event:
    return Event(event_id=str(uuid.uuid4()), run_id=run, tenant_id=user_tenant, seq=seq, epoch=1,
                 producer_id="agent-1", type=etype, payload=payload, occurred_at=AT)


def _extract(settings: Settings, store: QdrantMemoryStore) -> MemoryExtractor:
    extractor = MemoryExtractor(settings, store=store, backoff_base_s=0.01, backoff_cap_s=0.05)
    extractor.run(until_caught_up=True)
    return extractor


@pytest.fixture
def store(topics: Settings) -> QdrantMemoryStore:
    s = QdrantMemoryStore.open(topics, HashingEmbedder())
    yield s
    s.close()


def test_case8_owner_survives_an_extractor_restart_between_run_started_and_message(
        topics: Settings, store: QdrantMemoryStore) -> None:
    """Old: the MESSAGE handled by an extractor that did not see RUN_STARTED was stored with user_id=None:
    invisible to u1's search, visible tenant-wide."""
    run = "owner-run"
    publish(topics, [_ev(run, 1, EventType.RUN_STARTED, {"agent": "airline", "input_json": "{}", "user_id": "u1"})])
    _extract(topics, store)  # sees RUN_STARTED, commits, stops
    publish(topics, [_ev(run, 2, EventType.MESSAGE, {"role": "user", "content": "I prefer window seats."})])
    _extract(topics, store)  # a new process: never saw RUN_STARTED (nothing projected either: the journal answers)
    hits = store.search(Scope("acme", user_id="u1"), "window seats")
    assert [h.scope["user_id"] for h in hits] == ["u1"], [h.as_dict() for h in hits]
    assert hits[0].scope["agent_id"] == "airline"


def test_case8_same_millisecond_corrections_the_later_offset_wins(topics: Settings, store: QdrantMemoryStore) -> None:
    """Old: two corrections of one subject in the same millisecond — the earlier stayed active in about half the
    tries (ties broken by a random event id). Eight independent pairs: the old code passed with p = 1/256."""
    rng = random.Random(14)
    events = []
    for i in range(8):
        run = f"tie-{i}"
        events.append(_ev(run, 1, EventType.RUN_STARTED, {"agent": "a", "input_json": "{}", "user_id": f"u{i}"}))
        for seq, text in ((2, "first: aisle"), (3, "second: window")):
            events.append(Event(event_id=str(uuid.UUID(int=rng.getrandbits(128))), run_id=run, tenant_id="acme",
                                seq=seq, epoch=1, producer_id="agent-1", type=EventType.USER_CORRECTION,
                                payload={"subject": "seat", "text": text, "user_id": f"u{i}"}, occurred_at=AT))
    publish(topics, events)
    _extract(topics, store)
    for i in range(8):
        history = store.history(Scope("acme", user_id=f"u{i}"), "seat")
        active = [h.text for h in history if h.status == "active"]
        assert active == ["second: window"], (i, [(h.text, h.status) for h in history])


def test_case8_a_write_that_would_drop_a_known_owner_is_refused(topics: Settings, store: QdrantMemoryStore) -> None:
    """A rewrite of a point without the user_id it is stored with is refused (the owner stays)."""
    from runjournal.consumers.memory import ItemKind, MemoryItem, OwnerDroppedError, Provenance

    prov = Provenance(run_id="r", event_id=str(uuid.uuid4()), event_type="MESSAGE", topic=topics.events_topic,
                      partition=0, offset=5, schema="x", extractor="rules@1")
    item = MemoryItem(text="I prefer tea", kind=ItemKind.PREFERENCE, subject="drink", scope=Scope("acme", "u1"),
                      provenance=prov, created_at=AT)
    store.upsert([item])
    with pytest.raises(OwnerDroppedError):
        store.upsert([MemoryItem(text=item.text, kind=item.kind, subject=item.subject, scope=Scope("acme"),
                                 provenance=prov, created_at=AT)])
    (hit,) = store.history(Scope("acme", user_id="u1"), "drink")
    assert hit.scope["user_id"] == "u1"

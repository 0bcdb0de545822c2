"""The memory plane without Kafka: extraction rules, scope filters, supersession, the Qdrant store
(local mode in a tmp path, test-double embedder), and the tenant-isolation property."""

from __future__ import annotations

import os
import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from qdrant_client import QdrantClient

from runjournal.consumers.memory import (
    ItemKind,
    MemoryItem,
    MemoryStore,
    Provenance,
    QdrantMemoryStore,
    Retriever,
    RuleExtractor,
    RunContexts,
    Scope,
    ScopeError,
    StoreLockedError,
    VectorSpaceError,
    scope_filter,
)
from runjournal.consumers.memory.payload import collection_name, point_id, resolve
from runjournal.core.settings import Settings
from runjournal.schemas import Event, EventType
from runjournal.testing import HashingEmbedder

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def event(etype: EventType, payload: dict, *, run_id: str = "r1", tenant: str = "acme", seq: int = 1) -> Event:
    return Event(event_id=str(uuid.uuid4()), run_id=run_id, tenant_id=tenant, seq=seq, epoch=1, producer_id="p",
                 type=etype, occurred_at=T0 + timedelta(seconds=seq), payload=payload)


def item(text: str, *, tenant: str = "acme", user: str | None = "u1", subject: str | None = None,
         at: int = 0, event_id: str | None = None, run_id: str = "r1", index: int = 0,
         metadata: dict | None = None) -> MemoryItem:
    eid = event_id or str(uuid.uuid4())
    return MemoryItem(text=text, kind=ItemKind.PREFERENCE, subject=subject, scope=Scope(tenant, user_id=user),
                      created_at=T0 + timedelta(seconds=at), metadata=metadata or {},
                      provenance=Provenance(run_id=run_id, event_id=eid, event_type="MESSAGE", topic="t",
                                            partition=0, offset=at, schema="avro-so:0", extractor="test",
                                            item_index=index, event_key=f"{run_id}:1:{at}"))


# -- extraction rules -----------------------------------------------------------------------------
RULES = [
    ("I prefer window seats", ItemKind.PREFERENCE, "seat_preference"),
    ("I now prefer aisle seats.", ItemKind.PREFERENCE, "seat_preference"),
    ("I’d like an aisle seat please", ItemKind.PREFERENCE, "seat_preference"),
    ("I'd rather fly in the morning", ItemKind.PREFERENCE, "flight_time_preference"),
    ("I don't want red-eye flights", ItemKind.CONSTRAINT, "flight_time_preference"),
    ("Please always book nonstop flights", ItemKind.CONSTRAINT, "layover_preference"),
    ("Never book Ryanair", ItemKind.CONSTRAINT, "constraint:never_book_ryanair"),
    ("I am allergic to peanuts", ItemKind.CONSTRAINT, "dietary_restriction"),
    ("I can't fly before 9am", ItemKind.CONSTRAINT, "constraint:fly_before_9am"),
    ("My home airport is SFO", ItemKind.FACT, "home_airport"),
    ("my seat preference is aisle", ItemKind.FACT, "seat_preference"),
    ("I love Lufthansa", ItemKind.PREFERENCE, "preference:lufthansa"),
]


@pytest.mark.parametrize(("text", "kind", "subject"), RULES)
def test_rules_find_stated_preferences_and_constraints(text: str, kind: ItemKind, subject: str) -> None:
    [draft] = RuleExtractor().extract(event(EventType.MESSAGE, {"role": "user", "content": text}), None)
    assert (draft.text, draft.kind, draft.subject) == (text, kind, subject)


@pytest.mark.parametrize("text", ["I'd like to book a flight to Paris", "I like it", "thanks!", "What is my seat?"])
def test_rules_ignore_requests_and_chatter(text: str) -> None:
    assert RuleExtractor().extract(event(EventType.MESSAGE, {"role": "user", "content": text}), None) == []


def test_only_user_turns_count_and_sentences_split() -> None:
    ex = RuleExtractor()
    assert ex.extract(event(EventType.MESSAGE, {"role": "assistant", "content": "I prefer window seats"}), None) == []
    turn = {"role": "user", "content": "Hi! I prefer window seats. My home airport is SFO"}
    drafts = ex.extract(event(EventType.MESSAGE, turn), None)
    assert [d.subject for d in drafts] == ["seat_preference", "home_airport"]


def test_corrections_and_run_outcomes() -> None:
    ex, runs = RuleExtractor(), RunContexts()
    runs.observe(event(EventType.RUN_STARTED, {"agent": "airline", "input_json": '{"to": "LIS"}', "user_id": "u1"}))
    [c] = ex.extract(event(EventType.USER_CORRECTION, {"subject": "Seat Preference", "text": "aisle, not window"}),
                     None)
    assert (c.kind, c.subject, c.text) == (ItemKind.CORRECTION, "seat_preference", "aisle, not window")
    failed = event(EventType.RUN_FAILED, {"error": "no seats left"}, seq=9)
    [o] = ex.extract(failed, runs.observe(failed))
    assert o.kind is ItemKind.RUN_OUTCOME and o.subject is None
    assert o.text == 'A prior run of agent airline for input {"to": "LIS"} failed: no seats left'
    assert ex.extract(event(EventType.TOOL_CALL_INTENDED, {"call_id": "c"}), None) == []


def test_run_context_lru_drops_the_least_recent() -> None:
    runs = RunContexts(max_runs=2)
    for r in ("a", "b", "c"):
        runs.observe(event(EventType.RUN_STARTED, {"agent": "x", "input_json": "{}"}, run_id=r))
    assert len(runs) == 2 and runs.observe(event(EventType.MESSAGE, {}, run_id="a")) is None


# -- scope and filters ----------------------------------------------------------------------------
@pytest.mark.parametrize("tenant", ["", "   ", None, 3])
def test_a_scope_needs_a_tenant(tenant: object) -> None:
    with pytest.raises(ScopeError):
        Scope(tenant)  # type: ignore[arg-type]


def test_every_filter_starts_with_the_tenant_and_identity_keys_cannot_be_smuggled() -> None:
    flt = scope_filter(Scope("acme", user_id="u1"), where={"subject": "seat_preference"})
    assert flt.must[0].key == "scope.tenant_id" and flt.must[0].match.value == "acme"
    for key in ("tenant_id", "scope.tenant_id", "user_id", "scope", "provenance.run_id"):
        with pytest.raises(ScopeError):
            scope_filter(Scope("acme"), where={key: "other"})
    with pytest.raises(ScopeError):
        scope_filter({"tenant_id": "acme"})  # type: ignore[arg-type]


def test_names_and_ids_are_stable() -> None:
    """Golden values: changing the id format would duplicate every point on redelivery."""
    assert collection_name("runjournal", "minilm-l6-v2-int8@8199be6f", 384) == \
        "runjournal_memory__minilm_l6_v2_int8_8199be6f_384"
    assert point_id("e1", 0) == point_id("e1", 0) != point_id("e1", 1)
    assert point_id("00000000-0000-0000-0000-000000000001", 0) == "5d79965d-5e89-5d33-adc5-34a959ca296c"


def test_resolve_is_a_function_of_the_set_not_of_the_order() -> None:
    members = {f"p{i}": {"freshness": {"created_at": f"2026-01-01T00:00:0{i}.000Z"},
                         "provenance": {"event_id": f"e{i}", "item_index": 0}} for i in range(4)}
    keys = list(members)
    expected = resolve(members)
    for _ in range(10):
        random.shuffle(keys)
        assert resolve({k: members[k] for k in keys}) == expected
    assert [expected[k]["status"] for k in sorted(expected)] == ["superseded"] * 3 + ["active"]
    assert expected["p0"]["superseded_by"] == "p1" and expected["p0"]["freshness"]["valid_until"].startswith(
        "2026-01-01T00:00:01")


def _member(created: str, partition: int, offset: int) -> dict[str, object]:
    return {"freshness": {"created_at": created},
            "provenance": {"event_id": f"e{partition}-{offset}", "partition": partition, "offset": offset,
                           "item_index": 0}}


def test_within_a_partition_the_journal_order_supersedes_not_the_writers_clock() -> None:
    """Issue 28 (one clock per decision): a correction written by a host whose clock runs 5 minutes behind, at a
    later offset of the same partition, is the newer one — it was not kept superseded by the older correction."""
    members = {"old": _member("2026-01-01T00:05:00.000Z", 2, 10),
               "new_behind": _member("2026-01-01T00:00:00.000Z", 2, 11)}
    out = resolve(members)
    assert out["new_behind"]["status"] == "active" and out["old"]["superseded_by"] == "new_behind"
    assert out["old"]["freshness"]["valid_until"] >= out["old"]["freshness"]["created_at"]


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 50), st.integers(0, 600)), min_size=1, max_size=12,
                unique_by=lambda t: (t[0], t[1])))
def test_resolve_keeps_each_partitions_journal_order_and_is_a_total_order(items: list[tuple[int, int, int]]) -> None:
    members = {f"p{part}-{off}": _member(f"2026-01-01T00:{s // 60:02d}:{s % 60:02d}.000Z", part, off)
               for part, off, s in items}
    out = resolve(members)
    (active,) = [k for k, v in out.items() if v["status"] == "active"]
    chain, seen = [], set()
    first = set(out) - {v["superseded_by"] for v in out.values()}
    (node,) = first  # one chain: a total order
    while node is not None:
        assert node not in seen
        seen.add(node)
        chain.append(node)
        node = out[node]["superseded_by"]
    assert chain[-1] == active and seen == set(out)
    rank = {k: i for i, k in enumerate(chain)}
    for a in members:
        for b in members:
            pa, pb = members[a]["provenance"], members[b]["provenance"]
            if pa["partition"] == pb["partition"] and pa["offset"] < pb["offset"]:
                assert rank[a] < rank[b], (a, b, chain)


# -- the store (local mode) -----------------------------------------------------------------------
@pytest.fixture
def store(tmp_path: Path) -> QdrantMemoryStore:
    s = QdrantMemoryStore.open(Settings(qdrant_path=tmp_path / "q", qdrant_url=None, topic_prefix="unit"),
                              HashingEmbedder())
    yield s
    s.close()


def test_ports_are_separate_and_say_nothing_about_execution(store: QdrantMemoryStore) -> None:
    assert isinstance(store, MemoryStore) and not isinstance(store, Retriever)
    surface = {n for n in dir(QdrantMemoryStore) if not n.startswith("_")}
    assert not {n for n in surface if any(w in n for w in ("state", "status", "record", "execut", "recover"))}


def test_a_newer_item_supersedes_and_history_is_kept(store: QdrantMemoryStore) -> None:
    old = item("I prefer window seats", subject="seat_preference", at=1)
    new = item("I now prefer aisle seats", subject="seat_preference", at=2)
    other_user = item("I prefer window seats", user="u2", subject="seat_preference", at=3)
    store.upsert([old])
    store.upsert([new, other_user])
    history = store.history(Scope("acme", user_id="u1"), "seat_preference")
    assert [(h.text, h.status) for h in history] == [("I prefer window seats", "superseded"),
                                                     ("I now prefer aisle seats", "active")]
    assert history[0].superseded_by == history[1].id
    assert history[0].freshness["valid_until"] == history[1].freshness["created_at"]
    assert [h.text for h in store.search(Scope("acme", user_id="u1"), "seat")] == ["I now prefer aisle seats"]
    assert len(store.search(Scope("acme", user_id="u1"), "seat", all_statuses=True)) == 2
    assert store.search(Scope("acme", user_id="u2"), "seat")[0].status == "active"
    assert store.stats(Scope("acme")) | {"collection": None} == {
        "collection": None, "mode": "local", "embedder_id": "TEST-DOUBLE-hashing@1", "dimension": 64,
        "active": 2, "superseded": 1}


def _snapshot(store: QdrantMemoryStore) -> dict[str, dict]:
    points, _ = store.client.scroll(store.collection, limit=10_000, with_payload=True)
    return {str(p.id): p.payload for p in points}


def test_rewriting_the_same_items_in_any_order_changes_nothing(store: QdrantMemoryStore) -> None:
    items = [item(f"I prefer seat {i}", subject="seat_preference", at=i) for i in range(4)]
    store.upsert(items)
    before = _snapshot(store)
    store.upsert(items[:1])  # the oldest redelivered alone must not become active again
    store.upsert(list(reversed(items)))
    assert _snapshot(store) == before
    assert [p["status"] for _, p in sorted(before.items(), key=lambda kv: kv[1]["freshness"]["created_at"])] == \
        ["superseded"] * 3 + ["active"]


def test_metadata_cannot_override_scope_and_items_need_a_tenant(store: QdrantMemoryStore) -> None:
    store.upsert([item("I prefer tea", metadata={"tenant_id": "evil", "scope": "evil", "status": "superseded"})])
    [hit] = store.search(Scope("acme"), "tea")
    assert hit.scope["tenant_id"] == "acme" and hit.status == "active"
    assert store.search(Scope("evil"), "tea") == []
    bad = item("x")
    object.__setattr__(bad, "scope", {"tenant_id": "acme"})
    with pytest.raises(ScopeError):
        store.upsert([bad])


def test_erase_by_run_reactivates_the_predecessor(store: QdrantMemoryStore) -> None:
    store.upsert([item("I prefer window seats", subject="seat_preference", at=1, run_id="r1"),
                  item("I prefer aisle seats", subject="seat_preference", at=2, run_id="r2"),
                  item("I like tea", tenant="other", run_id="r2", at=3)])
    assert store.delete_by_run("r2") == 2
    [h] = store.history(Scope("acme", user_id="u1"), "seat_preference")
    assert (h.text, h.status, h.superseded_by, h.freshness["valid_until"]) == \
        ("I prefer window seats", "active", None, None)
    assert store.search(Scope("other"), "tea") == []
    assert store.delete_by_event_key("r1:1:1") == 1 and store.stats()["active"] == 0


def test_vector_spaces_never_mix(store: QdrantMemoryStore) -> None:
    with pytest.raises(VectorSpaceError):
        store.upsert([item("x")], np.zeros((1, 384), dtype=np.float32))
    other = QdrantMemoryStore(store.client, HashingEmbedder(dimension=32), prefix="unit")
    assert other.collection != store.collection and other.collection.endswith("_32")


def test_the_local_directory_admits_one_process(store: QdrantMemoryStore, tmp_path: Path) -> None:
    with pytest.raises(StoreLockedError, match="in use by another process"):
        QdrantMemoryStore.open(Settings(qdrant_path=tmp_path / "q", qdrant_url=None), HashingEmbedder())


def test_a_long_wait_for_the_local_directory_says_what_it_waits_for(store: QdrantMemoryStore, tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Issue 35 case 5: ``memory serve`` / ``memory-extractor`` waited 34–37 s in silence on the Qdrant lock."""
    from runjournal.consumers.vectors.qdrant import open_client

    with caplog.at_level("WARNING", logger="runjournal.consumers.vectors.qdrant"), \
            pytest.raises(StoreLockedError, match="in use by another process"):
        open_client(Settings(qdrant_path=tmp_path / "q", qdrant_url=None), wait_s=2.0)
    said = [r.getMessage() for r in caplog.records if r.name == "runjournal.consumers.vectors.qdrant"]
    assert len(said) == 1 and "waiting for the local Qdrant directory" in said[0] and "of 2 s" in said[0], said


# -- isolation property -----------------------------------------------------------------------------
TENANTS = ["acme", "Acme", "acme ", "globex", "t-1", "t_1"]
WORDS = ["window", "aisle", "seat", "tea", "vegan", "flight", "hotel", "SFO", "never", "prefer"]
_item = st.tuples(st.sampled_from(TENANTS), st.sampled_from(["u1", "u2", None]),
                  st.lists(st.sampled_from(WORDS), min_size=1, max_size=5))
_query = st.tuples(st.sampled_from(TENANTS), st.sampled_from(["u1", "u2", None]),
                   st.lists(st.sampled_from(WORDS), min_size=1, max_size=4))


def _isolation_property(store: QdrantMemoryStore) -> None:
    truth: dict[str, list[tuple[str | None, str]]] = {}

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(_item, max_size=6), st.lists(_query, min_size=1, max_size=4))
    def prop(items: list, queries: list) -> None:
        batch = []
        for tenant, user, words in items:
            batch.append(item(" ".join(words), tenant=tenant, user=user))
            truth.setdefault(tenant, []).append((user, batch[-1].provenance.event_id))
        store.upsert(batch)
        for tenant, user, words in queries:
            hits = store.search(Scope(tenant, user_id=user), " ".join(words), limit=1000)
            assert all(h.scope["tenant_id"] == tenant for h in hits)
            assert all(h.scope["user_id"] == user for h in hits) if user else True
            mine = {eid for u, eid in truth.get(tenant, []) if user is None or u == user}
            assert {h.provenance["event_id"] for h in hits} == mine  # complete, not just empty

    prop()


def test_no_search_ever_returns_another_tenants_item_local(store: QdrantMemoryStore) -> None:
    _isolation_property(store)


@pytest.mark.skipif(not os.environ.get("RUNJOURNAL_QDRANT_URL"), reason="RUNJOURNAL_QDRANT_URL not set")
def test_no_search_ever_returns_another_tenants_item_server() -> None:
    client = QdrantClient(url=os.environ["RUNJOURNAL_QDRANT_URL"], check_compatibility=False)
    store = QdrantMemoryStore(client, HashingEmbedder(), prefix=f"t{uuid.uuid4().hex[:12]}")
    try:
        _isolation_property(store)
    finally:
        client.delete_collection(store.collection)
        store.close()

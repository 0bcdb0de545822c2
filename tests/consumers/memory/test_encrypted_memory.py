"""The memory extractor's key grant (issue 33, decision 0059), on the real broker and Redis with an embedded Qdrant:
without a grant encrypted content makes no memory; with one it extracts from its tenants' content and stores the
items sealed (the raw Qdrant payload holds no plain text); readers open them with the key, name the error without
it; ``erase --tenant T --subject U`` makes U's items unreadable and deletes them, another user's still read; a
tenant outside the grant makes no memory."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from runjournal.consumers.cognition import CognitionOwner, open_memory_reader
from runjournal.consumers.memory import MemoryExtractor, QdrantMemoryStore, Scope
from runjournal.consumers.memory.sealing import KeyGrant
from runjournal.consumers.ops.erase import shred_keys
from runjournal.core.crypto import is_encrypted
from runjournal.core.settings import Settings
from runjournal.producers import Journal
from runjournal.testing import HashingEmbedder

pytestmark = pytest.mark.integration


def snapshot(store: QdrantMemoryStore) -> dict[str, dict]:
    """Every point's raw payload, as Qdrant stores it."""
    if not store.client.collection_exists(store.collection):
        return {}
    points, _ = store.client.scroll(store.collection, limit=100_000, with_payload=True)
    return {str(p.id): dict(p.payload or {}) for p in points}


def reader_texts(settings: Settings, scope: Scope, *, keys: bool = True) -> list[tuple[str, str | None]]:
    """``(text, encrypted)`` of every item of ``scope``, through the memory reader every process uses."""
    reader = open_memory_reader(settings, embedder_factory=HashingEmbedder, wait_s=5.0, keys=keys)
    try:
        return sorted((h.text, h.encrypted) for h in reader.search(scope, "seats meals tea", limit=50,
                                                                    all_statuses=True))
    finally:
        reader.close()


def test_memory_of_encrypted_runs_needs_a_grant_is_sealed_and_is_shredded_with_its_subject(
        topics: Settings, tmp_path: Path) -> None:
    mark = uuid.uuid4().hex[:10]
    s = topics.model_copy(update={"encryption": "on", "keys_dir": tmp_path / "keys"})
    with Journal(s, producer_id="mem-enc") as journal:
        alice = journal.start_run("acme", "airline", {"trip": f"LIS-{mark}"}, user_id="alice")
        alice.message("user", f"I prefer window seats ALICE{mark}")
        alice.correction("meal preference", f"Vegan meals only ALICE{mark}")
        alice.succeed({"out": f"booked ALICE{mark}"})
        bob = journal.start_run("acme", "airline", {"trip": "OPO"}, user_id="bob")
        bob.message("user", f"I prefer aisle seats BOB{mark}")
        carol = journal.start_run("globex", "airline", {"trip": "FAO"}, user_id="carol")
        carol.message("user", f"I prefer green tea CAROL{mark}")
        carol.succeed({"out": f"booked CAROL{mark}"})
    store = QdrantMemoryStore.open(s, HashingEmbedder())
    try:
        # (a) no grant (the default): encrypted content makes no memory, and no token or plain text is stored
        keyless = MemoryExtractor(s, store=store, group_id=f"{s.topic_prefix}.memory.nogrant", backoff_base_s=0.01)
        assert keyless.crypto is None
        keyless.run(until_caught_up=True)
        assert snapshot(store) == {} and keyless.stats.dead_lettered == 0

        # (b) granted tenant acme: memory from its encrypted messages, corrections and outcome, stored sealed
        granted = MemoryExtractor(s, store=store, key_grant=KeyGrant.parse("acme"), backoff_base_s=0.01)
        granted.run(until_caught_up=True)
        assert granted.stats.dead_lettered == 0
        raw = snapshot(store)
        assert raw, "the granted extractor made no memory"
        assert mark not in json.dumps(raw)  # the raw payloads hold no plain text
        by_owner: dict[tuple[str, str | None], list[dict]] = {}
        for payload in raw.values():
            by_owner.setdefault((payload["scope"]["tenant_id"], payload["scope"].get("user_id")), []).append(payload)
        assert all(is_encrypted(p["text"]) for p in raw.values())
        assert {p["kind"] for p in by_owner[("acme", "alice")]} == {"preference", "correction", "run_outcome"}
        assert {p["kind"] for p in by_owner[("acme", "bob")]} == {"preference"}
        # (d) globex is outside the grant: its encrypted message made no memory
        assert ("globex", "carol") not in by_owner
    finally:
        store.close()

    # readers: opened with the key service; named error without a key
    alice_texts = reader_texts(s, Scope("acme", user_id="alice"))
    assert all(err is None for _, err in alice_texts)
    texts = [t for t, _ in alice_texts]
    assert f"I prefer window seats ALICE{mark}" in texts and f"Vegan meals only ALICE{mark}" in texts
    assert any(t.startswith("A prior run of agent airline") and f"LIS-{mark}" in t and f"booked ALICE{mark}" in t
               for t in texts)  # the outcome: input and output opened too
    assert {err for _, err in reader_texts(s, Scope("acme", user_id="alice"), keys=False)} == {"NoKeyGrant"}
    other_keys = s.model_copy(update={"keys_dir": tmp_path / "other-keys"})
    assert {(t, err) for t, err in reader_texts(other_keys, Scope("acme", user_id="bob"))} == \
        {("encrypted", "UnknownKeyError")}

    # (c) erase --subject alice: her items no longer yield text (KeyDestroyedError); bob's still read — here through
    # the read API of the process that holds the directory (as a running memory extractor does)
    with CognitionOwner.open(s, HashingEmbedder()):
        report = shred_keys(s, "acme", "alice", erase_memory=False)
        assert report.shredded[0]["destroyed"]
        assert {(t, err) for t, err in reader_texts(s, Scope("acme", user_id="alice"))} == \
            {("encrypted", "KeyDestroyedError")}
        assert reader_texts(s, Scope("acme", user_id="bob")) == [(f"I prefer aisle seats BOB{mark}", None)]
        # … and the erase deletes her points (their vectors are embeddings of her text) through the owner; bob's stay
        report = shred_keys(s, "acme", "alice", embedder=HashingEmbedder())
        assert report.deleted == [f"memory points: {len(by_owner[('acme', 'alice')])}"]
        assert report.memory_note is None
        assert reader_texts(s, Scope("acme", user_id="alice")) == []
        assert reader_texts(s, Scope("acme", user_id="bob")) == [(f"I prefer aisle seats BOB{mark}", None)]
    with QdrantMemoryStore.open(s, HashingEmbedder()) as store:
        assert {p["scope"]["user_id"] for p in snapshot(store).values()} == {"bob"}

    # redelivery to a fresh granted group after the shred: alice's content makes no memory, nothing dead-lettered
    with QdrantMemoryStore.open(s, HashingEmbedder()) as store:
        again = MemoryExtractor(s, store=store, key_grant=KeyGrant.parse("*"),
                                group_id=f"{s.topic_prefix}.memory.again", backoff_base_s=0.01)
        again.run(until_caught_up=True)
        assert again.stats.dead_lettered == 0
        owners = {(p["scope"]["tenant_id"], p["scope"]["user_id"]) for p in snapshot(store).values()}
    assert owners == {("acme", "bob"), ("globex", "carol")}  # `*` grants globex too; alice is shredded


class ErasedBeforeUpsert(QdrantMemoryStore):
    """The real store, with ``erase --tenant acme --subject dana`` run between the extractor's seal (its data key
    cached) and its upsert: the interleaving in which the erase's delete comes before the write."""

    settings: Settings
    erased = False

    def upsert(self, items, vectors):  # type: ignore[no-untyped-def]
        if not self.erased:
            self.erased = True
            report = shred_keys(self.settings, "acme", "dana", memory_store=self)
            assert report.shredded[0]["destroyed"]
        return super().upsert(items, vectors)


def test_an_erase_between_the_extractors_seal_and_its_upsert_leaves_no_point_of_the_erased_user(
        topics: Settings, tmp_path: Path) -> None:
    s = topics.model_copy(update={"encryption": "on", "keys_dir": tmp_path / "keys"})
    with Journal(s, producer_id="mem-race") as journal:
        dana = journal.start_run("acme", "airline", {"trip": "LIS"}, user_id="dana")
        dana.message("user", "I prefer window seats")
        dana.succeed({"out": "booked"})
        eve = journal.start_run("acme", "airline", {"trip": "OPO"}, user_id="eve")
        eve.message("user", "I prefer aisle seats")
    store = ErasedBeforeUpsert.open(s, HashingEmbedder())
    store.settings = s
    try:
        extractor = MemoryExtractor(s, store=store, key_grant=KeyGrant.parse("acme"), backoff_base_s=0.01)
        extractor.run(until_caught_up=True)
        assert store.erased and extractor.stats.dead_lettered == 0
        owners = {p["scope"]["user_id"] for p in snapshot(store).values()}
    finally:
        store.close()
    assert owners == {"eve"}  # dana's points (and their vectors) are gone; eve's were written


class QuotingRule:
    """A rule that fails on a message, quoting its (opened) content in the error, as a careless rule would."""

    def extract(self, event, context):  # type: ignore[no-untyped-def]
        if event.type.name == "MESSAGE":
            raise ValueError(f"cannot parse {event.payload.get('content')!r}")
        return []


def test_a_granted_extractors_dead_letter_names_the_error_class_never_the_opened_text(topics: Settings,
                                                                                      tmp_path: Path) -> None:
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    from runjournal.core import kafka

    mark = f"SECRET{uuid.uuid4().hex[:10]}"
    s = topics.model_copy(update={"encryption": "on", "keys_dir": tmp_path / "keys"})
    with Journal(s, producer_id="mem-dlq") as journal:
        run = journal.start_run("acme", "airline", {"trip": "LIS"}, user_id="fay")
        run.message("user", f"my pin is {mark}")
        run.succeed({"out": "ok"})
    store = QdrantMemoryStore.open(s, HashingEmbedder())
    try:
        extractor = MemoryExtractor(s, store=store, extractor=QuotingRule(), key_grant=KeyGrant.parse("acme"),
                                    backoff_base_s=0.01, max_attempts=1)
        extractor.run(until_caught_up=True)
        assert extractor.stats.dead_lettered == 1
    finally:
        store.close()
    consumer = kafka.consumer(s, **{"group.id": f"dlq-{uuid.uuid4()}", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(s.memory_dlq_topic, p, OFFSET_BEGINNING)
                         for p in consumer.list_topics(s.memory_dlq_topic, timeout=10).topics[s.memory_dlq_topic]
                         .partitions])
        records = [m for m in consumer.consume(100, timeout=10) if not m.error()]
    finally:
        consumer.close()
    assert len(records) == 1
    headers = {k: v.decode() for k, v in records[0].headers() or []}
    assert headers["rj.error.type"] == "ValueError" and "withheld" in headers["rj.error"]
    assert mark not in json.dumps(headers) and mark.encode() not in (records[0].value() or b"")

"""The memory extractor's key grant and sealed items without a stack (issue 33, decision 0059): which tenants it
opens, what a destroyed key or an outage does, how a sealed item is bound, and how readers open it."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from runjournal.consumers.memory import MemoryHit, MemoryItem, Provenance, Scope
from runjournal.consumers.memory.extract import RuleExtractor
from runjournal.consumers.memory.payload import point_id
from runjournal.consumers.memory.sealing import KeyGrant, MemoryCrypto, item_address, reveal_hits
from runjournal.consumers.runtime.failures import TRANSIENT, classify
from runjournal.core.crypto import (
    Binding,
    FieldCipher,
    KeyScope,
    KeyUnavailableError,
    LocalKeyDirectory,
    is_encrypted,
    parse_token,
)
from runjournal.core.settings import Settings
from runjournal.producers.encryption import ENCRYPTED, ContentCrypto
from runjournal.schemas import Event, EventType, new_event_id, utcnow


def event(etype: EventType, tenant: str = "acme", **payload: Any) -> Event:
    return Event(new_event_id(), "run-1", tenant, 2, 1, "p", etype, utcnow(), payload)


@pytest.fixture
def keys(tmp_path: Path) -> LocalKeyDirectory:
    return LocalKeyDirectory(tmp_path / "keys")


def crypto_for(keys: LocalKeyDirectory, grant: str) -> MemoryCrypto:
    content = ContentCrypto(cipher=FieldCipher(keys), encrypt=True)
    return MemoryCrypto(Settings(), KeyGrant.parse(grant), content=content)


def sealed_message(keys: LocalKeyDirectory, text: str, tenant: str = "acme", user: str = "alice") -> Event:
    writer = ContentCrypto(cipher=FieldCipher(keys))
    return writer.seal(event(EventType.MESSAGE, tenant, role="user", content=text, user_id=user), user)


def test_the_grant_parses_and_covers() -> None:
    assert not KeyGrant.parse("") and not KeyGrant.parse(" , ")
    grant = KeyGrant.parse("acme, globex")
    assert grant.covers("acme") and grant.covers("globex") and not grant.covers("initech")
    assert KeyGrant.parse("*").covers("anyone") and KeyGrant.parse("acme,*").every


def test_granted_content_is_opened_other_tenants_stay_closed(keys: LocalKeyDirectory) -> None:
    crypto = crypto_for(keys, "acme")
    opened, sealed = crypto.open_event(sealed_message(keys, "I prefer window seats"))
    assert sealed and opened.payload["content"] == "I prefer window seats"
    assert [d.text for d in RuleExtractor().extract(opened, None)] == ["I prefer window seats"]
    closed, sealed = crypto.open_event(sealed_message(keys, "I prefer tea", tenant="globex", user="carol"))
    assert sealed and is_encrypted(closed.payload["content"])
    assert RuleExtractor().extract(closed, None) == []  # outside the grant: no memory
    plain = event(EventType.MESSAGE, role="user", content="I prefer aisle seats")
    assert crypto.open_event(plain) == (plain, False)


def test_a_destroyed_key_opens_to_nothing_and_an_outage_is_transient(keys: LocalKeyDirectory) -> None:
    message = sealed_message(keys, "I prefer window seats")
    keys.destroy(KeyScope("acme", "alice").kek_id)
    opened, sealed = crypto_for(keys, "*").open_event(message)
    assert sealed and opened.payload["content"] is None  # no memory, no error, no dead letter
    assert RuleExtractor().extract(opened, None) == []
    assert classify(KeyUnavailableError("key service away")).kind == TRANSIENT  # the extractor waits on it


def item(text: str, user: str | None = "alice") -> MemoryItem:
    return MemoryItem(text=text, kind="preference", subject="seat_preference",  # type: ignore[arg-type]
                      scope=Scope("acme", user_id=user),
                      provenance=Provenance(run_id="run-1", event_id="ev-1", event_type="MESSAGE", topic="t",
                                            partition=0, offset=7, schema="x", extractor="rules@1", item_index=0),
                      created_at=datetime(2026, 1, 1, tzinfo=UTC))


def hit(stored: str, pid: str) -> MemoryHit:
    return MemoryHit(id=pid, score=1.0, text=stored, kind="preference", subject=None, status="active",
                     scope={"tenant_id": "acme", "user_id": "alice", "agent_id": None},
                     provenance={"run_id": "run-1"}, freshness={"created_at": None, "valid_until": None},
                     superseded_by=None)


def test_a_sealed_item_is_bound_to_its_point_and_opened_by_readers_with_the_key(keys: LocalKeyDirectory) -> None:
    pid = point_id("ev-1", 0)
    sealed = crypto_for(keys, "acme").seal_item(item("I prefer window seats"), pid)
    assert is_encrypted(sealed.text) and parse_token(sealed.text).kek_id == KeyScope("acme", "alice").kek_id
    assert FieldCipher(keys).decrypt(sealed.text, Binding("run-1", item_address(pid), "text")) == \
        "I prefer window seats"
    reader = ContentCrypto(cipher=FieldCipher(keys))
    assert [h.text for h in reveal_hits([hit(sealed.text, pid)], reader)] == ["I prefer window seats"]
    moved = reveal_hits([hit(sealed.text, point_id("ev-2", 0))], reader)[0]  # a token moved to another point
    assert (moved.text, moved.encrypted) == (ENCRYPTED, "CiphertextBindingError")
    keyless = reveal_hits([hit(sealed.text, pid)], None)[0]
    assert (keyless.text, keyless.encrypted) == (ENCRYPTED, "NoKeyGrant")
    assert reveal_hits([hit("rjenc:0:rjenc:literally", pid)], None)[0].text == "rjenc:literally"  # escaped plain
    keys.destroy(KeyScope("acme", "alice").kek_id)
    fresh = ContentCrypto(cipher=FieldCipher(keys))  # another process (no cached data key)
    gone = reveal_hits([hit(sealed.text, pid)], fresh)[0]
    assert (gone.text, gone.encrypted) == (ENCRYPTED, "KeyDestroyedError")
    assert dataclasses.replace(gone, encrypted=None).as_dict()["encrypted"] is None
    assert MemoryHit.from_dict(gone.as_dict()) == gone  # the read API carries the error's name

"""Issue 33 review: the memory extractor's key grant is per tenant, and a token's binding is ``(run id, address,
field)`` — no tenant in it. So an event that names a granted tenant but carries (a copy of) another tenant's token, at
the same run id and event id (any writer of the events topic can produce one), was opened under the other tenant's
key and its text became memory of the granted tenant: the grant is only as good as the tenant id it is checked
against. The extractor now opens only tokens whose key is the event's tenant's (or one of its subjects')."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from runjournal.consumers.memory.sealing import KeyGrant, MemoryCrypto
from runjournal.core.crypto import FieldCipher, LocalKeyDirectory
from runjournal.core.crypto.token import is_encrypted
from runjournal.core.settings import Settings
from runjournal.producers.encryption import ContentCrypto
from runjournal.schemas import Event, EventType, new_event_id, utcnow


def test_a_token_of_another_tenant_under_a_granted_tenant_id_is_not_opened(tmp_path: Path) -> None:
    keys = LocalKeyDirectory(tmp_path / "keys")
    victim = Event(new_event_id(), "run-b", "globex", 2, 1, "p", EventType.MESSAGE, utcnow(),
                   {"role": "user", "content": "my salary is 91k", "user_id": "bob"})
    sealed = ContentCrypto(cipher=FieldCipher(keys)).seal(victim, "bob")
    spoofed = dataclasses.replace(sealed, tenant_id="acme", payload={**sealed.payload, "user_id": "mallory"})
    extractor = MemoryCrypto(Settings(), KeyGrant.parse("acme"), content=ContentCrypto(cipher=FieldCipher(keys),
                                                                                        encrypt=True))
    assert extractor.open_event(sealed)[0].payload["content"] == sealed.payload["content"]  # globex: not granted
    opened, was_sealed = extractor.open_event(spoofed)
    assert was_sealed
    assert opened.payload["content"] is None or is_encrypted(opened.payload["content"])  # never globex's text


def test_the_granted_tenants_own_tokens_still_open(tmp_path: Path) -> None:
    keys = LocalKeyDirectory(tmp_path / "keys")
    writer = ContentCrypto(cipher=FieldCipher(keys))
    extractor = MemoryCrypto(Settings(), KeyGrant.parse("acme"), content=ContentCrypto(cipher=FieldCipher(keys),
                                                                                        encrypt=True))
    for user, own in ((None, None), ("alice", None), (None, "carol")):
        ev = Event(new_event_id(), "run-a", "acme", 2, 1, "p", EventType.MESSAGE, utcnow(),
                   {"role": "user", "content": "I prefer window seats", "user_id": own})
        opened, _ = extractor.open_event(writer.seal(ev, user))
        assert opened.payload["content"] == "I prefer window seats"

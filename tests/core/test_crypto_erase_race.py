"""Issue 33, two actors at once: an erase (``runjournal erase --subject``, another process) destroys a subject's key
while a writer process holds that subject's current data key. The writer's data key is made once per rotation
period (24 h by default): without a check it would go on sealing new content of the erased subject — and keep the
key material in memory — for up to a day, past the TTL bound the guide gives (``RUNJOURNAL_KEY_CACHE_TTL_MS``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runjournal.core.crypto import Binding, DataKeyCache, FieldCipher, KeyDestroyedError, KeyScope, LocalKeyDirectory

ALICE = KeyScope("acme", "alice")
HERE = Binding("run-1", "call:c1", "args_json")


def test_a_writer_stops_sealing_for_a_subject_erased_elsewhere_within_the_cache_ttl(tmp_path: Path) -> None:
    now = [0.0]
    writer = FieldCipher(LocalKeyDirectory(tmp_path / "keys"),
                         cache=DataKeyCache(ttl_ms=1000, clock=lambda: now[0]), clock=lambda: now[0])
    writer.encrypt("before", ALICE, HERE)
    LocalKeyDirectory(tmp_path / "keys").destroy(ALICE.kek_id)  # the erase, in another process
    now[0] = 999.0
    writer.encrypt("within the ttl", ALICE, HERE)  # the documented bound: served until the TTL passes
    now[0] = 1000.0
    with pytest.raises(KeyDestroyedError):
        writer.encrypt("after the ttl", ALICE, HERE)


def test_a_writer_stops_sealing_for_a_subject_whose_tenant_was_erased_elsewhere(tmp_path: Path) -> None:
    now = [0.0]
    writer = FieldCipher(LocalKeyDirectory(tmp_path / "keys"),
                         cache=DataKeyCache(ttl_ms=1000, clock=lambda: now[0]), clock=lambda: now[0])
    writer.encrypt("before", ALICE, HERE)
    LocalKeyDirectory(tmp_path / "keys").destroy(KeyScope("acme").kek_id)  # erase --tenant: the tenant's key first
    now[0] = 1000.0
    with pytest.raises(KeyDestroyedError):
        writer.encrypt("after the ttl", ALICE, HERE)

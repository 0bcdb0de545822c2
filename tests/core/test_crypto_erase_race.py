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


def test_a_writer_stops_using_a_data_key_whose_kek_version_was_retired_elsewhere(tmp_path: Path) -> None:
    """Rotation racing encryption in two processes: an operator rotates and retires the old version while a writer
    holds a data key wrapped by it. Tokens written with it afterwards were unreadable by everyone (KeyRetiredError)
    for up to a rotation period (24 h): content lost as it was written. Now the writer takes a new data key within
    one cache TTL."""
    now = [0.0]
    writer = FieldCipher(LocalKeyDirectory(tmp_path / "keys"),
                         cache=DataKeyCache(ttl_ms=1000, clock=lambda: now[0]), clock=lambda: now[0])
    writer.encrypt("before", ALICE, HERE)
    operator = LocalKeyDirectory(tmp_path / "keys")
    version = operator.rotate(ALICE.kek_id)
    operator.retire(ALICE.kek_id, version - 1)
    now[0] = 1000.0
    token = writer.encrypt("after the ttl", ALICE, HERE)
    assert FieldCipher(LocalKeyDirectory(tmp_path / "keys")).decrypt(token, HERE) == "after the ttl"


def test_retiring_one_cache_ttl_after_a_rotation_loses_nothing_any_writer_writes(tmp_path: Path) -> None:
    now = [0.0]
    writer = FieldCipher(LocalKeyDirectory(tmp_path / "keys"),
                         cache=DataKeyCache(ttl_ms=1000, clock=lambda: now[0]), clock=lambda: now[0])
    writer.encrypt("before", ALICE, HERE)
    operator = LocalKeyDirectory(tmp_path / "keys")
    version = operator.rotate(ALICE.kek_id)
    now[0] = 1000.0
    writer.encrypt("after the rotation", ALICE, HERE)  # the writer saw the rotation: a data key under the new one
    operator.retire(ALICE.kek_id, version - 1)
    now[0] = 1500.0
    token = writer.encrypt("after the retirement", ALICE, HERE)
    assert FieldCipher(LocalKeyDirectory(tmp_path / "keys")).decrypt(token, HERE) == "after the retirement"

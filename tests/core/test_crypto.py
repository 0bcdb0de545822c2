"""Payload encryption (issue 33, decision 0059): round trips, the binding to run/event/field, tampering, shredding,
rotation, the key directory's files and the settings. The token-vs-text rule's properties: test_crypto_props.py;
threads: test_crypto_threads.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from runjournal.core.crypto import (
    Binding,
    CiphertextBindingError,
    CiphertextTamperedError,
    DataKeyCache,
    EncryptedContentError,
    FieldCipher,
    KeyDestroyedError,
    KeyRetiredError,
    KeyScope,
    KeyUnavailableError,
    LocalKeyDirectory,
    TokenFormatError,
    UnknownKeyError,
    WrappedKey,
    cipher_from_settings,
    decode_plain,
    is_encrypted,
    kek_id_for,
    parse_token,
)
from runjournal.core.crypto.token import Token, b64e
from runjournal.core.errors import ConfigError, RunjournalError
from runjournal.core.settings import Settings

TENANT = KeyScope("acme")
ALICE = KeyScope("acme", "alice")
BOB = KeyScope("acme", "bob")
HERE = Binding("run-1", "ev-1", "args_json")
SECRET = '{"card":"4111-1111-1111-1111","note":"MARKER-7f3a"}'


@pytest.fixture
def kms(tmp_path: Path) -> LocalKeyDirectory:
    return LocalKeyDirectory(tmp_path / "keys")


@pytest.fixture
def cipher(kms: LocalKeyDirectory) -> FieldCipher:
    return FieldCipher(kms)


def fresh(kms: LocalKeyDirectory) -> FieldCipher:
    """Another process's view: the same key directory, nothing cached."""
    return FieldCipher(LocalKeyDirectory(kms.root))


@pytest.mark.parametrize("scope", [TENANT, ALICE], ids=["tenant", "subject"])
@pytest.mark.parametrize("text", [SECRET, "", "ünïcødé 🚀 \x00 line\nbreak", "rjenc:1:looks-like-a-token"])
def test_a_field_round_trips_and_its_token_shows_nothing(cipher: FieldCipher, kms: LocalKeyDirectory,
                                                         scope: KeyScope, text: str) -> None:
    token = cipher.encrypt(text, scope, HERE)
    assert is_encrypted(token) and token.isascii() and token.startswith("rjenc:1:")
    assert "MARKER" not in token and "alice" not in token and "acme" not in token
    assert parse_token(token).kek_id == scope.kek_id
    assert cipher.decrypt(token, HERE) == text
    assert fresh(kms).decrypt(token, HERE) == text  # the token carries its wrapped data key: no shared key store
    with pytest.raises(EncryptedContentError):
        decode_plain(token)  # a reader without a cipher is told it is encrypted, never handed the token as text


def test_two_encryptions_of_one_text_differ(cipher: FieldCipher) -> None:
    assert cipher.encrypt(SECRET, TENANT, HERE) != cipher.encrypt(SECRET, TENANT, HERE)


def test_plain_text_passes_through_decrypt(cipher: FieldCipher) -> None:
    """A mixed fleet: events from writers that do not encrypt read as they were written."""
    assert cipher.decrypt(SECRET, HERE) == SECRET
    assert cipher.decrypt("rjenc:0:rjenc:1:x", HERE) == "rjenc:1:x"  # escaped plain text


@pytest.mark.parametrize("elsewhere", [Binding("run-2", "ev-1", "args_json"), Binding("run-1", "ev-2", "args_json"),
                                       Binding("run-1", "ev-1", "result_json")], ids=["run", "event", "field"])
def test_a_token_moved_to_another_run_event_or_field_fails_by_name(cipher: FieldCipher, kms: LocalKeyDirectory,
                                                                   elsewhere: Binding) -> None:
    token = cipher.encrypt(SECRET, TENANT, HERE)
    for reader in (cipher, fresh(kms)):
        with pytest.raises(CiphertextBindingError) as raised:
            reader.decrypt(token, elsewhere)
        assert raised.value.expected == (elsewhere.run_id, elsewhere.event_id, elsewhere.field)


@pytest.mark.parametrize("elsewhere", [Binding("run-2", "ev-1", "args_json"), Binding("run-1", "ev-1", "error")],
                         ids=["run", "field"])
def test_the_binding_is_the_associated_data_not_only_the_hint(cipher: FieldCipher, elsewhere: Binding) -> None:
    """A forger who rewrites the clear hint to match the new place still fails: the binding is AES-GCM's
    associated data."""
    token = parse_token(cipher.encrypt(SECRET, TENANT, HERE))
    forged = Token(token.kek_id, token.version, token.dek_id, token.wrapped, elsewhere.hint(), token.nonce,
                   token.ciphertext).text()
    with pytest.raises(CiphertextTamperedError):
        cipher.decrypt(forged, elsewhere)


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


def test_tampering_with_any_part_of_a_token_fails(cipher: FieldCipher, kms: LocalKeyDirectory) -> None:
    t = parse_token(cipher.encrypt(SECRET, TENANT, HERE))
    other_dek = b64e(os.urandom(16))
    tampered = {
        "ciphertext": Token(t.kek_id, t.version, t.dek_id, t.wrapped, t.hint, t.nonce, _flip(t.ciphertext, 3)),
        "tag": Token(t.kek_id, t.version, t.dek_id, t.wrapped, t.hint, t.nonce, _flip(t.ciphertext, -1)),
        "nonce": Token(t.kek_id, t.version, t.dek_id, t.wrapped, t.hint, _flip(t.nonce, 0), t.ciphertext),
        "wrapped data key": Token(t.kek_id, t.version, t.dek_id, _flip(t.wrapped, 20), t.hint, t.nonce,
                                  t.ciphertext),
        "data key id": Token(t.kek_id, t.version, other_dek, t.wrapped, t.hint, t.nonce, t.ciphertext),
    }
    for part, token in tampered.items():
        with pytest.raises(CiphertextTamperedError):
            fresh(kms).decrypt(token.text(), HERE)
        if part != "wrapped data key":  # a cached data key is genuine for its id: the wrapped copy is not re-read
            with pytest.raises(CiphertextTamperedError):
                cipher.decrypt(token.text(), HERE)
    with pytest.raises(UnknownKeyError):  # a version that never existed
        fresh(kms).decrypt(Token(t.kek_id, 9, t.dek_id, t.wrapped, t.hint, t.nonce, t.ciphertext).text(), HERE)


@pytest.mark.parametrize(("value", "why"), [("rjenc:", "malformed"), ("rjenc:1:x", "malformed"),
                                            ("rjenc:2:k:1:a:b:c", "newer writer"), ("rjenc:1:k:1:!!:b:c", "malformed")])
def test_a_value_framed_like_a_token_that_does_not_parse_is_named(cipher: FieldCipher, value: str, why: str) -> None:
    for read in (lambda: cipher.decrypt(value, HERE), lambda: decode_plain(value)):
        with pytest.raises(TokenFormatError, match=why):
            read()


def test_shredding_a_subject_makes_every_copy_unreadable_everywhere(cipher: FieldCipher,
                                                                    kms: LocalKeyDirectory) -> None:
    bindings = [Binding(f"run-{i}", f"ev-{i}", f) for i in range(3) for f in ("input_json", "result_json", "error")]
    alice = {b: cipher.encrypt(f"{SECRET}-{b}", ALICE, b) for b in bindings}
    copies = {b: str(token) for b, token in alice.items()}  # the DLQ's, a replica's, a backup's: the same text
    bob = cipher.encrypt(SECRET, BOB, HERE)
    tenant = cipher.encrypt(SECRET, TENANT, HERE)
    assert kms.destroy(ALICE.kek_id) is True
    assert kms.destroy(ALICE.kek_id) is False  # idempotent
    cipher.forget(ALICE.kek_id)
    for reader in (cipher, fresh(kms)):
        for b in bindings:
            for token in (alice[b], copies[b]):
                with pytest.raises(KeyDestroyedError) as raised:
                    reader.decrypt(token, b)
                assert raised.value.kek_id == ALICE.kek_id
        assert reader.decrypt(bob, HERE) == SECRET  # the other subject's and the tenant's keys are untouched
        assert reader.decrypt(tenant, HERE) == SECRET
    with pytest.raises(KeyDestroyedError):
        cipher.encrypt("new content", ALICE, HERE)  # an erased subject gets no new key under its id
    assert kms.state(ALICE.kek_id).status == "destroyed"


def test_shredding_reaches_a_process_that_cached_the_key_within_its_ttl(kms: LocalKeyDirectory) -> None:
    now = [0.0]
    reader = FieldCipher(kms, cache=DataKeyCache(ttl_ms=1000, clock=lambda: now[0]))
    token = FieldCipher(kms).encrypt(SECRET, ALICE, HERE)
    assert reader.decrypt(token, HERE) == SECRET
    LocalKeyDirectory(kms.root).destroy(ALICE.kek_id)  # another process shreds
    assert reader.decrypt(token, HERE) == SECRET  # cached: readable until the TTL passes (documented bound)
    now[0] = 1000.0
    with pytest.raises(KeyDestroyedError):
        reader.decrypt(token, HERE)


def test_a_destroyed_tenant_refuses_new_subject_keys_and_lists_its_subjects(cipher: FieldCipher,
                                                                           kms: LocalKeyDirectory) -> None:
    cipher.encrypt(SECRET, ALICE, HERE)
    cipher.encrypt(SECRET, BOB, HERE)
    cipher.encrypt(SECRET, KeyScope("other", "alice"), HERE)
    assert sorted(kms.children(TENANT.kek_id)) == sorted([ALICE.kek_id, BOB.kek_id])
    kms.create(TENANT.kek_id)
    kms.destroy(TENANT.kek_id)
    with pytest.raises(KeyDestroyedError):
        fresh(kms).encrypt(SECRET, KeyScope("acme", "carol"), HERE)


def test_rotation_keeps_old_tokens_readable_until_their_version_is_retired(cipher: FieldCipher,
                                                                           kms: LocalKeyDirectory) -> None:
    old = cipher.encrypt(SECRET, ALICE, HERE)
    assert parse_token(old).version == 1
    assert kms.rotate(ALICE.kek_id) == 2
    cipher.rotate(ALICE)
    new = cipher.encrypt(SECRET, ALICE, HERE)
    assert parse_token(new).version == 2 and parse_token(new).dek_id != parse_token(old).dek_id
    assert fresh(kms).decrypt(old, HERE) == SECRET and fresh(kms).decrypt(new, HERE) == SECRET
    with pytest.raises(ValueError, match="current version"):
        kms.retire(ALICE.kek_id, 2)
    kms.retire(ALICE.kek_id, 1)
    cipher.forget(ALICE.kek_id, 1)
    for reader in (cipher, fresh(kms)):
        with pytest.raises(KeyRetiredError) as raised:
            reader.decrypt(old, HERE)
        assert raised.value.version == 1
        assert reader.decrypt(new, HERE) == SECRET
    state = kms.state(ALICE.kek_id)
    assert (state.status, state.current, state.readable, state.retired) == ("active", 2, (2,), (1,))
    assert "versions" in (kms.root / "kek" / f"{ALICE.kek_id}.json").read_text()


def test_a_writer_makes_a_new_data_key_each_rotation_period(kms: LocalKeyDirectory) -> None:
    now = [0.0]
    cipher = FieldCipher(kms, rotation_ms=1000, clock=lambda: now[0])
    first = {parse_token(cipher.encrypt("a", TENANT, HERE)).dek_id for _ in range(3)}
    now[0] = 999.0
    first |= {parse_token(cipher.encrypt("a", TENANT, HERE)).dek_id}
    now[0] = 1000.0
    second = parse_token(cipher.encrypt("a", TENANT, HERE)).dek_id
    assert len(first) == 1 and second not in first


def test_the_key_directory_keeps_keys_private_and_leaves_no_material_behind(kms: LocalKeyDirectory,
                                                                            cipher: FieldCipher) -> None:
    cipher.encrypt(SECRET, ALICE, HERE)
    key_file = kms.root / "kek" / f"{ALICE.kek_id}.json"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE((kms.root / "kek").stat().st_mode) == 0o700
    material = key_file.read_text()
    kms.destroy(ALICE.kek_id)
    names = sorted(p.name for p in (kms.root / "kek").iterdir())
    assert names == [f"{ALICE.kek_id}.destroyed"]  # no key file, no temporary file
    tomb = (kms.root / "kek" / names[0]).read_text()
    assert "versions" in tomb and material not in tomb and '"1": "' not in tomb


def test_an_interrupted_destroy_is_destroyed_for_readers_and_finished_by_the_next(kms: LocalKeyDirectory,
                                                                                  cipher: FieldCipher) -> None:
    token = cipher.encrypt(SECRET, ALICE, HERE)
    key_file = kms.root / "kek" / f"{ALICE.kek_id}.json"
    (kms.root / "kek" / f"{ALICE.kek_id}.destroyed").write_text('{"format": 1, "versions": [1]}')  # crashed here
    assert key_file.exists()
    with pytest.raises(KeyDestroyedError):
        fresh(kms).decrypt(token, HERE)  # the tombstone wins over the key file still there
    assert kms.destroy(ALICE.kek_id) is False and not key_file.exists()


def test_an_unknown_key_is_not_a_destroyed_one(kms: LocalKeyDirectory) -> None:
    other = FieldCipher(LocalKeyDirectory(kms.root.parent / "elsewhere"))
    token = other.encrypt(SECRET, ALICE, HERE)
    with pytest.raises(UnknownKeyError):
        FieldCipher(kms).decrypt(token, HERE)
    assert kms.state(kek_id_for("nobody")).status == "unknown"
    assert kms.destroy(kek_id_for("nobody")) is True  # destroyed though never made: no later create makes it
    assert kms.state(kek_id_for("nobody")).status == "destroyed" and kms.destroy(kek_id_for("nobody")) is False
    with pytest.raises(KeyDestroyedError):
        kms.create(kek_id_for("nobody"))


def test_every_crypto_error_is_a_runjournal_error() -> None:
    from runjournal.core.crypto import errors

    for name in errors.__all__:
        assert issubclass(getattr(errors, name), RunjournalError), name


def test_kek_ids_are_opaque_and_distinct_per_scope() -> None:
    ids = {kek_id_for("acme"), kek_id_for("acme", "alice"), kek_id_for("acme", "bob"), kek_id_for("other", "alice"),
           kek_id_for("acme:alice")}
    assert len(ids) == 5 and all("alice" not in i and "acme" not in i for i in ids)


def test_encryption_is_off_by_default_and_on_reads_the_key_directory(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("RUNJOURNAL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("RUNJOURNAL_STACK_DIR", str(tmp_path / "stack"))
    assert Settings.load().encryption == "off" and cipher_from_settings(Settings.load()) is None
    monkeypatch.setenv("RUNJOURNAL_ENCRYPTION", "on")
    cipher = cipher_from_settings(Settings.load())
    assert isinstance(cipher, FieldCipher) and isinstance(cipher.kms, LocalKeyDirectory)
    assert cipher.kms.root == tmp_path / "stack" / "keys"
    monkeypatch.setenv("RUNJOURNAL_KEYS_DIR", str(tmp_path / "k"))
    monkeypatch.setenv("RUNJOURNAL_KEY_CACHE_TTL_MS", "1234")
    cipher = cipher_from_settings(Settings.load())
    assert cipher is not None and isinstance(cipher.kms, LocalKeyDirectory)
    assert cipher.kms.root == tmp_path / "k" and cipher.cache.ttl_ms == 1234
    monkeypatch.setenv("RUNJOURNAL_KMS", "vault")
    with pytest.raises(ConfigError, match="RUNJOURNAL_KMS=vault"):
        cipher_from_settings(Settings.load())
    monkeypatch.setenv("RUNJOURNAL_ENCRYPTION", "yes")
    with pytest.raises(ConfigError, match="RUNJOURNAL_ENCRYPTION"):
        Settings.load()


def test_the_cache_is_bounded_by_size_and_time() -> None:
    now = [0.0]
    cache = DataKeyCache(max_entries=2, ttl_ms=100, clock=lambda: now[0])
    cache.put(("k", 1, "a"), b"A")
    cache.put(("k", 1, "b"), b"B")
    assert cache.get(("k", 1, "a")) == b"A"  # a is now the most recently used
    cache.put(("k", 2, "c"), b"C")
    assert cache.get(("k", 1, "b")) is None and len(cache) == 2
    now[0] = 100.0
    assert cache.get(("k", 1, "a")) is None
    cache.put(("k", 1, "d"), b"D")
    assert cache.forget("k", 2) == 1 and cache.get(("k", 1, "d")) == b"D" and cache.forget("k") == 1
    with pytest.raises(ValueError):
        DataKeyCache(max_entries=0)


class FlakyKeys(LocalKeyDirectory):
    """A key service that can be switched off (every call: KeyUnavailableError), counting wraps."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.down = False
        self.wraps = 0

    def wrap(self, kek_id: str, key: bytes, context: bytes) -> WrappedKey:
        if self.down:
            raise KeyUnavailableError("kms: connection refused", kek_id=kek_id)
        self.wraps += 1
        return super().wrap(kek_id, key, context)

    def create(self, kek_id: str, *, parent: str | None = None) -> int:
        if self.down:
            raise KeyUnavailableError("kms: connection refused", kek_id=kek_id)
        return super().create(kek_id, parent=parent)


def test_a_key_service_outage_at_rotation_does_not_stop_a_writer_that_holds_a_key(tmp_path: Path) -> None:
    now = [0.0]
    kms = FlakyKeys(tmp_path / "keys")
    cipher = FieldCipher(kms, rotation_ms=1000, clock=lambda: now[0])
    first = parse_token(cipher.encrypt("a", ALICE, HERE)).dek_id
    kms.down = True
    now[0] = 1500.0  # rotation due, the key service away: the current key serves on
    assert parse_token(cipher.encrypt("b", ALICE, HERE)).dek_id == first
    assert parse_token(cipher.encrypt("c", ALICE, HERE)).dek_id == first and kms.wraps == 1  # no retry within grace
    with pytest.raises(KeyUnavailableError):
        cipher.encrypt("d", BOB, HERE)  # a scope with no key yet: named, transient, nothing produced
    kms.down = False
    now[0] = 2600.0  # past the grace: rotated
    assert parse_token(cipher.encrypt("e", ALICE, HERE)).dek_id != first and kms.wraps == 2

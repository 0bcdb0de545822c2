"""Two threads on one ``FieldCipher`` (decision 0059): one data key is made per scope however many threads ask at
once, a slow key service holds up only its own scope, and every token reads back right while keys are made,
cached, evicted and forgotten around it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from runjournal.core.crypto import Binding, DataKeyCache, FieldCipher, KeyScope, LocalKeyDirectory, WrappedKey
from runjournal.core.crypto.token import parse_token


class SlowKeys(LocalKeyDirectory):
    """A key service whose wraps take 200 ms and are counted (a KMS across a network)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.wraps: list[str] = []
        self._count = threading.Lock()

    def wrap(self, kek_id: str, key: bytes, context: bytes) -> WrappedKey:
        with self._count:
            self.wraps.append(kek_id)
        time.sleep(0.2)
        return super().wrap(kek_id, key, context)


def _together(n: int, work: object) -> list[object]:
    barrier = threading.Barrier(n)
    out: list[object] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            out[i] = work(i)  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    return out


def test_two_threads_asking_at_once_share_one_new_data_key(tmp_path: Path) -> None:
    kms = SlowKeys(tmp_path / "keys")
    cipher = FieldCipher(kms)
    scope = KeyScope("acme", "alice")
    tokens = _together(2, lambda i: cipher.encrypt(f"text-{i}", scope, Binding("r", f"e{i}", "content")))
    assert kms.wraps == [scope.kek_id]  # one wrap: the second thread waited for the first one's key
    assert len({parse_token(str(t)).dek_id for t in tokens}) == 1
    for i, token in enumerate(tokens):
        assert cipher.decrypt(str(token), Binding("r", f"e{i}", "content")) == f"text-{i}"


def test_a_slow_key_service_holds_up_only_its_own_scope(tmp_path: Path) -> None:
    kms = SlowKeys(tmp_path / "keys")
    cipher = FieldCipher(kms)
    cipher.encrypt("warm", KeyScope("fast"), Binding("r", "e", "content"))
    started = time.monotonic()
    took = _together(2, lambda i: (cipher.encrypt("x", KeyScope("slow") if i == 0 else KeyScope("fast"),
                                                  Binding("r", "e", "content")), time.monotonic() - started)[1])
    assert float(str(took[1])) < 0.15 <= float(str(took[0]))  # the warm scope did not wait for the cold one's wrap


def test_two_threads_encrypt_and_decrypt_through_one_small_cache(tmp_path: Path) -> None:
    kms = LocalKeyDirectory(tmp_path / "keys")
    cipher = FieldCipher(kms, cache=DataKeyCache(max_entries=2, ttl_ms=50))  # evicting and expiring all along
    scopes = [KeyScope("acme", f"user-{k}") for k in range(4)]

    def work(i: int) -> int:
        done = 0
        for n in range(150):
            scope = scopes[(n + i) % len(scopes)]
            binding = Binding(f"run-{i}", f"ev-{n}", "content")
            token = cipher.encrypt(f"{i}:{n}", scope, binding)
            if n % 10 == 0:
                cipher.forget(scope.kek_id)  # what an erase in this process does, racing the other thread
            assert cipher.decrypt(token, binding) == f"{i}:{n}"
            done += 1
        return done

    assert _together(2, work) == [150, 150]
    assert len(cipher.cache) <= 2


def test_an_erase_racing_a_subjects_first_write_leaves_no_readable_token(tmp_path: Path) -> None:
    """An erase that finds no key yet still refuses the key for good: whatever order the destroy and a writer's
    first data key take, no token of the erased subject written by it reads afterwards (two processes' threads)."""
    from runjournal.core.crypto import KeyDestroyedError

    for round_ in range(40):
        keys = LocalKeyDirectory(tmp_path / f"keys-{round_}")
        subject = KeyScope("acme", f"zed-{round_}")
        here = Binding("run-1", "run", "input_json")
        writer = FieldCipher(LocalKeyDirectory(keys.root))  # another process's view of the same directory

        def act(i: int, writer: FieldCipher = writer, subject: KeyScope = subject, here: Binding = here,
                keys: LocalKeyDirectory = keys) -> str | None:
            if i == 0:
                keys.destroy(subject.kek_id)
                return None
            try:
                return writer.encrypt("secret", subject, here)
            except KeyDestroyedError:
                return None  # refused before anything was written: nothing to erase

        token = _together(2, act)[1]
        reader = FieldCipher(LocalKeyDirectory(keys.root))
        if token is not None:
            try:
                assert reader.decrypt(str(token), here) is None, "unreachable"
            except KeyDestroyedError:
                pass  # written before the destroy, unreadable after it
        assert keys.state(subject.kek_id).status == "destroyed"


def test_erasing_a_tenant_that_has_only_user_keys_refuses_new_users_of_it(tmp_path: Path) -> None:
    from runjournal.core.crypto import KeyDestroyedError

    keys = LocalKeyDirectory(tmp_path / "keys")
    cipher = FieldCipher(keys)
    here = Binding("run-1", "run", "input_json")
    cipher.encrypt("x", KeyScope("acme", "amy"), here)  # a user key; the tenant's own key was never made
    assert keys.destroy(KeyScope("acme").kek_id) is True
    for kek in keys.children(KeyScope("acme").kek_id):
        keys.destroy(kek)
    try:
        FieldCipher(LocalKeyDirectory(keys.root)).encrypt("y", KeyScope("acme", "new-user"), here)
        raise AssertionError("a new user of an erased tenant got a key")
    except KeyDestroyedError:
        pass


def test_two_erases_of_one_tenant_at_once_destroy_each_key_once(tmp_path: Path) -> None:
    """Two operators erase one tenant at once (two key-directory handles, as two processes have): every key ends
    destroyed, and each is reported destroyed by exactly one of them."""
    from runjournal.consumers.ops.erase import shred_keys
    from runjournal.core.settings import Settings

    root = tmp_path / "keys"
    cipher = FieldCipher(LocalKeyDirectory(root))
    users = [f"user-{i}" for i in range(12)]
    for user in users:
        cipher.encrypt("x", KeyScope("acme", user), Binding("r", "run", "input_json"))
    settings = Settings(keys_dir=root)
    reports = _together(2, lambda i: shred_keys(settings, "acme", kms=LocalKeyDirectory(root)))
    claimed: dict[str, int] = {}
    for report in reports:
        for key in report.shredded:  # type: ignore[attr-defined]
            claimed[key["kek_id"]] = claimed.get(key["kek_id"], 0) + int(key["destroyed"])
    expected = {KeyScope("acme").kek_id, *(KeyScope("acme", u).kek_id for u in users)}
    assert set(claimed) == expected and set(claimed.values()) == {1}
    keys = LocalKeyDirectory(root)
    assert {keys.state(k).status for k in expected} == {"destroyed"}

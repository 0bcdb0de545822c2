"""The default key service: a local key directory, one file per key-encryption key (decision 0059).

Layout under the directory (``RUNJOURNAL_KEYS_DIR``, default ``<stack dir>/keys``; created ``0700``)::

    kek/<kek id>.json        the key's versions (``0600``): {"format", "kek_id", "parent", "current", "versions",
                             "retired"}; a retired version's material is gone from it
    kek/<kek id>.destroyed   the tombstone of a destroyed key: its id and versions, no material
    .lock                    flock: writers exclusive, readers shared (no torn read of a key file)

Every write goes to a temporary file (``0600``, fsync) renamed over the key file; the file it replaces is then
overwritten through a descriptor held across the rename, so a retired version's or destroyed key's bytes do not
linger in the directory. Destroying a key writes its tombstone first, then overwrites and removes the key file (and
any temporary file of it): a crash in between leaves the tombstone, which wins, and ``destroy`` again finishes. A
reader of a destroyed key gets :class:`KeyDestroyedError`, never "unknown key".

Overwriting is best effort on the medium: copy-on-write file systems, SSD wear levelling and backups of the
directory keep old blocks. Back the directory up only where its deletion reaches the backups, or use a KMS
(docs/guide/encryption.md).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from runjournal.core.crypto.errors import (
    CiphertextTamperedError,
    KeyDestroyedError,
    KeyRetiredError,
    KeyUnavailableError,
    UnknownKeyError,
)
from runjournal.core.crypto.keys import KeyState, WrappedKey
from runjournal.core.crypto.token import b64d, b64e, frame_parts

__all__ = ["LocalKeyDirectory"]

_FORMAT = 1
_KEK_BYTES = 32
_NONCE = 12


def _check_id(kek_id: str) -> str:
    if not kek_id or len(kek_id) > 64 or not all(c.isascii() and (c.isalnum() or c in "-_") for c in kek_id):
        raise ValueError(f"a KEK id is 1-64 of [A-Za-z0-9_-], not {kek_id!r}")
    return kek_id


class LocalKeyDirectory:
    """:class:`~runjournal.core.crypto.keys.KeyManagementService` over a local directory (see the module text).

    Safe for threads and processes sharing the directory (an exclusive flock around every change).

    Args:
        root: the key directory (created ``0700`` when missing).

    Raises:
        KeyUnavailableError: from any method, when the directory cannot be read or written for a reason other than
            permissions (a full disk, an I/O error).
    """

    name = "local"

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self._kek = self.root / "kek"

    # -- files --------------------------------------------------------------------------------------------------
    def _path(self, kek_id: str) -> Path:
        return self._kek / f"{_check_id(kek_id)}.json"

    def _tomb(self, kek_id: str) -> Path:
        return self._kek / f"{_check_id(kek_id)}.destroyed"

    @contextlib.contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        try:
            self._kek.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise self._os_error(exc, None) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _os_error(self, exc: OSError, kek_id: str | None) -> UnknownKeyError | KeyUnavailableError:
        if exc.errno in (errno.EACCES, errno.EPERM):
            return UnknownKeyError(f"no access to the key directory {self.root} ({exc.strerror})", kek_id=kek_id)
        return KeyUnavailableError(f"key directory {self.root}: {exc}", kek_id=kek_id)

    def _load(self, kek_id: str) -> dict[str, Any]:
        """The key file's content (under a lock held by the caller)."""
        try:
            if self._tomb(kek_id).exists():
                raise KeyDestroyedError(f"key {kek_id} was destroyed", kek_id=kek_id)
            data: dict[str, Any] = json.loads(self._path(kek_id).read_bytes())
        except FileNotFoundError:
            raise UnknownKeyError(f"no key {kek_id} in {self.root}", kek_id=kek_id) from None
        except OSError as exc:
            raise self._os_error(exc, kek_id) from exc
        except ValueError as exc:  # the lock keeps writers out: a file that does not parse was damaged
            raise KeyUnavailableError(f"key file of {kek_id} in {self.root} does not parse: {exc}",
                                      kek_id=kek_id) from exc
        if data.get("format") != _FORMAT:
            raise KeyUnavailableError(f"key file of {kek_id}: format {data.get('format')!r} is not {_FORMAT}",
                                      kek_id=kek_id)
        return data

    def _write(self, path: Path, data: dict[str, Any]) -> None:
        """Atomically replace ``path`` with ``data`` (0600), overwriting the old file's bytes first."""
        raw = json.dumps(data, sort_keys=True).encode()
        tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}.{secrets.token_hex(4)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, raw)
                os.fsync(fd)
            finally:
                os.close(fd)
            try:  # held open across the rename: its bytes are overwritten once the new file is in place, so a
                old = os.open(path, os.O_WRONLY)  # crash never leaves neither
            except FileNotFoundError:
                old = None
            try:
                os.replace(tmp, path)
                _fsync_dir(path.parent)
                if old is not None:
                    _overwrite(old)
            finally:
                if old is not None:
                    os.close(old)
        except OSError as exc:
            with contextlib.suppress(OSError):
                _shred(tmp, unlink=True)
            raise self._os_error(exc, None) from exc

    # -- the service ----------------------------------------------------------------------------------------------
    def create(self, kek_id: str, *, parent: str | None = None) -> int:
        """See :meth:`KeyManagementService.create`."""
        with self._locked(exclusive=True):
            try:
                return int(self._load(kek_id)["current"])
            except UnknownKeyError:
                pass
            self._write(self._path(kek_id), {"format": _FORMAT, "kek_id": kek_id, "parent": parent, "current": 1,
                                             "versions": {"1": b64e(secrets.token_bytes(_KEK_BYTES))}, "retired": []})
            return 1

    def wrap(self, kek_id: str, key: bytes, context: bytes) -> WrappedKey:
        """See :meth:`KeyManagementService.wrap`."""
        with self._locked(exclusive=False):
            data = self._load(kek_id)
        version = int(data["current"])
        nonce = secrets.token_bytes(_NONCE)
        kek = AESGCM(b64d(data["versions"][str(version)]))
        return WrappedKey(kek_id, version, nonce + kek.encrypt(nonce, key, _wrap_aad(kek_id, version, context)))

    def unwrap(self, kek_id: str, version: int, blob: bytes, context: bytes) -> bytes:
        """See :meth:`KeyManagementService.unwrap`."""
        with self._locked(exclusive=False):
            data = self._load(kek_id)
        if version in data["retired"]:
            raise KeyRetiredError(f"version {version} of key {kek_id} was retired", kek_id=kek_id, version=version)
        material = data["versions"].get(str(version))
        if material is None:
            raise UnknownKeyError(f"key {kek_id} has no version {version}", kek_id=kek_id, version=version)
        try:
            return AESGCM(b64d(material)).decrypt(blob[:_NONCE], blob[_NONCE:], _wrap_aad(kek_id, version, context))
        except (InvalidTag, ValueError) as exc:
            raise CiphertextTamperedError(f"the data key wrapped by {kek_id} v{version} does not authenticate",
                                          kek_id=kek_id, version=version) from exc

    def rotate(self, kek_id: str) -> int:
        """See :meth:`KeyManagementService.rotate`."""
        with self._locked(exclusive=True):
            data = self._load(kek_id)
            version = max(int(v) for v in data["versions"]) + 1
            data["versions"][str(version)] = b64e(secrets.token_bytes(_KEK_BYTES))
            data["current"] = version
            self._write(self._path(kek_id), data)
            return version

    def retire(self, kek_id: str, version: int) -> None:
        """See :meth:`KeyManagementService.retire`."""
        with self._locked(exclusive=True):
            data = self._load(kek_id)
            if version == data["current"]:
                raise ValueError(f"version {version} is key {kek_id}'s current version: rotate before retiring it")
            if str(version) not in data["versions"]:
                raise UnknownKeyError(f"key {kek_id} has no version {version}", kek_id=kek_id, version=version)
            data["versions"][str(version)] = None
            data["retired"] = sorted({*data["retired"], version})
            self._write(self._path(kek_id), data)

    def destroy(self, kek_id: str) -> bool:
        """See :meth:`KeyManagementService.destroy`: tombstone first (for a key never made too), then the key file
        overwritten and removed."""
        path, tomb = self._path(kek_id), self._tomb(kek_id)
        with self._locked(exclusive=True):
            try:
                versions: list[int] = []
                if not tomb.exists():  # also for a key never made: a writer's first run racing the erase, or any
                    if path.exists():  # later one, must not make it afterwards (create finds the tombstone)
                        with contextlib.suppress(ValueError, KeyUnavailableError):
                            versions = sorted(int(v) for v in self._load(kek_id)["versions"])
                    self._write(tomb, {"format": _FORMAT, "kek_id": kek_id, "versions": versions})
                    done = True
                else:
                    done = False
                for leftover in [path, *path.parent.glob(f"{path.name}.tmp.*")]:
                    _shred(leftover, unlink=True)
                _fsync_dir(path.parent)
                return done
            except OSError as exc:
                raise self._os_error(exc, kek_id) from exc

    def state(self, kek_id: str) -> KeyState:
        """See :meth:`KeyManagementService.state`."""
        with self._locked(exclusive=False):
            try:
                data = self._load(kek_id)
            except KeyDestroyedError:
                return KeyState(kek_id, "destroyed", None, (), ())
            except UnknownKeyError:
                return KeyState(kek_id, "unknown", None, (), ())
        readable = tuple(sorted(int(v) for v, m in data["versions"].items() if m is not None))
        return KeyState(kek_id, "active", int(data["current"]), readable, tuple(data["retired"]), data.get("parent"))

    def children(self, parent: str) -> list[str]:
        """See :meth:`KeyManagementService.children`."""
        out = []
        with self._locked(exclusive=False):
            for path in sorted(self._kek.glob("*.json")):
                kek_id = path.name.removesuffix(".json")
                with contextlib.suppress(UnknownKeyError, KeyDestroyedError, KeyUnavailableError):
                    if self._load(kek_id).get("parent") == parent:
                        out.append(kek_id)
        return out


def _wrap_aad(kek_id: str, version: int, context: bytes) -> bytes:
    return frame_parts("rjwrap:1", kek_id, str(version)) + context


def _shred(path: Path, *, unlink: bool = False) -> None:
    """Overwrite ``path``'s bytes with random ones and fsync (missing: nothing); then remove it when ``unlink``."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        return
    try:
        _overwrite(fd)
    finally:
        os.close(fd)
    if unlink:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _overwrite(fd: int) -> None:
    """Overwrite the whole open file ``fd`` with random bytes and fsync it."""
    size = os.fstat(fd).st_size
    if size:
        os.pwrite(fd, secrets.token_bytes(size), 0)
        os.fsync(fd)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

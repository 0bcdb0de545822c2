"""Field encryption: AES-256-GCM under data keys wrapped by a scope's key-encryption key (decision 0059).

:class:`FieldCipher` turns one content field's text into a token (``runjournal.core.crypto.token``) and back. A
token is bound to its run, event and field (associated data); its data key is one of the scope's, made per rotation
period and wrapped by the scope's KEK through a :class:`~runjournal.core.crypto.keys.KeyManagementService`.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from runjournal.core.crypto.cache import DataKeyCache
from runjournal.core.crypto.errors import (
    CiphertextBindingError,
    CiphertextTamperedError,
    KeyDestroyedError,
    KeyUnavailableError,
)
from runjournal.core.crypto.keys import KeyManagementService, KeyScope, WrappedKey
from runjournal.core.crypto.token import (
    DEK_ID_BYTES,
    NONCE_BYTES,
    TOKEN_V1,
    Binding,
    Token,
    b64e,
    decode_plain,
    frame_parts,
    is_encrypted,
    parse_token,
)
from runjournal.core.errors import ConfigError

if TYPE_CHECKING:
    from runjournal.core.settings import Settings

__all__ = ["FieldCipher", "cipher_from_settings", "kms_from_settings"]

MAX_USES = 2**30
"""Most encryptions under one data key (random 96-bit nonces: far below the 2^32 NIST bound)."""
GRACE_RETRY_MS = 1000.0
"""After the key service failed a due rotation, how long the current data key serves before it is tried again."""

log = logging.getLogger("runjournal.crypto")


def _dek_context(dek_id: str) -> bytes:
    return frame_parts("rjdek:1", dek_id)


@dataclass
class _DataKey:
    dek_id: str
    aead: AESGCM
    wrapped: WrappedKey
    born_ms: float
    uses: int = 0
    header: str = ""
    """The token's text up to its body (``rjenc:1:<kek>:<version>:<dek id>:<wrapped>:``), made once per key."""
    checked_ms: float = 0.0
    """When (monotonic ms) its KEK, and its tenant's, were last seen not destroyed (made: when the key was made)."""


class FieldCipher:
    """Encrypts and decrypts content fields. Safe to share between threads (one data key is made per scope and
    period however many threads ask at once; the KMS is not called under a global lock).

    Args:
        kms: the key service.
        cache: unwrapped data keys (default: 1024 keys, 5 min).
        rotation_ms: a scope's data key is replaced after this long in this process, ms (monotonic clock; nothing
            is ordered by it, so hosts' clocks never meet). Also replaced after :data:`MAX_USES` encryptions. When
            the key service does not answer at a due rotation the current key serves on (tried again every
            :data:`GRACE_RETRY_MS`): an outage never stops a writer that holds a data key, e.g. from recording an
            effect's outcome.
        clock: monotonic milliseconds (tests).
    """

    def __init__(self, kms: KeyManagementService, *, cache: DataKeyCache | None = None,
                 rotation_ms: int = 86_400_000, clock: Callable[[], float] | None = None) -> None:
        self.kms = kms
        self.cache = cache if cache is not None else DataKeyCache()
        self.rotation_ms = rotation_ms
        self._clock = clock or (lambda: time.monotonic() * 1000.0)
        self._lock = threading.Lock()
        self._scope_locks: dict[str, threading.Lock] = {}
        self._current: dict[str, _DataKey] = {}
        self._grace_until: dict[str, float] = {}
        """kek id → until when (monotonic ms) a due rotation is not tried again after the key service failed it."""

    # -- writing ------------------------------------------------------------------------------------------------
    def encrypt(self, text: str, scope: KeyScope, binding: Binding) -> str:
        """The token of ``text`` under ``scope``'s current data key, bound to ``binding``.

        Raises:
            KeyDestroyedError: the scope's KEK (or, for a subject, its tenant's) was destroyed: nothing is written
                for an erased scope.
            KeyUnavailableError: the key service did not answer and this process holds no data key of the scope
                (transient; nothing was produced).
        """
        key = self._data_key(scope)
        nonce = secrets.token_bytes(NONCE_BYTES)
        aad = binding.aad(key.wrapped.kek_id, key.wrapped.version, key.dek_id)
        ciphertext = key.aead.encrypt(nonce, text.encode("utf-8"), aad)
        return key.header + b64e(binding.hint() + nonce + ciphertext)  # = Token(…).text(), its header made once

    def _data_key(self, scope: KeyScope) -> _DataKey:
        kek_id = scope.kek_id
        with self._lock:
            key = self._fresh(kek_id)
            if key is not None and not self._check_due(key):
                key.uses += 1
                return key
            scope_lock = self._scope_locks.setdefault(kek_id, threading.Lock())
        with scope_lock:  # one thread makes the scope's key; the others wait for it, other scopes do not
            with self._lock:
                key = self._fresh(kek_id)
                if key is not None and not self._check_due(key):
                    key.uses += 1
                    return key
            if key is not None:  # fresh, but its KEK not looked at for a cache TTL: an erase elsewhere ends it
                checked = self._checked(scope, key)
                if checked is not None:
                    return checked
            try:
                key = self._new_data_key(scope)
            except KeyUnavailableError as exc:
                with self._lock:  # a KMS outage at rotation: the scope's current key serves on (bounded by uses)
                    key = self._current.get(kek_id)
                    if key is None or key.uses >= MAX_USES:
                        raise
                    key.uses += 1
                    self._grace_until[kek_id] = self._clock() + GRACE_RETRY_MS
                log.warning("key service unavailable rotating the data key of %s (%s): the current one serves on",
                            kek_id, exc)
                return key
            with self._lock:
                key.uses += 1
                self._current[kek_id] = key
                self._grace_until.pop(kek_id, None)
            return key

    def _check_due(self, key: _DataKey) -> bool:
        """True when ``key``'s KEK was last seen not destroyed a cache TTL ago or more (under ``self._lock``)."""
        return self._clock() - key.checked_ms >= self.cache.ttl_ms

    def _checked(self, scope: KeyScope, key: _DataKey) -> _DataKey | None:
        """``key`` (one use counted) once its KEK and its tenant's are seen not destroyed — so a writer that holds a
        subject's data key stops sealing for it within one cache TTL of an erase in another process, as a reader
        stops reading (decision 0059) — or None when the KEK was rotated, or the version that wraps the key retired,
        in another process meanwhile (tokens under a retired version would be unreadable as they are written), so the
        caller makes a new data key under the current version. The key service away: the key serves on, looked at
        again in a second.

        Raises:
            KeyDestroyedError: the scope's KEK or its tenant's was destroyed; this process forgets the scope's keys.
        """
        try:
            states = [self.kms.state(kek) for kek in (scope.kek_id, scope.parent_kek_id) if kek is not None]
            destroyed = next((state.kek_id for state in states if state.status == "destroyed"), None)
        except KeyUnavailableError as exc:
            log.warning("key service unavailable checking the key of %s (%s): its data key serves on", scope.kek_id,
                        exc)
            with self._lock:
                key.checked_ms = self._clock() - self.cache.ttl_ms + GRACE_RETRY_MS
                key.uses += 1
            return key
        if destroyed is not None:
            self.forget(scope.kek_id)
            raise KeyDestroyedError(f"the key {destroyed} was destroyed (an erase): nothing more is sealed for "
                                    f"{scope.kek_id}", kek_id=destroyed)
        if key.wrapped.version in states[0].retired or (states[0].current or 0) > key.wrapped.version:
            with self._lock:
                if self._current.get(scope.kek_id) is key:
                    del self._current[scope.kek_id]  # not served on even through an outage: it would lose content
            return None
        with self._lock:
            key.checked_ms = self._clock()
            key.uses += 1
        return key

    def _fresh(self, kek_id: str) -> _DataKey | None:
        key = self._current.get(kek_id)
        if key is None or key.uses >= MAX_USES:
            return None
        now = self._clock()
        if now - key.born_ms >= self.rotation_ms and now >= self._grace_until.get(kek_id, 0.0):
            return None
        return key

    def _new_data_key(self, scope: KeyScope) -> _DataKey:
        parent = scope.parent_kek_id
        if parent is not None and self.kms.state(parent).status == "destroyed":
            raise KeyDestroyedError(f"the tenant's key {parent} was destroyed: no key for its subjects",
                                    kek_id=parent)
        self.kms.create(scope.kek_id, parent=parent)
        if parent is not None and self.kms.state(parent).status == "destroyed":  # the tenant was shredded meanwhile:
            raise KeyDestroyedError(f"the tenant's key {parent} was destroyed: no key for its subjects",  # its erase
                                    kek_id=parent)  # lists children again after destroying it (shred_keys)
        material = AESGCM.generate_key(bit_length=256)
        dek_id = b64e(secrets.token_bytes(DEK_ID_BYTES))
        wrapped = self.kms.wrap(scope.kek_id, material, _dek_context(dek_id))
        self.cache.put((wrapped.kek_id, wrapped.version, dek_id), material)
        header = f"{TOKEN_V1}{wrapped.kek_id}:{wrapped.version}:{dek_id}:{b64e(wrapped.blob)}:"
        born = self._clock()
        return _DataKey(dek_id, AESGCM(material), wrapped, born, header=header, checked_ms=born)

    def rotate(self, scope: KeyScope) -> None:
        """The next :meth:`encrypt` for ``scope`` makes a new data key (wrapped by the KEK's newest version: call
        after ``kms.rotate``). Tokens already written stay readable."""
        with self._lock:
            self._current.pop(scope.kek_id, None)

    def forget(self, kek_id: str, version: int | None = None) -> None:
        """Drop this process's data keys of ``kek_id`` (of one version when given): after a destroy or a retire, so
        this process reads what every other process will once its cache's TTL has passed."""
        with self._lock:
            key = self._current.get(kek_id)
            if key is not None and (version is None or key.wrapped.version == version):
                del self._current[kek_id]
        self.cache.forget(kek_id, version)

    # -- reading ------------------------------------------------------------------------------------------------
    def decrypt(self, value: str, binding: Binding) -> str:
        """The plain text of a stored value: a token decrypted, plain text (escaped or not) as it was written.

        Raises:
            CiphertextBindingError: the token was made for another run, event or field.
            CiphertextTamperedError: it does not authenticate.
            KeyDestroyedError, KeyRetiredError, UnknownKeyError: its key cannot be had.
            TokenFormatError: it starts with ``rjenc:`` but does not parse.
            KeyUnavailableError: the key service did not answer (transient).
        """
        if not is_encrypted(value):
            return decode_plain(value)
        token = parse_token(value)
        if not secrets.compare_digest(token.hint, binding.hint()):
            raise CiphertextBindingError(
                f"the token was made for another run, event or field than run {binding.run_id!r}, event "
                f"{binding.event_id!r}, field {binding.field!r}", expected=(binding.run_id, binding.event_id,
                                                                            binding.field),
                kek_id=token.kek_id, version=token.version)
        material = self._unwrap(token)
        try:
            plain = AESGCM(material).decrypt(token.nonce, token.ciphertext,
                                             binding.aad(token.kek_id, token.version, token.dek_id))
        except InvalidTag as exc:
            raise CiphertextTamperedError(f"the token under key {token.kek_id} v{token.version} does not "
                                          "authenticate (altered)", kek_id=token.kek_id,
                                          version=token.version) from exc
        return plain.decode("utf-8")

    def _unwrap(self, token: Token) -> bytes:
        cache_key = (token.kek_id, token.version, token.dek_id)
        material = self.cache.get(cache_key)
        if material is None:
            material = self.kms.unwrap(token.kek_id, token.version, token.wrapped, _dek_context(token.dek_id))
            self.cache.put(cache_key, material)
        return material


def kms_from_settings(settings: Settings) -> KeyManagementService:
    """The key service ``RUNJOURNAL_KMS`` names: ``local`` — :class:`LocalKeyDirectory` at ``RUNJOURNAL_KEYS_DIR``
    (default ``<stack dir>/keys``).

    Raises:
        ConfigError: ``aws`` or ``vault``, documented (docs/guide/encryption.md) but not built in this release.
    """
    if settings.kms == "local":
        from runjournal.core.crypto.local import LocalKeyDirectory

        return LocalKeyDirectory(settings.effective_keys_dir)
    raise ConfigError(f"RUNJOURNAL_KMS={settings.kms}: planned, not built in this release (docs/guide/encryption.md "
                      "describes its configuration); use RUNJOURNAL_KMS=local")


def cipher_from_settings(settings: Settings) -> FieldCipher | None:
    """A :class:`FieldCipher` when ``RUNJOURNAL_ENCRYPTION=on`` (its key service, cache bounds and rotation period
    from the settings), else None.

    Raises:
        ConfigError: see :func:`kms_from_settings`.
    """
    if settings.encryption != "on":
        return None
    cache = DataKeyCache(settings.key_cache_size, settings.key_cache_ttl_ms)
    return FieldCipher(kms_from_settings(settings), cache=cache, rotation_ms=settings.data_key_rotation_ms)

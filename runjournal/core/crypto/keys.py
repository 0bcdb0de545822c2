"""The key hierarchy and the key service's interface (decision 0059).

* A **key-encryption key** (KEK) per tenant and, optionally, per subject (a user) of a tenant: it never leaves the key
  service, which wraps and unwraps data keys with it. Its id (:func:`kek_id_for`) is an opaque digest of the scope.
  A KEK has versions: :meth:`KeyManagementService.rotate` adds one (new data keys are wrapped by the newest),
  :meth:`~KeyManagementService.retire` destroys one old version, :meth:`~KeyManagementService.destroy` destroys every
  version of the key for good (crypto-shredding).
* A **data key** (DEK, 256-bit AES) per scope and rotation period, made by ``FieldCipher``, wrapped by the scope's
  KEK; tokens carry the wrapped data key (``runjournal.core.crypto.token``).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from runjournal.core.crypto.token import frame_parts

__all__ = ["KeyManagementService", "KeyScope", "KeyState", "WrappedKey", "kek_id_for"]


@functools.lru_cache(maxsize=4096)
def kek_id_for(tenant_id: str, subject: str | None = None) -> str:
    """The KEK id of a tenant (``t-<32 hex>``) or of one subject of it (``s-<32 hex>``): the first 128 bits of
    SHA-256 over the scope. Opaque, so neither a token nor a key file name shows a user id (the scope can still be
    tested by whoever knows it: the run's clear ``tenant_id``/``user_id`` fields tell as much)."""
    if subject is None:
        return "t-" + hashlib.sha256(frame_parts("rjkek:tenant", tenant_id)).hexdigest()[:32]
    return "s-" + hashlib.sha256(frame_parts("rjkek:subject", tenant_id, subject)).hexdigest()[:32]


@dataclass(frozen=True)
class KeyScope:
    """Whose key encrypts a value: a tenant's, or one subject's (user's) within a tenant."""

    tenant_id: str
    subject: str | None = None

    @property
    def kek_id(self) -> str:
        """:func:`kek_id_for` of this scope."""
        return kek_id_for(self.tenant_id, self.subject)

    @property
    def parent_kek_id(self) -> str | None:
        """The tenant's KEK id for a subject scope (destroying the tenant's keys destroys its subjects' too)."""
        return kek_id_for(self.tenant_id) if self.subject is not None else None


@dataclass(frozen=True)
class WrappedKey:
    """A data key wrapped by version ``version`` of KEK ``kek_id``."""

    kek_id: str
    version: int
    blob: bytes


@dataclass(frozen=True)
class KeyState:
    """What the key service knows of one KEK (:meth:`KeyManagementService.state`)."""

    kek_id: str
    status: str
    """``active``, ``destroyed`` or ``unknown``."""
    current: int | None
    """The version new data keys are wrapped by (None unless active)."""
    readable: tuple[int, ...]
    """Versions that still unwrap (not retired)."""
    retired: tuple[int, ...]
    parent: str | None = None


@runtime_checkable
class KeyManagementService(Protocol):
    """Where key-encryption keys live. Every method may raise :class:`KeyUnavailableError` when the service does not
    answer (transient: the failure policy waits). ``context`` is associated data the wrap is bound to (the data key's
    id and the KEK reference): an unwrap with another context fails."""

    name: str
    """``local``, ``aws`` or ``vault`` (log field)."""

    def create(self, kek_id: str, *, parent: str | None = None) -> int:
        """Make KEK ``kek_id`` (version 1) unless it exists; return its current version. ``parent`` links a
        subject's KEK to its tenant's.

        Raises:
            KeyDestroyedError: the key was destroyed (a shredded scope gets no new key under the same id).
        """
        ...

    def wrap(self, kek_id: str, key: bytes, context: bytes) -> WrappedKey:
        """Wrap data key ``key`` by the current version of ``kek_id``.

        Raises:
            UnknownKeyError, KeyDestroyedError.
        """
        ...

    def unwrap(self, kek_id: str, version: int, blob: bytes, context: bytes) -> bytes:
        """The data key in ``blob``.

        Raises:
            UnknownKeyError, KeyDestroyedError, KeyRetiredError: the version cannot unwrap.
            CiphertextTamperedError: ``blob`` or ``context`` is not what was wrapped.
        """
        ...

    def rotate(self, kek_id: str) -> int:
        """Add a version; return it. Older versions still unwrap until retired.

        Raises:
            UnknownKeyError, KeyDestroyedError.
        """
        ...

    def retire(self, kek_id: str, version: int) -> None:
        """Destroy one old version's material: data keys it wrapped no longer unwrap (:class:`KeyRetiredError`).

        Raises:
            UnknownKeyError, KeyDestroyedError; ValueError: ``version`` is the current one (rotate first).
        """
        ...

    def destroy(self, kek_id: str) -> bool:
        """Destroy every version of ``kek_id`` for good; True when this call destroyed it, False when it already
        was. A key never made is destroyed too (True): no later :meth:`create` makes it, so a subject's first run
        racing its erase cannot leave a readable key behind. Idempotent: a later reader, and :meth:`create`, get
        :class:`KeyDestroyedError`."""
        ...

    def state(self, kek_id: str) -> KeyState:
        """What the service knows of ``kek_id`` (never raises for an unknown or destroyed key)."""
        ...

    def children(self, parent: str) -> list[str]:
        """The KEK ids created with ``parent`` (a tenant's subjects), destroyed ones left out."""
        ...

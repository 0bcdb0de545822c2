"""The named errors of payload encryption (docs/design/decisions/0059-encryption-and-crypto-shredding.md).

Kept free of ``cryptography``: a reader without the encryption extra still names what it cannot read.

* :class:`EncryptedContentError` — a value is an encrypted token this reader cannot turn into text; its subclasses
  say why: :class:`KeyDestroyedError` (shredded), :class:`KeyRetiredError` (that key version was retired),
  :class:`UnknownKeyError` (no such key here: no grant), :class:`CiphertextBindingError` (the token belongs to another
  run, event or field), :class:`CiphertextTamperedError` (it does not authenticate), :class:`TokenFormatError`
  (it starts like a token but does not parse).
* :class:`KeyUnavailableError` — the key service did not answer: transient, the one failure policy waits
  (``runjournal.consumers.runtime.failures.classify``).
"""

from __future__ import annotations

from runjournal.core.errors import RunjournalError

__all__ = ["CiphertextBindingError", "CiphertextTamperedError", "CryptoError", "EncryptedContentError",
           "KeyDestroyedError", "KeyRetiredError", "KeyUnavailableError", "TokenFormatError", "UnknownKeyError"]


class CryptoError(RunjournalError):
    """Base of the encryption errors."""


class EncryptedContentError(CryptoError):
    """A value is encrypted and this reader cannot read it (the subclass says why). Readers that show structure
    without content (``inspect``, the console) catch this one and show ``encrypted``.

    Attributes:
        kek_id: the key-encryption key the token names (None when the token does not parse that far).
        version: that key's version (None when unknown).
    """

    def __init__(self, message: str, *, kek_id: str | None = None, version: int | None = None) -> None:
        super().__init__(message)
        self.kek_id = kek_id
        self.version = version


class KeyDestroyedError(EncryptedContentError):
    """The key-encryption key was destroyed (crypto-shredding, ``LocalKeyDirectory.destroy``): every token under it,
    every copy anywhere, is unreadable for good. Also raised when encrypting for a destroyed scope."""


class KeyRetiredError(EncryptedContentError):
    """The token's key version was retired (``KeyManagementService.retire``): newer versions still read."""


class UnknownKeyError(EncryptedContentError):
    """The key service has no such key (never created here, or this reader has no grant to it)."""


class CiphertextBindingError(EncryptedContentError):
    """The token was made for another run, event or field than the one it is read as (moved or copied there).

    Attributes:
        expected: ``(run_id, event_id, field)`` it was read as.
    """

    def __init__(self, message: str, *, expected: tuple[str, str, str], kek_id: str | None = None,
                 version: int | None = None) -> None:
        super().__init__(message, kek_id=kek_id, version=version)
        self.expected = expected


class CiphertextTamperedError(EncryptedContentError):
    """The token's ciphertext, nonce, key reference or wrapped data key was altered: it does not authenticate."""


class TokenFormatError(EncryptedContentError):
    """A value starts with the token prefix ``rjenc:`` but is not a token this version reads (malformed, or a token
    format version from a newer writer)."""


class KeyUnavailableError(CryptoError):
    """The key service (KMS, key directory) did not answer or refused for a reason waiting may fix. Transient: the
    one failure policy waits and retries; nothing is published without its key, so no event is lost.

    Attributes:
        kek_id: the key asked for.
    """

    def __init__(self, message: str, *, kek_id: str | None = None) -> None:
        super().__init__(message)
        self.kek_id = kek_id

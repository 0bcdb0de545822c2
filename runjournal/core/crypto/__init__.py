"""Payload encryption and crypto-shredding (issue 33, decision 0059, docs/guide/encryption.md).

Content fields are encrypted with AES-256-GCM under data keys wrapped by a tenant's or subject's key-encryption key;
destroying that key makes every copy of every token under it unreadable. The token format and its rule, the errors,
the key hierarchy and the cache import nothing beyond the standard library; :class:`FieldCipher` and
:class:`LocalKeyDirectory` need ``cryptography`` (the ``encryption`` extra), imported on first use.
"""

from runjournal.core.lazy import lazy_exports

_HOMES = {
    **dict.fromkeys(["CiphertextBindingError", "CiphertextTamperedError", "CryptoError", "EncryptedContentError",
                     "KeyDestroyedError", "KeyRetiredError", "KeyUnavailableError", "TokenFormatError",
                     "UnknownKeyError"], "runjournal.core.crypto.errors"),
    **dict.fromkeys(["Binding", "Token", "decode_plain", "encode_plain", "is_encrypted", "parse_token"],
                    "runjournal.core.crypto.token"),
    **dict.fromkeys(["KeyManagementService", "KeyScope", "KeyState", "WrappedKey", "kek_id_for"],
                    "runjournal.core.crypto.keys"),
    "DataKeyCache": "runjournal.core.crypto.cache",
    **dict.fromkeys(["FieldCipher", "cipher_from_settings", "kms_from_settings"], "runjournal.core.crypto.cipher"),
    "LocalKeyDirectory": "runjournal.core.crypto.local",
}
__all__ = sorted(_HOMES)
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

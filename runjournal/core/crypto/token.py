"""The text form of an encrypted field, and the rule that tells it from plain text (decision 0059).

A content field of the envelope (``input_json``, ``args_json``, ``result_json``, ``error``, ``content`` …) is an Avro
``string`` and stays one: encrypted, it holds a **token**, a self-describing ASCII string::

    rjenc:1:<kek id>:<kek version>:<data key id>:<wrapped data key>:<body>

* ``rjenc:`` — the prefix; ``1`` — the token format version.
* ``<kek id>`` (``[A-Za-z0-9_-]{1,64}``) and ``<kek version>`` (decimal, ≥ 1) — the key-encryption key that wraps the
  data key (:func:`runjournal.core.crypto.keys.kek_id_for`: an opaque digest of the scope, never a user id in clear).
* ``<data key id>`` — 16 random bytes, base64url: names the data key (the cache's key).
* ``<wrapped data key>`` — the data key wrapped by the KEK (base64url): the token carries it, so any holder of the
  KEK reads any copy of the token, with no store of data keys to share or back up.
* ``<body>`` — base64url of ``binding hint (8) ‖ nonce (12) ‖ AES-256-GCM ciphertext and tag (16)``.

**The rule (unambiguous for every string):** a stored value that does not start with ``rjenc:`` is plain text, as
it is; one that starts with ``rjenc:0:`` is plain text with that escape in front (a writer escapes plain text that
itself starts with ``rjenc:``, :func:`encode_plain`); one that starts with ``rjenc:1:`` is a token; any other
``rjenc:`` value is a :class:`TokenFormatError`. So ``decode_plain(encode_plain(s)) == s`` for every ``s``, and no
plain text ever reads as a token. A ``*_json`` field can never meet the escape: JSON text never starts with ``r``.

Nothing here imports ``cryptography``: a reader without the key (the projector, recovery) tells tokens from text.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import re
from dataclasses import dataclass

from runjournal.core.crypto.errors import EncryptedContentError, TokenFormatError

__all__ = ["ESCAPE", "PREFIX", "TOKEN_V1", "Binding", "Token", "decode_plain", "encode_plain", "is_encrypted",
           "parse_token"]

PREFIX = "rjenc:"
"""Every framed value starts with it."""
ESCAPE = "rjenc:0:"
"""Plain text that starts with :data:`PREFIX`, escaped."""
TOKEN_V1 = "rjenc:1:"
"""A token of format version 1."""

HINT_BYTES, NONCE_BYTES, TAG_BYTES, DEK_ID_BYTES = 8, 12, 16, 16
_KEK_ID = r"[A-Za-z0-9_-]{1,64}"
_B64 = r"[A-Za-z0-9_-]+"
_V1 = re.compile(rf"rjenc:1:(?P<kek>{_KEK_ID}):(?P<ver>[1-9][0-9]{{0,8}}):(?P<dek>{_B64}):(?P<wrapped>{_B64})"
                 rf":(?P<body>{_B64})")


def b64e(data: bytes) -> str:
    """base64url without padding."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64d(text: str) -> bytes:
    """Inverse of :func:`b64e`.

    Raises:
        ValueError: not base64url.
    """
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError(str(exc)) from exc


def frame_parts(*parts: str) -> bytes:
    """Length-prefixed UTF-8 parts: no two different part lists give the same bytes."""
    out = bytearray()
    for part in parts:
        raw = part.encode("utf-8", "surrogatepass")
        out += len(raw).to_bytes(4, "big") + raw
    return bytes(out)


@dataclass(frozen=True)
class Binding:
    """Where a ciphertext belongs: its run, its event and the payload field that holds it. It is the associated data
    of the AES-GCM encryption, so a token read anywhere else fails (:class:`CiphertextBindingError`)."""

    run_id: str
    event_id: str
    field: str
    """The field's name as the envelope names it (``args_json``, ``error`` …), or a name of the caller's own."""

    @functools.cached_property
    def _framed(self) -> bytes:
        """``frame_parts(run_id, event_id, field)``, made once per binding (a seal needs it twice)."""
        return frame_parts(self.run_id, self.event_id, self.field)

    def hint(self) -> bytes:
        """8 bytes of SHA-256 over the binding: carried in clear so a moved token is named as moved, not as tampered
        (it tells nothing a reader of the event's own clear fields does not know)."""
        return hashlib.sha256(_BIND_V1 + self._framed).digest()[:HINT_BYTES]

    def aad(self, kek_id: str, version: int, dek_id: str) -> bytes:
        """The associated data: the token's header and the binding, length-prefixed
        (``frame_parts("rjenc:1", kek_id, str(version), dek_id, run_id, event_id, field)``)."""
        return _header_frame(kek_id, version, dek_id) + self._framed


_BIND_V1 = frame_parts("rjbind:1")


@functools.lru_cache(maxsize=4096)
def _header_frame(kek_id: str, version: int, dek_id: str) -> bytes:
    """``frame_parts("rjenc:1", kek_id, str(version), dek_id)``: the same for every field a data key seals."""
    return frame_parts("rjenc:1", kek_id, str(version), dek_id)


@dataclass(frozen=True)
class Token:
    """A parsed v1 token (:func:`parse_token`)."""

    kek_id: str
    version: int
    dek_id: str
    wrapped: bytes
    hint: bytes
    nonce: bytes
    ciphertext: bytes
    """AES-GCM ciphertext with its 16-byte tag."""

    def text(self) -> str:
        """The token's stored form."""
        body = b64e(self.hint + self.nonce + self.ciphertext)
        return f"{TOKEN_V1}{self.kek_id}:{self.version}:{self.dek_id}:{b64e(self.wrapped)}:{body}"


def is_encrypted(value: str | None) -> bool:
    """True when ``value`` is framed as encrypted (starts with ``rjenc:`` but is not the plain-text escape); a
    malformed token counts as encrypted (reading it raises :class:`TokenFormatError`). None and plain text: False."""
    return value is not None and value.startswith(PREFIX) and not value.startswith(ESCAPE)


def encode_plain(text: str) -> str:
    """The stored form of plain ``text``: itself, or escaped with :data:`ESCAPE` when it starts with ``rjenc:``.
    Every writer of a content field applies it, encrypting or not, so readers apply one rule."""
    return ESCAPE + text if text.startswith(PREFIX) else text


def decode_plain(value: str) -> str:
    """The plain text of a stored value that is not encrypted (the inverse of :func:`encode_plain`).

    Raises:
        EncryptedContentError: ``value`` is a token (read it with ``FieldCipher.decrypt``).
        TokenFormatError: ``value`` starts with ``rjenc:`` but is neither the escape nor a v1 token.
    """
    if not value.startswith(PREFIX):
        return value
    if value.startswith(ESCAPE):
        return value[len(ESCAPE):]
    token = parse_token(value)
    raise EncryptedContentError(f"the value is encrypted under key {token.kek_id} v{token.version}",
                                kek_id=token.kek_id, version=token.version)


def parse_token(value: str) -> Token:
    """Parse a v1 token.

    Raises:
        TokenFormatError: not a v1 token (another format version, a malformed part, a body too short).
    """
    m = _V1.fullmatch(value)
    if m is None:
        framed = re.match(r"rjenc:([0-9]+):", value)
        why = (f"token format version {framed[1]} is not one this reader knows (a newer writer?)"
               if framed is not None and framed[1] != "1" else "malformed token")
        raise TokenFormatError(f"{why}: {value[:40]!r}…")
    try:
        dek_raw, wrapped, body = b64d(m["dek"]), b64d(m["wrapped"]), b64d(m["body"])
    except ValueError as exc:
        raise TokenFormatError(f"malformed token: {exc}") from exc
    if len(dek_raw) != DEK_ID_BYTES or len(body) < HINT_BYTES + NONCE_BYTES + TAG_BYTES:
        raise TokenFormatError("malformed token: data key id or body too short", kek_id=m["kek"],
                               version=int(m["ver"]))
    return Token(kek_id=m["kek"], version=int(m["ver"]), dek_id=m["dek"], wrapped=wrapped, hint=body[:HINT_BYTES],
                 nonce=body[HINT_BYTES:HINT_BYTES + NONCE_BYTES], ciphertext=body[HINT_BYTES + NONCE_BYTES:])

"""The token-vs-text rule of decision 0059, for every string: plain text written through ``encode_plain`` never
reads as a token and reads back as itself (text that starts with the prefix included); a token reads back as the
text it encrypts."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from runjournal.core.crypto import (
    Binding,
    EncryptedContentError,
    FieldCipher,
    KeyScope,
    LocalKeyDirectory,
    decode_plain,
    encode_plain,
    is_encrypted,
)
from runjournal.core.crypto.token import ESCAPE, PREFIX, TOKEN_V1

CIPHER = FieldCipher(LocalKeyDirectory(Path(tempfile.mkdtemp(prefix="rj-crypto-props-")) / "keys"))
HERE = Binding("run-1", "ev-1", "content")

texts = st.one_of(
    st.text(),
    st.text().map(lambda t: PREFIX + t),  # plain text that starts like a token …
    st.text().map(lambda t: ESCAPE + t),  # … or like an escaped one …
    st.text().map(lambda t: TOKEN_V1 + t),  # … or like a v1 token
    st.sampled_from(["rjenc", "rjenc:", "rjenc:0:", "rjenc:1:", "RJENC:1:", " rjenc:1:", "rjenc:0:rjenc:0:"]),
)


@given(texts)
def test_plain_text_is_never_a_token_and_reads_back_as_itself(text: str) -> None:
    stored = encode_plain(text)
    assert not is_encrypted(stored)
    assert decode_plain(stored) == text
    assert CIPHER.decrypt(stored, HERE) == text
    assert (stored == text) == (not text.startswith(PREFIX))  # only prefixed text is changed by the escape


@given(texts, st.text(min_size=1, max_size=20), st.sampled_from([None, "alice", "bob"]))
@settings(max_examples=60, deadline=None)
def test_every_text_round_trips_through_a_token(text: str, run_id: str, subject: str | None) -> None:
    binding = Binding(run_id, "ev-1", "result_json")
    token = CIPHER.encrypt(text, KeyScope("acme", subject), binding)
    assert is_encrypted(token) and token.startswith(TOKEN_V1)
    assert CIPHER.decrypt(token, binding) == text
    try:
        decode_plain(token)
    except EncryptedContentError:
        pass
    else:
        raise AssertionError("a token read as plain text")


@given(st.text(), st.text(), st.text(), st.text(min_size=1), st.integers(1, 2**31), st.text(min_size=1))
def test_the_associated_data_and_hint_are_the_length_prefixed_frames_of_0059(run_id: str, address: str, field: str,
                                                                            kek_id: str, version: int,
                                                                            dek_id: str) -> None:
    """The wire format every token already written depends on: the associated data is
    ``frame_parts("rjenc:1", kek, version, dek, run, address, field)`` and the hint the first 8 bytes of SHA-256 over
    ``frame_parts("rjbind:1", run, address, field)``, however they are computed (cached parts included)."""
    import hashlib

    from runjournal.core.crypto.token import frame_parts

    binding = Binding(run_id, address, field)
    for _ in range(2):  # the second time from the cached frames
        assert binding.aad(kek_id, version, dek_id) == frame_parts("rjenc:1", kek_id, str(version), dek_id, run_id,
                                                                   address, field)
        assert binding.hint() == hashlib.sha256(frame_parts("rjbind:1", run_id, address, field)).digest()[:8]

"""``ContentCrypto.seal`` without a stack (decision 0059): which fields it seals, under whose key, what it leaves in
clear (ids, digests, the spend steps' accounting), and that opening gives the text back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runjournal.core.crypto import FieldCipher, KeyScope, LocalKeyDirectory, is_encrypted, parse_token
from runjournal.producers.encryption import CONTENT_FIELDS, ContentCrypto, address_of
from runjournal.producers.spend import RESERVE_TOOL, SETTLE_TOOL
from runjournal.schemas import Event, EventType, new_event_id, utcnow


def event(etype: EventType, **payload: Any) -> Event:
    return Event(new_event_id(), "run-1", "acme", 2, 1, "p", etype, utcnow(), payload)


@pytest.fixture
def crypto(tmp_path: Path) -> ContentCrypto:
    return ContentCrypto(cipher=FieldCipher(LocalKeyDirectory(tmp_path / "keys")))


def test_content_is_sealed_under_the_subject_and_the_rest_stays_clear(crypto: ContentCrypto) -> None:
    committed = event(EventType.TOOL_CALL_COMMITTED, call_id="c1", tool="pay", idempotency_key="k1",
                      args_digest="sha256:a", result_json='{"ok":1}', result_ref=None, result_digest="sha256:r")
    sealed = crypto.seal(committed, "alice")
    assert is_encrypted(sealed.payload["result_json"])
    assert parse_token(sealed.payload["result_json"]).kek_id == KeyScope("acme", "alice").kek_id
    assert {k: v for k, v in sealed.payload.items() if k != "result_json"} == \
        {k: v for k, v in committed.payload.items() if k != "result_json"}
    assert (sealed.event_id, sealed.seq, sealed.type) == (committed.event_id, committed.seq, committed.type)
    assert committed.payload["result_json"] == '{"ok":1}'  # the caller's event is not changed
    assert crypto.open(sealed.payload["result_json"], "run-1", "call:c1", "result_json") == '{"ok":1}'
    tenant = crypto.seal(committed, None)
    assert parse_token(tenant.payload["result_json"]).kek_id == KeyScope("acme").kek_id


def test_a_message_of_another_user_is_that_users(crypto: ContentCrypto) -> None:
    sealed = crypto.seal(event(EventType.MESSAGE, role="user", content="hi", user_id="bob"), "alice")
    assert parse_token(sealed.payload["content"]).kek_id == KeyScope("acme", "bob").kek_id


@pytest.mark.parametrize("tool", [RESERVE_TOOL, SETTLE_TOOL])
def test_the_spend_steps_accounting_stays_clear(crypto: ContentCrypto, tool: str) -> None:
    intended = event(EventType.TOOL_CALL_INTENDED, call_id="s1", tool=tool, idempotency_key="k", args_digest="d",
                     side_effect=True, attempt=1, timeout_ms=1, args_json='{"model":"m","input_tokens":3}')
    assert crypto.seal(intended, "alice").payload["args_json"] == '{"model":"m","input_tokens":3}'


def test_every_content_field_has_an_address_and_only_content_fields_do() -> None:
    e = event(EventType.NODE_FAILED, node_path="a/b", error="boom", retryable=False)
    assert address_of(e, "error") == "node:a/b" and address_of(e, "node_path") is None
    assert all(name.endswith("_json") or name in ("error", "content", "text", "subject")
               for fields in CONTENT_FIELDS.values() for name, _ in fields)


def test_without_a_cipher_seal_only_escapes(tmp_path: Path) -> None:
    plain = ContentCrypto()
    msg = event(EventType.MESSAGE, role="user", content="rjenc:1:x", user_id=None)
    assert plain.seal(msg, None).payload["content"] == "rjenc:0:rjenc:1:x"
    same = event(EventType.MESSAGE, role="user", content="hello", user_id=None)
    assert plain.seal(same, None) is same  # nothing to change: the same object, no copy on the hot path


def test_encryption_on_without_the_extra_is_a_named_config_error(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    import sys

    from runjournal.core.errors import ConfigError
    from runjournal.core.settings import Settings

    monkeypatch.setitem(sys.modules, "runjournal.core.crypto.cipher", None)  # as if `cryptography` were missing
    with pytest.raises(ConfigError, match=r"runjournal\[encryption\]"):
        ContentCrypto(Settings(encryption="on", keys_dir=tmp_path / "keys"))
    assert ContentCrypto(Settings()).encrypting is False  # off: nothing is imported, nothing refused

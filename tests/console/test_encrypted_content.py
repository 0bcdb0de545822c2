"""The console holds no key (decision 0059): encrypted content shows as ``encrypted`` in an event's one-line detail,
its payload view, the run's input and output, and escaped plain text shows as it was written."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from runjournal.console.queries import _detail, _json_value, _payload, _pretty_json, shown
from runjournal.core.crypto import Binding, FieldCipher, KeyScope, LocalKeyDirectory


def test_tokens_show_as_encrypted_and_escaped_text_as_written(tmp_path: Path) -> None:
    cipher = FieldCipher(LocalKeyDirectory(tmp_path / "keys"))
    secret = '{"card":"4111"}'
    token = cipher.encrypt(secret, KeyScope("acme", "alice"), Binding("r1", "call:c1", "args_json"))
    event = SimpleNamespace(type="TOOL_CALL_INTENDED", payload={"call_id": "c1", "tool": "pay", "args_json": token})
    assert "4111" not in _detail(event) and "rjenc" not in _detail(event) and "encrypted" in _detail(event)
    assert _payload(event)["args_json"] == "encrypted" and "args" not in _payload(event)
    assert _json_value(token) == "encrypted" and _pretty_json(token) == "encrypted"
    assert shown("rjenc:0:rjenc:1:x") == "rjenc:1:x" and shown(secret) == secret and shown(None) is None
    message = SimpleNamespace(type="MESSAGE", payload={"role": "user", "content": token})
    assert "4111" not in _detail(message) and "encrypted" in _detail(message)

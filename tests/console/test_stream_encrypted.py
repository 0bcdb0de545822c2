"""``GET /streams/{run_id}`` of an encrypted stream (issue 33, decision 0059) from a real ``runjournal console``
process: the console holds no key, so every sealed chunk and an end's error are served as ``"encrypted"`` with the
error's name — never the token, never the text — and the stream is served to its end."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from runjournal.console.app import path_segment
from runjournal.core.settings import Settings
from runjournal.producers import Journal
from tests.console.test_stream import _console, sse_events

pytestmark = pytest.mark.integration


@pytest.fixture
def console(topics: Settings, service_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    # the console's environment even names the key directory: it still opens nothing (it holds no key)
    proc, url = _console({**service_env, "RUNJOURNAL_KEYS_DIR": str(tmp_path / "keys")}, tmp_path / "console.log")
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_console_serves_sealed_chunks_as_encrypted(topics: Settings, console: str, tmp_path: Path) -> None:
    mark = f"MARKER-{uuid.uuid4().hex}"
    s = topics.model_copy(update={"encryption": "on", "keys_dir": tmp_path / "keys"})
    with Journal(s, producer_id=f"enc-sse-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("acme", "chat", {}, user_id="alice")
        with pytest.raises(ValueError), run.stream("answer") as st:
            st.write(f"tok {mark}")
            st.write({"progress": mark})
            raise ValueError(mark)
        journal.streams.flush(10)
    events = sse_events(f"{console}/streams/{path_segment(run.run_id)}")
    assert [(e["event"], e["data"]["data"], e["data"].get("encrypted")) for e in events] == [
        ("chunk", "encrypted", "EncryptedContentError"), ("chunk", "encrypted", "EncryptedContentError"),
        ("end", {"error": "encrypted"}, "EncryptedContentError")]
    assert mark not in json.dumps(events) and "rjenc:" not in json.dumps(events)

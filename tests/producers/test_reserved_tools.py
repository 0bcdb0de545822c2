"""The spend ledger's step names are the library's own (issue 33, decision 0059): those calls stay in clear under
encryption, matched by name, so an application tool named like them would have its arguments and result written in
clear. Such a tool is refused before anything is published; the library's own spend steps (and its other built-in
tools, such as the durable timer) still run."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from runjournal.consumers.ops.inspect import read_run_events
from runjournal.core.crypto import is_encrypted
from runjournal.core.ids import InvalidIdError
from runjournal.core.settings import Settings
from runjournal.producers import Journal
from runjournal.schemas import EventType

pytestmark = pytest.mark.integration


class Impostor:
    name = "runjournal.spend.settle"
    side_effect = True
    timeout_ms = 1000

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        self.calls += 1
        return {"card": args["card"]}


@pytest.mark.parametrize("name", ["runjournal.spend.settle", "runjournal.spend.reserve"])
def test_an_application_tool_in_the_librarys_namespace_is_refused_before_publishing(topics: Settings, tmp_path: Path,
                                                                                     name: str) -> None:
    s = topics.model_copy(update={"encryption": "on", "keys_dir": tmp_path / "keys"})
    tool = Impostor()
    tool.name = name
    with Journal(s, producer_id=f"ns-{uuid.uuid4().hex[:6]}") as journal:
        run = journal.start_run("acme", "agent", {"q": 1}, user_id="ann")
        with pytest.raises(InvalidIdError, match="reserved"):
            run.call(tool, {"card": "4111-1111-1111-1111"})
        run.succeed({"ok": True})
    assert tool.calls == 0
    events = [row["event"] for row in read_run_events(s, run.run_id) if row.get("event") is not None]
    assert [e.type for e in events] == [EventType.RUN_STARTED, EventType.RUN_SUCCEEDED]
    assert all(is_encrypted(e.payload["input_json"]) for e in events if e.type is EventType.RUN_STARTED)

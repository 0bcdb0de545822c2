"""A mixed fleet (issue 33, decision 0059): during a rollout some agents encrypt and some do not, on one topic.

A run started by an encrypting agent and resumed by one that does not (given the key directory) reads back its
recorded input and results in plain text and goes on; a run started in plain text and resumed by an encrypting agent
keeps its plain history readable and seals what it writes from then on. The projector and the recovery job hold no
key through either, and a reader with the key sees one run, whatever wrote each event.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from runjournal.consumers.ops.inspect import inspect_run, read_run_events
from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core.crypto import is_encrypted
from runjournal.core.settings import Settings
from runjournal.producers import Journal
from runjournal.producers.encryption import CONTENT_FIELDS
from runjournal.schemas import EventType
from tests.support.provider import project

pytestmark = pytest.mark.integration


class Book:
    """A side effect that counts its executions (recovery must never run it twice)."""

    name = "book"
    side_effect = True
    timeout_ms = 2000

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        self.calls += 1
        return {"booked": args["seat"]}


def stored(settings: Settings, run_id: str) -> list[tuple[EventType, str, bool]]:
    """``(type, field, is a token)`` of each content field of the run, in journal order."""
    out = []
    for row in read_run_events(settings, run_id):
        event = row.get("event")
        if event is None:
            continue
        for name, _ in CONTENT_FIELDS.get(event.type, ()):
            if event.payload.get(name) is not None:
                out.append((event.type, name, is_encrypted(event.payload[name])))
    return out


def hand_over(first: Settings, second: Settings, topics: Settings, tool: Book, mark: str) -> str:
    """A run started by a journal with ``first`` settings, left behind, recovered and finished with ``second``."""
    a = Journal(first, producer_id=f"fleet-a-{uuid.uuid4().hex[:6]}")
    run = a.start_run("acme", "agent", {"ask": mark}, user_id="carol")
    assert run.call(tool, {"seat": mark}) == {"booked": mark}
    a.close()  # the agent is gone; its run is open
    with Journal(second, producer_id=f"fleet-b-{uuid.uuid4().hex[:6]}") as b:
        project(topics)
        assert RecoveryJob(topics).recover(runs=[run.run_id], force=True, assign_to=b.producer_id) is not None
        resumed = b.resume(run.run_id)
        assert resumed.input == {"ask": mark}  # opened by the writer that resumes it, encrypting or not
        assert resumed.call(tool, {"seat": mark}) == {"booked": mark} and tool.calls == 1  # recorded, not re-run
        resumed.succeed({"out": mark})
    project(topics)
    return run.run_id


@pytest.mark.parametrize("first_on", [True, False], ids=["encrypted-then-plain", "plain-then-encrypted"])
def test_a_run_handed_between_an_encrypting_and_a_plain_agent_reads_as_one_run(topics: Settings, tmp_path: Path,
                                                                                first_on: bool) -> None:
    mark = f"MARKER-{uuid.uuid4().hex}"
    keys = tmp_path / "keys"
    on = topics.model_copy(update={"encryption": "on", "keys_dir": keys})
    off = topics.model_copy(update={"encryption": "off", "keys_dir": keys})  # the rollout: same keys, not encrypting
    run_id = hand_over(on if first_on else off, off if first_on else on, topics, Book(), mark)

    fields = stored(on, run_id)
    started = next(tok for t, f, tok in fields if (t, f) == (EventType.RUN_STARTED, "input_json"))
    finished = next(tok for t, f, tok in fields if (t, f) == (EventType.RUN_SUCCEEDED, "output_json"))
    assert (started, finished) == (first_on, not first_on)  # each writer wrote as it was configured

    shown = inspect_run(on, run_id, with_timeline=False)  # a reader with the key: one run, plain throughout
    assert shown is not None and shown["state"]["status"] == "SUCCEEDED"
    assert json.loads(shown["state"]["input_json"]) == {"ask": mark}
    assert json.loads(shown["state"]["output_json"]) == {"out": mark}
    keyless = inspect_run(topics.model_copy(update={"keys_dir": tmp_path / "none"}), run_id, with_timeline=False)
    assert keyless is not None and keyless["state"]["status"] == "SUCCEEDED"  # the structure needs no key

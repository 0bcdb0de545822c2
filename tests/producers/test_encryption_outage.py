"""The key service away at a run's start (issue 33, decision 0059): a new subject's first event needs a data key,
so ``start_run`` raises ``KeyUnavailableError`` — transient under the one failure policy — before anything is
produced, and frees the run id, so the same start succeeds once the key service is back and no event is lost or
written twice. A subject that already has a data key keeps writing through the outage."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from runjournal.consumers.ops.inspect import read_run_events
from runjournal.consumers.runtime.failures import TRANSIENT, classify
from runjournal.core.crypto import KeyUnavailableError, is_encrypted
from runjournal.core.settings import Settings
from runjournal.producers import Journal
from runjournal.schemas import EventType

pytestmark = pytest.mark.integration


def test_a_start_refused_by_a_key_service_outage_produces_nothing_and_succeeds_after_it(topics: Settings,
                                                                                         tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    s = topics.model_copy(update={"encryption": "on", "keys_dir": keys, "key_cache_ttl_ms": 600_000})
    held = tmp_path / "keys-held"
    with Journal(s, producer_id=f"outage-{uuid.uuid4().hex[:6]}") as journal:
        alice = journal.start_run("acme", "agent", {"ask": "a"}, user_id="alice")  # alice's data key is made
        shutil.move(keys, held)
        keys.write_text("not a directory")  # every read of the key directory fails: the key service is away
        run_id = f"dave-{uuid.uuid4().hex}"
        with pytest.raises(KeyUnavailableError) as refused:
            journal.start_run("acme", "agent", {"ask": "d"}, user_id="dave", run_id=run_id)
        assert classify(refused.value).kind == TRANSIENT and classify(refused.value).dependency == "kms"
        assert read_run_events(s, run_id) == []  # nothing of dave's run was produced
        alice.message("user", "still here")  # a subject holding a data key writes on through the outage
        keys.unlink()
        shutil.move(held, keys)  # the key service is back
        dave = journal.start_run("acme", "agent", {"ask": "d"}, user_id="dave", run_id=run_id)  # the id was freed
        dave.succeed({"ok": True})
        alice.succeed({"ok": True})
    events = [row["event"] for row in read_run_events(s, run_id) if row.get("event") is not None]
    assert [e.type for e in events] == [EventType.RUN_STARTED, EventType.RUN_SUCCEEDED]  # once each, in order
    assert all(is_encrypted(e.payload["input_json"]) for e in events if e.type is EventType.RUN_STARTED)

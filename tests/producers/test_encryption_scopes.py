"""Issue 33 review: a journal remembered whose key seals a run (its user's) for the last ``SCOPES_KEPT`` runs it
*started or resumed* — not for the runs still live in it. A long run (waiting days for an approval) on a busy
instance fell out of that memory, and its next content was sealed under the **tenant's** key instead of its user's,
silently: ``erase --subject`` then left that content readable. A live run's scope is now kept until its terminal
event releases it (then it joins the bounded memory of finished runs, for a framework's late writes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runjournal.core.crypto import KeyScope
from runjournal.core.crypto.token import parse_token
from runjournal.core.settings import Settings
from runjournal.producers import Journal
from runjournal.producers import journal as journal_module
from tests.support.readback import read_committed

pytestmark = pytest.mark.integration


def test_a_live_run_keeps_its_users_key_however_many_runs_start_after_it(topics: Settings, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal_module, "SCOPES_KEPT", 2)
    s = topics.model_copy(update={"encryption": "on", "keys_dir": tmp_path / "keys"})
    with Journal(s, producer_id="scopes") as journal:
        long = journal.start_run("acme", "agent", {"q": 1}, user_id="ann")
        others = [journal.start_run("acme", "agent", {"q": 2}, user_id=f"u{i}") for i in range(3)]
        for other in others:
            other.succeed()
        said = long.message("user", "my address is 1 Elm St")
        journal.flush()
        (stored,) = [r.event for r in read_committed(s) if r.event.event_id == said.event_id]
        assert parse_token(stored.payload["content"]).kek_id == KeyScope("acme", "ann").kek_id  # not the tenant's
        assert journal.scope_of(long.run_id) == KeyScope("acme", "ann")
        long.succeed()
        assert journal.scope_of(long.run_id) == KeyScope("acme", "ann")  # finished: in the bounded memory
        assert sum(journal.scope_of(o.run_id) is not None for o in others) <= 2

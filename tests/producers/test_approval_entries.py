"""The pending-approvals set's ``run_id|call_id`` entries (``ApprovalInbox``): a call id holds no ``|``, so an entry
splits at its last ``|`` whatever the run id holds, and a run forgets only its own entries (issue 28, case 2)."""

from __future__ import annotations

from typing import Any

import pytest

from runjournal.core.ids import InvalidIdError
from runjournal.producers.approvals import ApprovalInbox


class SetsOnly:
    """The few Redis commands the inbox's pending set uses, in memory."""

    def __init__(self) -> None:
        self.sets: dict[str, set[bytes]] = {}
        self.hashes: dict[str, dict[str, bytes]] = {}

    def sadd(self, key: str, *members: str) -> int:
        self.sets.setdefault(key, set()).update(m.encode() for m in members)
        return len(members)

    def smembers(self, key: str) -> set[bytes]:
        return set(self.sets.get(key, set()))

    def srem(self, key: str, *members: Any) -> int:
        before = len(self.sets.get(key, set()))
        self.sets.get(key, set()).difference_update(m if isinstance(m, bytes) else m.encode() for m in members)
        return before - len(self.sets.get(key, set()))

    def hget(self, key: str, field: str) -> bytes | None:
        return self.hashes.get(key, {}).get(field)

    def delete(self, key: str) -> int:
        return int(self.hashes.pop(key, None) is not None)


def test_entries_split_at_the_last_bar_and_forget_is_exact() -> None:
    inbox = ApprovalInbox(SetsOnly(), "p")
    inbox.requested("a", "c1")
    inbox.requested("a|b", "c2")  # a run id may hold "|"
    assert inbox.pending() == [("a", "c1"), ("a|b", "c2")]
    assert inbox.forget("a") == 1  # its own entry only; the old prefix match "a|" took run "a|b"'s too
    assert inbox.pending() == [("a|b", "c2")]


@pytest.mark.parametrize("call_id", ["x|y", "x/y", "", "c\x1f1"])
def test_a_call_id_that_would_make_an_entry_ambiguous_is_refused(call_id: str) -> None:
    with pytest.raises(InvalidIdError, match="approval call id"):
        ApprovalInbox(SetsOnly(), "p").requested("run", call_id)

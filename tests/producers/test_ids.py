"""Issue 28, case 2: identifiers are validated at the API boundary, before anything is published.

The reproduced bug: the idempotency key is sha256 over ``runjournal.call.v1 ␟ run_id ␟ node_path ␟ index`` (U+001F
between the parts), and run ids and node names could hold U+001F — run ``k␟n`` at node ``x`` and run ``k`` at node
``n␟x`` got the same key, so the provider answered the second run's charge with the first run's stored result and
never charged it. Now an id holding a control character is refused with ``InvalidIdError`` and nothing of it is
published (docs/design/protocol.md § The side-effect protocol; docs/reference/identifiers.md).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from runjournal import InvalidIdError, NonCanonicalValueError, RunjournalError
from runjournal.core.settings import Settings
from runjournal.producers import Journal, idempotency_key
from runjournal.producers.aio import AsyncJournal
from tests.support.readback import read_committed

pytestmark = pytest.mark.integration


class Charge:
    """A side-effecting provider that charges once per idempotency key and answers a repeated key with the stored
    result (as payment providers do): a key shared by two runs charges only the first."""

    name = "charge"
    side_effect = True
    timeout_ms = 500

    def __init__(self) -> None:
        self.stored: dict[str, dict[str, Any]] = {}
        self.charged: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        with self._lock:
            if idempotency_key not in self.stored:
                self.charged.append(args["who"])
                self.stored[idempotency_key] = {"charged": args["who"]}
            return self.stored[idempotency_key]


@pytest.fixture
def journal(topics: Settings) -> Iterator[Journal]:
    with Journal(topics, producer_id=f"p-{uuid.uuid4().hex[:8]}") as j:
        yield j


def test_two_runs_whose_ids_hold_the_separator_never_share_a_key(journal: Journal, topics: Settings) -> None:
    """The reproduction through the public API: either both runs charge under distinct keys, or the ambiguous one
    is refused with the named error before anything of it is published. Both ids here hold U+001F: both are refused,
    and a valid run next to them charges normally."""
    charge = Charge()
    first_id, second_id = f"k{uuid.uuid4().hex[:6]}\x1fn", None
    with pytest.raises(InvalidIdError) as refused:
        journal.start_run("tenant-a", "payer", {}, run_id=first_id)
    assert refused.value.rule == "control character" and refused.value.kind == "run id"
    assert "U+001F" in str(refused.value)  # the message names the character and the rule
    assert isinstance(refused.value, RunjournalError) and isinstance(refused.value, ValueError)

    second_id = first_id.split("\x1f")[0]
    second = journal.start_run("tenant-a", "payer", {}, run_id=second_id)  # a valid id
    with pytest.raises(InvalidIdError) as bad_node:
        with second.node("n\x1fx"):
            pytest.fail("the node must be refused before its block runs")
    assert bad_node.value.kind == "node name"
    with second.node("n"):
        assert second.call(charge, {"who": "second"}) == {"charged": "second"}
    second.succeed()
    journal.flush()

    assert charge.charged == ["second"]
    events = [r.event for r in read_committed(topics)]
    assert {e.run_id for e in events} == {second_id}  # nothing of the refused run, nor of the refused node
    assert not any(e.node_id and "\x1f" in e.node_id for e in events)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))  # a refusal consumed no seq


def test_the_keys_of_the_reproduced_pair_are_refused_not_collided() -> None:
    """The pure function under the handle: the two inputs of the bug derived one key; now each is refused."""
    for run_id, node_path in (("k\x1fn", "x"), ("k", "n\x1fx")):
        with pytest.raises(InvalidIdError):
            idempotency_key(run_id, node_path, 1)
    assert idempotency_key("k", "n/x", 1) != idempotency_key("k", "n", 1)


def test_every_id_of_start_run_is_checked_before_the_claim(journal: Journal, topics: Settings) -> None:
    """tenant, agent, user id, run id and the input: a refusal claims no run id and publishes nothing, so the
    same run id can be started at once with valid values."""
    run_id = f"r-{uuid.uuid4().hex[:8]}"
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"tenant_id": ""}, InvalidIdError, "tenant id"),
        ({"agent": "a\nb"}, InvalidIdError, "agent"),
        ({"user_id": "u\u200b1"}, InvalidIdError, "user id"),  # a zero-width space (Cf)
        ({"run_id": "r{1}"}, InvalidIdError, "run id"),  # braces would move the Redis hash tag
        ({"run_id": "r" * 257}, InvalidIdError, "run id"),
        ({"input": {"when": {1, 2}}}, NonCanonicalValueError, "input"),
        ({"input": {"x": float("nan")}}, NonCanonicalValueError, "input"),
    ]
    for override, error, what in cases:
        kwargs: dict[str, Any] = {"tenant_id": "tenant-a", "agent": "agent", "input": {}, "run_id": run_id,
                                  "user_id": None, **override}
        with pytest.raises(error) as exc:
            journal.start_run(**kwargs)
        assert what in str(exc.value)
    journal.start_run("tenant-a", "agent", {"q": [1, 2.5, "é"]}, run_id=run_id, user_id="u-1").succeed()
    journal.flush()
    assert {r.event.run_id for r in read_committed(topics)} == {run_id}


def test_calls_steps_approvals_and_arguments_are_checked_before_their_intent(journal: Journal,
                                                                            topics: Settings) -> None:
    charge = Charge()
    run = journal.start_run("tenant-a", "agent", {})
    with pytest.raises(InvalidIdError, match="step"):
        run.call(charge, {"who": "a"}, step="call\x00id")
    with pytest.raises(NonCanonicalValueError, match=r"args\['when'\]"):
        run.call(charge, {"who": "a", "when": object()})
    with pytest.raises(NonCanonicalValueError, match="not a string"):
        run.call(charge, {"who": "a", 1: "one"})
    with pytest.raises(InvalidIdError, match="approval call id"):
        run.request_approval("a|b", "why")
    with pytest.raises(InvalidIdError, match="node path"):
        run.emit("NODE_STARTED", {"node_path": "x", "attempt": 1}, node_id="x\x1fy")
    assert charge.charged == []
    assert run.call(charge, {"who": "a"}, step="call-1") == {"charged": "a"}
    run.succeed()
    journal.flush()
    events = [r.event for r in read_committed(topics) if r.event.run_id == run.run_id]
    assert [e.type.value for e in events] == ["RUN_STARTED", "TOOL_CALL_INTENDED", "TOOL_CALL_COMMITTED",
                                              "RUN_SUCCEEDED"]


def test_resume_refuses_an_invalid_run_id_before_reading_its_plan(journal: Journal) -> None:
    with pytest.raises(InvalidIdError):
        journal.resume("r\x1fx")


def test_a_producer_id_with_reserved_characters_is_refused_before_the_lease(topics: Settings) -> None:
    for bad in ("bad#name", "a{b}", "tab\tname", ""):
        with pytest.raises(InvalidIdError, match="producer id"):
            Journal(topics, producer_id=bad)


def test_the_async_journal_checks_the_same_ids(topics: Settings) -> None:
    async def main() -> None:
        async with await AsyncJournal.open(topics, producer_id=f"a-{uuid.uuid4().hex[:8]}",
                                           producer_threads=4) as aj:
            with pytest.raises(InvalidIdError):
                await aj.start_run("tenant-a", "agent", {}, run_id="k\x1fn")
            run = await aj.start_run("tenant-a", "agent", {})
            with pytest.raises(InvalidIdError):
                async with run.node("n\x1fx"):
                    pass
            with pytest.raises(InvalidIdError):
                await run.call(Charge(), {"who": "a"}, step="\u202e")  # a bidi override (Cf)
            await run.succeed()

    asyncio.run(main())

"""A run started before the id rules (issue 28, case 2) whose id they refuse is parked by recovery, not handed to an
instance that would refuse to resume it (its idempotency keys may be another run's); ``continue_run`` refuses it
before anything is fenced or published."""

from __future__ import annotations

import pytest

from runjournal.consumers.recovery import continue_run
from runjournal.consumers.recovery.job import RecoveryJob
from runjournal.core import redis_client
from runjournal.core.ids import InvalidIdError
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from tests.support.faults import live, owned, owns
from tests.support.workload import publish, run_events

pytestmark = pytest.mark.integration


def test_a_legacy_run_id_is_parked_and_a_valid_one_beside_it_resumed(topics: Settings) -> None:
    legacy, valid = "legacy\x1fid", "valid-id"
    publish(topics, [*run_events(legacy, finish=False), *run_events(valid, finish=False)])
    owns(topics, "agent-1", legacy, valid)
    live(topics, "taker")
    job = RecoveryJob(topics)
    try:
        report = job.recover(stale=True)
    finally:
        job.close()
    outcomes = {o.run_id: o for o in report.runs}
    assert outcomes[valid].action == "resumed"
    assert outcomes[legacy].action == "parked"
    assert outcomes[legacy].detail.startswith("the run id breaks the id rules (control character: U+001F")
    parked = redis_client.client(topics).smembers(RedisKeys(topics.topic_prefix).parked())
    assert {p.decode() for p in parked} == {legacy}
    assert owned(topics, "agent-1") == set() and owned(topics, "taker") == {valid}


class _Untouchable:
    """A journal any use of which fails the test: ``continue_run`` must refuse the id first."""

    def __getattr__(self, name: str) -> None:
        pytest.fail(f"continue_run used the journal ({name}) before checking the run id")


def test_continue_run_refuses_an_invalid_run_id_first() -> None:
    with pytest.raises(InvalidIdError, match="run id"):
        continue_run(_Untouchable(), "k\x1fn")  # type: ignore[arg-type]

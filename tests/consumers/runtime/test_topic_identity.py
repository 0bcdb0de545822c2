"""The topic check every pass makes (``runtime.topic_identity.check_topic``) under a projector applying meanwhile.

A one-shot recovery pass or an operator's cancel under load was told "the topic was re-created or truncated; repair:
runjournal projector --rebuild" (a user's chaos run: 1 pass in 30): the log ends were read before the applied offsets,
and a caught-up projector applied records that ended after them. The offsets are now read first.
"""

from __future__ import annotations

import pytest

from runjournal.consumers.runtime.partitions import watermarks
from runjournal.consumers.runtime.topic_identity import TopicMismatchError, check_topic
from runjournal.core import redis_client
from runjournal.core.settings import Settings
from runjournal.schemas.keys import partition_for
from tests.support.workload import publish

pytestmark = pytest.mark.integration


def test_offsets_applied_while_the_topic_is_checked_are_not_a_truncated_log(topics: Settings) -> None:
    client = redis_client.client(topics)
    partition = partition_for("busy-run", topics.partitions)
    publish(topics, [(f"busy-run:1:{i}", b"x") for i in range(1, 4)])

    def projector_applies_meanwhile(n: int) -> dict[int, int]:
        """Between the first look at the topic and the offsets: more records land and a caught-up projector applies
        them (its applied offset is the last record's)."""
        publish(topics, [(f"busy-run:1:{i}", b"x") for i in range(4, 9)])
        high = watermarks(topics, [partition])[partition][1]
        return {p: (high - 1 if p == partition else -1) for p in range(n)}

    shape = check_topic(topics, client, topics.topic_prefix, projector_applies_meanwhile, adopt=False)
    assert shape.ranges[partition][1] >= 8
    # a truly truncated log (an offset past the end read after it) is still refused
    with pytest.raises(TopicMismatchError, match="re-created or truncated"):
        check_topic(topics, client, topics.topic_prefix, lambda n: {partition: 10_000}, adopt=False)

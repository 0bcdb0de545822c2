"""An event's identity and time: ``new_event_id`` (uuid4 text drawn in bulk) and ``utcnow`` (ms, UTC)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from runjournal.schemas import new_event_id, utcnow


def _is_uuid4_text(text: str) -> bool:
    parsed = uuid.UUID(text)
    return str(parsed) == text and parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_ids_are_canonical_uuid4_text_and_unique() -> None:
    ids = [new_event_id() for _ in range(20_000)]  # ~78 draws of 256
    assert all(len(i) == 36 and _is_uuid4_text(i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_every_random_bit_of_the_ids_varies() -> None:
    """Each of the 122 random bits is set in about half of 8192 ids (a stuck or copied column would not be)."""
    ones = Counter[int]()
    n = 8192
    for _ in range(n):
        value = uuid.UUID(new_event_id()).int
        ones.update(bit for bit in range(128) if value >> bit & 1)
    fixed = {76, 77, 78, 79, 62, 63}  # the version nibble (0100) and the variant's two bits (10)
    assert {bit for bit in fixed if ones[bit]} == {78, 63}
    assert all(ones[bit] == n for bit in (78, 63))
    assert all(0.45 * n < ones[bit] < 0.55 * n for bit in range(128) if bit not in fixed)


def test_ids_drawn_from_many_threads_are_unique() -> None:
    out: list[list[str]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def draw(bucket: list[str]) -> None:
        start.wait()
        bucket.extend(new_event_id() for _ in range(5_000))

    threads = [threading.Thread(target=draw, args=(bucket,)) for bucket in out]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for bucket in out for i in bucket]
    assert len(every) == 40_000 and len(set(every)) == 40_000


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_never_repeats_its_parents_ids() -> None:
    new_event_id()  # the parent holds a draw with ids left in it
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: write 300 ids (more than one draw) and leave at once
        os.close(read)
        os.write(write, ",".join(new_event_id() for _ in range(300)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read().split(",")
    os.waitpid(pid, 0)
    parent = [new_event_id() for _ in range(300)]
    assert len(child) == 300 and all(_is_uuid4_text(i) for i in child)
    assert not set(child) & set(parent)


def test_utcnow_is_aware_utc_truncated_to_the_millisecond_and_now() -> None:
    for _ in range(2_000):
        before = datetime.now(UTC)
        now = utcnow()
        after = datetime.now(UTC)
        assert now.tzinfo is UTC and now.microsecond % 1000 == 0
        assert before.replace(microsecond=before.microsecond // 1000 * 1000) <= now <= after


def test_utcnow_moves_on_with_the_clock() -> None:
    first = utcnow()
    time.sleep(0.005)
    later = utcnow()
    assert later - first >= timedelta(milliseconds=4)
    assert later is not first

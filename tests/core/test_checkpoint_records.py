"""Framework record keys ``<thread>␟<kind>␟<field>`` (``runjournal.core.checkpoint_records``) split back into their
parts: thread ids and field parts hold no U+001F (issue 28, case 2), and erase/rebuild recognise a thread's records
exactly, even beside a thread from before the rules whose id starts with ``<thread>␟``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runjournal.core.checkpoint_records import KINDS, SEP, join_field, of_thread, record_key, thread_key_prefix
from runjournal.core.ids import InvalidIdError


def test_keys_keep_the_format_written_before_the_rules() -> None:
    assert record_key("thread-1", "cp", join_field("", "ckpt-1")) == "thread-1\x1fcp\x1f\x1fckpt-1"
    assert join_field("ns", "chan", "00000000000000000000000000000001.0.5") == \
        "ns\x1fchan\x1f00000000000000000000000000000001.0.5"


def test_a_separator_inside_an_id_or_a_part_is_refused() -> None:
    with pytest.raises(InvalidIdError, match="thread id"):
        record_key("a\x1fcp", "cp", "x")
    with pytest.raises(InvalidIdError, match="thread id"):
        record_key("a{b}", "cp", "x")  # the thread is its Redis hash tag
    with pytest.raises(InvalidIdError, match="checkpoint key part"):
        join_field("ns", "chan\x1fnel", "1")
    with pytest.raises(ValueError, match="kind"):
        record_key("t", "nope", "x")


def test_of_thread_takes_a_threads_records_and_no_legacy_neighbours() -> None:
    mine = record_key("a", "blob", join_field("", "messages", "3")).encode()
    legacy = b"a\x1fx\x1fcp\x1f\x1fckpt"  # thread "a\x1fx", written before the rules
    assert legacy.startswith(thread_key_prefix("a"))  # the old prefix test took it for thread "a"
    assert of_thread(mine, "a") and not of_thread(legacy, "a") and of_thread(legacy, "a\x1fx")
    assert not of_thread(None, "a") and not of_thread(b"a\x1fcp", "a") and not of_thread(b"ab\x1fcp\x1fx", "a")


parts = st.lists(st.text(max_size=8), min_size=1, max_size=4)


@given(st.text(max_size=10), st.sampled_from(KINDS), parts)
def test_an_accepted_key_splits_back_into_exactly_its_parts(thread: str, kind: str, fields: list[str]) -> None:
    try:
        key = record_key(thread, kind, join_field(*fields))
    except InvalidIdError:
        return
    got_thread, got_kind, field = key.split(SEP, 2)
    assert (got_thread, got_kind, field.split(SEP)) == (thread, kind, fields)
    assert of_thread(key.encode(), thread)

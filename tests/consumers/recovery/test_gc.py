"""The recovery pass's pause of the cyclic garbage collector (``runjournal.consumers.recovery._gc``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from runjournal.consumers.recovery._gc import collector_paused


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_the_pause_ends_as_it_began_and_is_lifted_only_where_it_disabled() -> None:
    gc.enable()
    with collector_paused() as pause:
        assert not gc.isenabled()
        with pause.lifted():  # a long wait inside the pass (a tool timeout): the collector runs meanwhile
            assert gc.isenabled()
        assert not gc.isenabled()
        with collector_paused() as inner:  # nested: found it disabled, so never enables it
            with inner.lifted():
                assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_disabled_by_the_host_stays_disabled() -> None:
    gc.disable()
    with collector_paused() as pause, pause.lifted():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_an_exception_inside_the_pass_still_ends_the_pause() -> None:
    gc.enable()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("the pass failed")
    assert gc.isenabled()

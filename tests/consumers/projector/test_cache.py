"""The projector's state cache (``consumers/projector/_cache.py``): states and known runs valid at one offset only."""

from __future__ import annotations

from runjournal.consumers.projector._cache import StateCache
from runjournal.model.reducer import RunState, RunStatus


def state(run_id: str, status: RunStatus = RunStatus.RUNNING) -> RunState:
    return RunState(run_id=run_id, tenant_id="acme", status=status)


def test_a_run_outside_the_known_runs_is_not_loaded_and_one_inside_is() -> None:
    cache = StateCache()
    cache.know(0, 41, {"old"})
    found, load = cache.split(0, 41, {"old", "new"})
    assert found == {} and load == ["old"] and cache.absent == 1


def test_written_runs_become_known_erased_and_terminal_ones_are_handled() -> None:
    cache = StateCache()
    cache.know(0, 41, {"gone", "ended"})
    cache.advance(0, 41, 50, {"new": state("new"), "gone": None, "ended": state("ended", RunStatus.SUCCEEDED)})
    found, load = cache.split(0, 50, {"new", "gone", "ended", "other"})
    assert set(found) == {"new"}  # cached
    assert load == ["ended"]  # terminal: not cached, but Redis holds it
    # "gone" was erased by the write and "other" was never written: Redis holds neither


def test_knowledge_is_valid_at_its_offset_only() -> None:
    cache = StateCache()
    cache.know(0, 41, set())
    assert sorted(cache.split(0, 40, {"a", "b"})[1]) == ["a", "b"]  # another offset: everything is loaded
    cache.advance(0, 39, 60, {"a": state("a")})  # a batch that did not start at 41: the knowledge is gone
    assert sorted(cache.split(0, 60, {"a", "b"})[1]) == ["b"]
    cache.drop(0)
    assert sorted(cache.split(0, 60, {"a", "b"})[1]) == ["a", "b"]


def test_no_knowledge_beyond_its_bound_or_with_the_cache_off() -> None:
    big = StateCache(max_known=2)
    big.know(0, 1, {"a", "b", "c"})
    assert sorted(big.split(0, 1, {"a", "z"})[1]) == ["a", "z"]
    grows = StateCache(max_known=2)
    grows.know(0, 1, {"a"})
    grows.advance(0, 1, 2, {"b": state("b"), "c": state("c")})
    assert sorted(grows.split(0, 2, {"z"})[1]) == ["z"]  # outgrew the bound: unknown again
    off = StateCache(max_runs=0)
    off.know(0, 1, set())
    assert off.split(0, 1, {"z"})[1] == ["z"]

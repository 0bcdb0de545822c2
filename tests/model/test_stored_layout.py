"""The run state as hash fields (``runjournal.model.stored``) and its persistent maps (``runjournal.model.pmap``).

Issue 29: a batch writes only the fields it changed. Properties over the generated runs of
``test_reducer_properties``: applying each batch's field diff to a simulated hash gives exactly the folded state's
fields, and reading the hash back gives the folded state (same digest); the record counts the index shows equal a
count of the records.
"""

from __future__ import annotations

import pickle
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from runjournal.model.pmap import CHAIN_LIMIT, PMap, RecordMap
from runjournal.model.reducer import CallStatus, ExecutionRecord, RunState, RunStatus, fold, state_digest
from runjournal.model.stored import LARGE_FIELDS, SCALAR_FIELD, field_diff, state_fields, state_from_fields
from tests.model.test_reducer_properties import PROPS, positioned_runs


def _record(call_id: str, status: CallStatus) -> ExecutionRecord:
    return ExecutionRecord(call_id=call_id, tool="t", idempotency_key=call_id, args_digest="d", side_effect=True,
                           status=status, attempts=1, epoch=1)


def test_pmap_compares_equal_to_dicts_and_keeps_the_old_map() -> None:
    a = PMap({"x": 1})
    b = a.set("y", 2)
    assert a == {"x": 1} and {"x": 1} == a and b == {"x": 1, "y": 2} and a != b
    assert b.delete("x") == {"y": 2} and b.delete("nope") is b
    assert pickle.loads(pickle.dumps(b)) == b


def test_pmap_changed_since_walks_the_chain_or_scans() -> None:
    base = PMap({str(i): i for i in range(100)})
    after = base.set("5", 55).delete("7").set("new", 1)
    assert after.changed_since(base) == {"5", "7", "new"}
    assert after.changed_since(after) == set()
    assert after.changed_since(None) == set(after)
    # not derived from it: a scan by identity (same values are the same objects here: small ints)
    assert PMap(dict(after)).changed_since(base) == {"5", "7", "new"}
    # past the chain's bound: still right (a scan)
    long = base
    for i in range(CHAIN_LIMIT + 10):
        long = long.set(f"k{i}", i)
    assert long.changed_since(base) == {f"k{i}" for i in range(CHAIN_LIMIT + 10)}


def test_record_map_counts_by_status() -> None:
    m = RecordMap({"a": _record("a", CallStatus.OUTCOME_UNKNOWN), "b": _record("b", CallStatus.COMMITTED)})
    assert (m.unknown, m.reconciled) == (1, 0)
    m2 = m.set("a", _record("a", CallStatus.RECONCILED)).set("c", _record("c", CallStatus.OUTCOME_UNKNOWN))
    assert (m2.unknown, m2.reconciled) == (1, 1) and (m.unknown, m.reconciled) == (1, 0)
    assert (m2.delete("c").unknown, m2.delete("a").reconciled) == (0, 0)


def test_a_state_built_with_dicts_gets_persistent_maps_and_round_trips() -> None:
    state = RunState(run_id="r:1", tenant_id="t", status=RunStatus.RUNNING,
                     records={"c:1": _record("c:1", CallStatus.INTENDED)}, approvals={})
    assert isinstance(state.records, RecordMap) and isinstance(state.nodes, PMap)
    assert state.records == {"c:1": _record("c:1", CallStatus.INTENDED)}
    fields = state_fields(state)
    # the id's own ':' is kept: the name splits at the first
    assert set(fields) == {SCALAR_FIELD, b"r:c:1", *LARGE_FIELDS.values()}
    back = state_from_fields(fields)
    assert back == state and state_digest(back) == state_digest(state)
    assert RunState.from_json(state.to_json()) == state


@given(positioned_runs(), st.data())
@PROPS
def test_batch_diffs_applied_to_the_hash_give_the_folded_state(generated, data) -> None:  # noqa: ANN001
    _run, items = generated
    cuts = sorted(data.draw(st.sets(st.integers(0, len(items)), max_size=6)))
    stored: dict[bytes, bytes] = {}
    state: RunState | None = None
    for lo, hi in zip([0, *cuts], [*cuts, len(items)], strict=True):
        after = fold(items[lo:hi], state)
        if after is None or after is state:
            continue
        if state is None:
            stored = state_fields(after)
        else:
            sets, dels = field_diff(state, after)
            for name in dels:
                stored.pop(name, None)
            stored.update(sets)
        assert stored == state_fields(after)
        back = state_from_fields(stored)
        assert state_digest(back) == state_digest(after) and back == after
        counts = Counter(r.status for r in after.records.values())
        assert isinstance(after.records, RecordMap)
        assert (after.records.unknown, after.records.reconciled) == (counts[CallStatus.OUTCOME_UNKNOWN],
                                                                     counts[CallStatus.RECONCILED])
        state = after


def test_forgetting_history_keeps_entries_and_later_diffs() -> None:
    base = PMap({"a": 1})
    written = base.set("b", 2).set("c", 3)
    written.forget_history()
    assert written == {"a": 1, "b": 2, "c": 3}
    nxt = written.set("d", 4).delete("a")
    assert nxt.changed_since(written) == {"d", "a"}  # O(changes) against the state written last
    assert nxt.changed_since(base) == {"b", "c", "d", "a"}  # against an older one: a scan, still right

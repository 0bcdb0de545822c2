"""Contract suites of the execution stores (docs/design/protocol.md § Planes and stores), shared by every backend.

A backend supplies only fixtures; the suites are the classes here. Subclass one in a ``Test…`` class::

    from runjournal.testing import EventStoreContract, InMemoryEventStore

    class TestMyEventStore(EventStoreContract):
        @pytest.fixture
        def event_store(self):
            return MyEventStore(...)          # empty, appendable

* :class:`EventStoreContract` — fixture ``event_store``: a fresh, empty :class:`~runjournal.stores.EventStore`.
* :class:`RunStoreContract` — fixtures ``run_store`` (the StateStore + ExecutionRecordStore + CheckpointStore under
  test, holding :func:`contract_runs` as appended to ``contract_events`` and fully applied) and
  ``contract_events`` (that EventStore). Its answers must equal a fresh fold of ``contract_events``
  (:class:`~runjournal.testing.FoldingRunStore`), record for record and digest for digest.

The project runs both against its own backends (the Kafka topic, the Redis projection) and the fakes
(``tests/stores/test_execution_contracts.py``).
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from runjournal.model import CallStatus, RunStatus, state_digest
from runjournal.schemas import Event, EventType
from runjournal.schemas.keys import partition_for
from runjournal.stores import Authority, CheckpointStore, EventStore, ExecutionRecordStore, Plane, StateStore
from runjournal.testing.fakes import FoldingRunStore

__all__ = ["EventStoreContract", "RunStoreContract", "contract_runs"]

_T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _run(run_id: str, *, calls: int, finish: bool = True) -> list[Event]:
    rng = random.Random(run_id)
    seq = 0

    def ev(etype: EventType, payload: dict[str, Any], node: str | None = "main") -> Event:
        nonlocal seq
        seq += 1
        return Event(event_id=str(uuid.UUID(int=rng.getrandbits(128))), run_id=run_id, tenant_id="acme", seq=seq,
                     epoch=1, producer_id="agent-1", type=etype, occurred_at=_T0 + timedelta(milliseconds=seq),
                     payload=payload, node_id=node)

    out = [ev(EventType.RUN_STARTED, {"agent": "airline", "input_json": '{"q": 1}', "user_id": "u1"}, None),
           ev(EventType.NODE_STARTED, {"node_path": "main", "attempt": 1})]
    for i in range(calls):
        tool = {"call_id": f"c{i}", "tool": "book_flight", "idempotency_key": f"{run_id}-k{i}", "args_digest": f"a{i}"}
        out.append(ev(EventType.TOOL_CALL_INTENDED, {**tool, "side_effect": True, "attempt": 1, "timeout_ms": 1000,
                                                     "args_json": '{"x": 1}'}))
        out.append(ev(EventType.TOOL_CALL_COMMITTED, {**tool, "result_json": f'{{"ok": {i}}}',
                                                      "result_digest": f"r{i}"}))
    if not finish:  # left in flight: an intent without outcome, an approval pending on another call
        tool = {"call_id": "send", "tool": "send_email", "idempotency_key": f"{run_id}-k", "args_digest": "a"}
        out.append(ev(EventType.TOOL_CALL_INTENDED, {**tool, "side_effect": True, "attempt": 1, "timeout_ms": 1000,
                                                     "args_json": "{}"}))
        out.append(ev(EventType.APPROVAL_REQUESTED, {"call_id": "refund", "reason": "big", "tool": "refund"}))
        return out
    out.append(ev(EventType.MESSAGE, {"role": "user", "content": "thanks", "user_id": None}))
    out.append(ev(EventType.NODE_SUCCEEDED, {"node_path": "main"}))
    out.append(ev(EventType.RUN_SUCCEEDED, {"output_json": '"done"'}, None))
    return out


def contract_runs() -> dict[str, list[Event]]:
    """The runs the suites store: ``done-1`` (2 committed calls), ``done-2`` (1), both SUCCEEDED, and ``open-1`` in
    flight (one call INTENDED, one approval pending). The same events on every call (seeded ids)."""
    return {"done-1": _run("done-1", calls=2), "done-2": _run("done-2", calls=1),
            "open-1": _run("open-1", calls=0, finish=False)}


class EventStoreContract:
    """What every :class:`~runjournal.stores.EventStore` guarantees. Fixture: ``event_store`` (fresh, empty)."""

    def test_it_declares_the_execution_plane_and_authority(self, event_store: EventStore) -> None:
        assert isinstance(event_store, EventStore)
        assert (event_store.plane, event_store.authority) == (Plane.EXECUTION, Authority.AUTHORITATIVE)

    def test_append_then_read_by_run_returns_each_run_in_order(self, event_store: EventStore) -> None:
        runs = contract_runs()
        for events in runs.values():
            positions = event_store.append(events)
            assert len({p.partition for p in positions}) == 1  # one run, one partition
            assert [p.offset for p in positions] == sorted(p.offset for p in positions)
        for run_id, events in runs.items():
            stored = event_store.read_run(run_id)
            assert [r.event.event_id for r in stored if r.event] == [e.event_id for e in events]  # nothing else
            assert [r.key for r in stored] == [e.key for e in events]
            assert [(r.event.type, r.event.seq, r.event.occurred_at) for r in stored if r.event] == \
                [(e.type, e.seq, e.occurred_at) for e in events]

    def test_read_by_offset_is_append_only_and_repeatable(self, event_store: EventStore) -> None:
        runs = contract_runs()
        positions = event_store.append(runs["done-1"])
        first = positions[0]
        page = event_store.read_from(first.partition, first.offset, limit=3)
        assert [r.offset for r in page] == [p.offset for p in positions[:3]]
        event_store.append(runs["done-2"])  # appending never changes what was read
        assert event_store.read_from(first.partition, first.offset, limit=3) == page
        assert event_store.read_from(first.partition, positions[-1].offset + 10_000) == []


class RunStoreContract:
    """What every StateStore + ExecutionRecordStore + CheckpointStore guarantees. Fixtures: ``run_store`` and
    ``contract_events`` (module docstring)."""

    def test_it_is_all_three_execution_contracts(self, run_store: Any) -> None:
        assert isinstance(run_store, StateStore) and isinstance(run_store, ExecutionRecordStore)
        assert isinstance(run_store, CheckpointStore)
        assert (run_store.plane, run_store.authority) == (Plane.EXECUTION, Authority.DERIVED)

    def test_state_is_the_fold_of_the_run_at_its_version(self, run_store: StateStore,
                                                         contract_events: EventStore) -> None:
        reference = FoldingRunStore(contract_events)
        for run_id in contract_runs():
            state, expected = run_store.get(run_id), reference.get(run_id)
            assert state is not None and expected is not None and state_digest(state) == state_digest(expected)
            assert run_store.version(run_id) == (state.applied_partition, state.applied_offset)
        assert run_store.get("never-ran") is None and run_store.version("never-ran") is None
        done = run_store.get("done-1")
        assert done is not None and done.status is RunStatus.SUCCEEDED

    def test_records_say_what_each_call_did(self, run_store: ExecutionRecordStore) -> None:
        done = run_store.records("done-1")
        assert sorted(done) == ["c0", "c1"] and all(r.status is CallStatus.COMMITTED for r in done.values())
        send = run_store.record("open-1", "send")
        assert send is not None and send.status is CallStatus.INTENDED
        assert run_store.record("open-1", "nope") is None and run_store.records("never-ran") == {}

    def test_a_checkpoint_covers_its_offset_and_names_what_is_pending(self, run_store: CheckpointStore,
                                                                     contract_events: Any) -> None:
        cp = run_store.checkpoint("open-1")
        assert cp is not None
        partitions = getattr(contract_events, "partitions", None)
        if isinstance(partitions, int):
            assert cp.partition == partition_for("open-1", partitions)
        assert cp.partition == cp.state.applied_partition
        assert cp.offset == cp.state.applied_offset <= cp.partition_offset == run_store.applied_offset(cp.partition)
        assert cp.unsettled_calls == ("send",) and cp.pending_approvals == ("refund",)
        done = run_store.checkpoint("done-1")
        assert done is not None and done.unsettled_calls == () and run_store.checkpoint("never-ran") is None

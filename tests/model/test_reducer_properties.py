"""Hypothesis properties of the pure reducer over generated, valid runs.

A generated run is what one partition would hold for one run: RUN_STARTED, then random nodes,
tool calls (intent -> commit / failure / retry), approvals, messages and corrections, optionally
up to two resumes (epoch + 1) after which the superseded owner keeps writing as a zombie, and
optionally a terminal event followed by late events. Positions are (partition, offset) with
gaps between offsets (other runs' events interleave in the partition).

Properties: (a) redelivery is idempotent; (b) prefix + rest (through a JSON snapshot) equals the
whole fold; (c) a permutation that breaks seq order parks the run, never a wrong live state;
(d) to_json/from_json preserves the digest; (e) transcripts change nothing but seq/positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from runjournal.model.reducer import (
    DUPLICATE_WINDOW,
    CallStatus,
    RunState,
    RunStatus,
    apply,
    fold,
    state_digest,
)
from runjournal.schemas.events import CONTROL_FLOW_TYPES, Event, EventType

T = EventType
T0 = datetime(2026, 3, 1, tzinfo=UTC)
PARTITION = 5
RUN_ID = "run-p"
TRANSCRIPT = (T.MESSAGE, T.USER_CORRECTION)
PROPS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Positioned = tuple[Event, int, int]


@dataclass
class GeneratedRun:
    """A valid run's events in partition order, with what the generator knows about each."""

    events: list[Event] = field(default_factory=list)
    zombie: list[bool] = field(default_factory=list)
    """Per event: written by a superseded epoch after the RUN_RESUMED that superseded it."""
    resume_index: dict[int, int] = field(default_factory=dict)
    """epoch -> index of the RUN_RESUMED that raised the run to it."""
    stale_control_flow: int = 0
    """Zombie control-flow events (the reducer must reject exactly these)."""
    late_control_flow: int = 0
    """Control-flow events of the live epoch after the terminal event (ignored and counted)."""
    committed_calls: set[str] = field(default_factory=set)
    """call_ids with a commit fact from anyone (live commit, zombie commit, reconciled as COMMITTED)."""


def _tool(call_id: str) -> dict[str, Any]:
    return {
        "call_id": call_id,
        "tool": "http",
        "idempotency_key": f"k-{call_id}",
        "args_digest": f"a-{call_id}",
    }


class _Sim:
    """The agent (and its zombies) writing one run; ``draw`` decides every choice."""

    def __init__(self, draw: Any) -> None:
        self.draw = draw
        self.out = GeneratedRun()
        self.seq = 0
        self.epoch = 1
        self.zombie_seq: dict[int, int] = {}  # superseded epoch -> its writer's next seq
        self.open: list[str] = []  # intended in this epoch, no outcome yet
        self.retryable: list[str] = []  # failed or reconciled as not done: may be intended again
        self.unknown: dict[str, int] = {}  # intended by a superseded epoch -> that epoch
        self.pending: list[str] = []
        self.zombie_calls: dict[int, list[str]] = {}  # superseded epoch -> calls its zombie intended
        self.terminal = False
        self.counter = 0

    def emit(self, type_: EventType, *, epoch: int | None = None, **payload: Any) -> None:
        zombie = epoch is not None and epoch < self.epoch
        if zombie:
            assert epoch is not None
            seq = self.zombie_seq[epoch]
            self.zombie_seq[epoch] += 1
            self.out.stale_control_flow += int(type_ in CONTROL_FLOW_TYPES)
        else:
            self.seq += 1
            seq = self.seq
        index = len(self.out.events)
        self.out.events.append(
            Event(
                event_id=f"ev-{index:03d}",
                run_id=RUN_ID,
                tenant_id="tenant-p",
                seq=seq,
                epoch=self.epoch if epoch is None else epoch,
                producer_id=f"inst-{self.epoch if epoch is None else epoch}",
                type=type_,
                occurred_at=T0 + timedelta(milliseconds=1500 * index),
                payload=payload,
            )
        )
        self.out.zombie.append(zombie)

    def new_id(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def pick(self, items: list[str]) -> str:
        return items.pop(self.draw(st.integers(0, len(items) - 1)))

    def text(self) -> str:
        return self.draw(st.text(max_size=12))

    # ------------------------------------------------------------- actions (False = not applicable)

    def node(self) -> bool:
        path = self.new_id("n")
        self.emit(T.NODE_STARTED, node_path=path, attempt=1)
        if self.draw(st.booleans()):
            self.emit(T.NODE_SUCCEEDED, node_path=path, output_digest="od")
        else:
            self.emit(T.NODE_FAILED, node_path=path, error="boom", retryable=self.draw(st.booleans()))
        return True

    def intend(self) -> bool:
        if self.retryable and self.draw(st.booleans()):
            call_id = self.pick(self.retryable)
        else:
            call_id = self.new_id("c")
        self.emit(T.TOOL_CALL_INTENDED, side_effect=True, attempt=1, timeout_ms=5000, **_tool(call_id))
        self.open.append(call_id)
        return True

    def outcome(self) -> bool:
        if not self.open:
            return False
        call_id = self.pick(self.open)
        if self.draw(st.booleans()):
            self.emit(T.TOOL_CALL_COMMITTED, result_digest="rd", result_json="{}", **_tool(call_id))
            self.out.committed_calls.add(call_id)
        else:
            self.emit(T.TOOL_CALL_FAILED, error="503", retryable=True, **_tool(call_id))
            self.retryable.append(call_id)
        return True

    def request(self) -> bool:
        call_id = self.new_id("a")
        self.emit(T.APPROVAL_REQUESTED, call_id=call_id, reason="policy", tool="http")
        self.pending.append(call_id)
        return True

    def decide(self) -> bool:
        if not self.pending:
            return False
        call_id = self.pick(self.pending)
        kind = self.draw(st.sampled_from([T.APPROVAL_GRANTED, T.APPROVAL_DENIED]))
        self.emit(kind, call_id=call_id, approver="alice")
        return True

    def message(self) -> bool:
        self.emit(T.MESSAGE, role="assistant", content=self.text())
        return True

    def correction(self) -> bool:
        self.emit(T.USER_CORRECTION, subject="s", text=self.text())
        return True

    def resume(self) -> bool:
        if self.epoch >= 3:
            return False
        old = self.epoch
        self.zombie_seq[old] = self.seq + 1  # the superseded writer carries on from its own view
        self.unknown.update(dict.fromkeys(self.open, old))
        self.open = []
        self.epoch += 1
        self.out.resume_index[self.epoch] = len(self.out.events)
        self.emit(T.RUN_RESUMED, previous_epoch=old, recovered_by="rec", plan_json="{}", assigned_to="inst-new")
        return True

    def reconcile(self) -> bool:
        candidates = sorted(self.unknown)
        if not candidates:
            return False
        call_id = self.pick(candidates)
        del self.unknown[call_id]
        outcome = self.draw(st.sampled_from(["COMMITTED", "NOT_EXECUTED", "FAILED"]))
        self.emit(T.TOOL_CALL_RECONCILED, outcome=outcome, result_digest="rd", **_tool(call_id))
        if outcome == "COMMITTED":
            self.out.committed_calls.add(call_id)
        else:
            self.retryable.append(call_id)
        return True

    def zombie(self) -> bool:
        """The superseded owner of an older epoch keeps writing (an unfenced zombie)."""
        if not self.zombie_seq:
            return False
        epoch = self.draw(st.sampled_from(sorted(self.zombie_seq)))
        mine = sorted(c for c, e in self.unknown.items() if e == epoch) + self.zombie_calls.get(epoch, [])
        outcomes = ["commit", "commit", "fail", "fail"] if mine else []
        choice = self.draw(st.sampled_from(["node", "intend", "message", *outcomes]))
        if choice == "node":
            self.emit(T.NODE_STARTED, epoch=epoch, node_path=self.new_id("zn"), attempt=1)
        elif choice == "intend":
            call_id = self.new_id("zc")
            self.emit(T.TOOL_CALL_INTENDED, epoch=epoch, side_effect=True, attempt=1, timeout_ms=1, **_tool(call_id))
            self.zombie_calls.setdefault(epoch, []).append(call_id)
        elif choice == "message":
            self.emit(T.MESSAGE, epoch=epoch, role="assistant", content=self.text())
        else:
            call_id = mine[self.draw(st.integers(0, len(mine) - 1))]
            if choice == "commit":
                self.emit(T.TOOL_CALL_COMMITTED, epoch=epoch, result_digest="zrd", **_tool(call_id))
                self.out.committed_calls.add(call_id)
            else:
                self.emit(T.TOOL_CALL_FAILED, epoch=epoch, error="zombie 500", retryable=True, **_tool(call_id))
        return True

    def finish(self) -> bool:
        kind = self.draw(st.sampled_from([T.RUN_SUCCEEDED, T.RUN_FAILED, T.RUN_CANCELLED]))
        payload = {T.RUN_SUCCEEDED: {"output_json": "{}"}, T.RUN_FAILED: {"error": "e"}}.get(kind, {"reason": "r"})
        self.emit(kind, **payload)
        self.terminal = True
        return True

    def late(self) -> bool:
        """After a terminal event: a stray control-flow event (ignored and counted)."""
        self.emit(T.NODE_STARTED, node_path=self.new_id("late"), attempt=1)
        self.out.late_control_flow += 1
        return True


@st.composite
def generated_runs(draw: Any, max_steps: int = 24) -> GeneratedRun:
    """A valid run of at most ~2 * max_steps + 2 events (below DUPLICATE_WINDOW)."""
    sim = _Sim(draw)
    sim.emit(T.RUN_STARTED, agent="agent", input_json="{}", user_id="u")
    if draw(st.booleans()):
        sim.emit(T.PLAN_COMPILED, plan_hash="ph", code_version="cv", nodes=["n1", "n2"])
    # repeated entries weight the choice: resumes and zombies are the interesting part
    live = [sim.node, sim.intend, sim.intend, sim.outcome, sim.outcome, sim.request, sim.decide]
    live += [sim.message, sim.correction, sim.resume, sim.resume, sim.reconcile, sim.reconcile]
    live += [sim.zombie, sim.zombie, sim.zombie, sim.finish]
    after_terminal = [sim.outcome, sim.message, sim.zombie, sim.late]
    for _ in range(draw(st.integers(0, max_steps))):
        actions = after_terminal if sim.terminal else live
        draw(st.sampled_from(actions))()
    assert len(sim.out.events) < DUPLICATE_WINDOW
    return sim.out


@st.composite
def positioned_runs(draw: Any) -> tuple[GeneratedRun, list[Positioned]]:
    """A generated run with strictly increasing offsets (random gaps) in one partition."""
    run = draw(generated_runs())
    offset = draw(st.integers(0, 10_000))
    items: list[Positioned] = []
    for event in run.events:
        offset += draw(st.integers(1, 4))
        items.append((event, PARTITION, offset))
    return run, items


def fold_all(items: list[Positioned], state: RunState | None = None) -> RunState:
    result = fold(items, state)
    assert result is not None
    return result


def states_along(items: list[Positioned]) -> list[RunState]:
    out, state = [], None
    for event, partition, offset in items:
        state = apply(state, event, partition=partition, offset=offset)
        out.append(state)
    return out


# --------------------------------------------------------------------------- sanity: generator + reducer


@PROPS
@given(positioned_runs())
def test_valid_runs_never_park_and_account_for_every_event(
    case: tuple[GeneratedRun, list[Positioned]],
) -> None:
    run, items = case
    state = fold_all(items)
    assert not state.parked, state.gap_reason or state.blocked_reason
    assert state.last_seq == sum(1 for z in run.zombie if not z)
    assert state.rejected_stale_epoch == run.stale_control_flow
    assert state.rejected_after_terminal == run.late_control_flow
    assert state.duplicates_ignored == 0 and state.skipped_while_parked == 0
    assert state.applied_offset == items[-1][2]
    committed = {c for c, r in state.records.items() if r.effect_committed}
    assert committed == run.committed_calls  # a commit fact from any source sticks
    for record in state.records.values():
        if record.status is CallStatus.INTENDED:  # only the current owner can still report it
            assert record.epoch == state.epoch


# --------------------------------------------------------------------------- (a) redelivery


@PROPS
@given(positioned_runs(), st.data())
def test_a_redelivered_batches_at_original_offsets_change_nothing(
    case: tuple[GeneratedRun, list[Positioned]], data: st.DataObject
) -> None:
    _, items = case
    once = fold_all(items)
    # a consumer that crashes after applying up to `stop` and resumes from an earlier `restart`
    stream: list[Positioned] = []
    position = 0
    for _ in range(data.draw(st.integers(1, 4))):
        stop = data.draw(st.integers(position, len(items)))
        stream += items[position:stop]
        position = data.draw(st.integers(0, stop))
    stream += items[position:]
    assert state_digest(fold_all(stream)) == state_digest(once)
    # and any subsequence re-applied on top of the full fold
    again = data.draw(st.lists(st.sampled_from(items), max_size=len(items)))
    assert fold_all(again, once) is once


@PROPS
@given(positioned_runs(), st.data())
def test_a_redelivered_events_at_new_offsets_are_counted_and_ignored(
    case: tuple[GeneratedRun, list[Positioned]], data: st.DataObject
) -> None:
    """Retried sends (same event_id) land at new offsets, after the original and within the window."""
    run, _ = case
    originals = [(event, PARTITION, 10 * i) for i, event in enumerate(run.events)]
    stream: list[Positioned] = []
    copies = 0
    for i, item in enumerate(originals):
        stream.append(item)
        for k in range(data.draw(st.integers(0, 2))):
            event = run.events[data.draw(st.integers(0, i))]
            stream.append((event, PARTITION, 10 * i + 1 + k))
            copies += 1
    with_copies, once = fold_all(stream), fold_all(originals)
    assert with_copies.duplicates_ignored == copies
    assert replace(with_copies, duplicates_ignored=0, applied_offset=once.applied_offset) == once


# --------------------------------------------------------------------------- (b) prefix + rest


@PROPS
@given(positioned_runs(), st.data())
def test_b_prefix_then_rest_through_a_json_snapshot_equals_the_whole(
    case: tuple[GeneratedRun, list[Positioned]], data: st.DataObject
) -> None:
    _, items = case
    cut = data.draw(st.integers(1, len(items)))
    snapshot = RunState.from_json(fold_all(items[:cut]).to_json())  # what Redis holds
    assert state_digest(fold_all(items[cut:], snapshot)) == state_digest(fold_all(items))


# --------------------------------------------------------------------------- (c) permutations


def _order_broken(run: GeneratedRun, order: list[int]) -> bool:
    """Mainline (seq-consuming) events out of order, or a zombie event before its superseding resume."""
    mainline = [i for i in order if not run.zombie[i]]
    if mainline != sorted(mainline):
        return True
    where = {index: place for place, index in enumerate(order)}
    for i, event in enumerate(run.events):
        if run.zombie[i] and where[i] < where[run.resume_index[event.epoch + 1]]:
            return True
    return False


@PROPS
@given(positioned_runs(), st.data())
def test_c_a_permutation_breaking_seq_order_parks_instead_of_lying(
    case: tuple[GeneratedRun, list[Positioned]], data: st.DataObject
) -> None:
    run, items = case
    order = data.draw(st.permutations(range(len(items))))
    shuffled = [(run.events[i], PARTITION, place) for place, i in enumerate(order)]
    state = fold_all(shuffled)
    truth = fold_all(items)
    if _order_broken(run, order):
        assert state.status is RunStatus.GAP
        return
    # Only zombie facts moved among the later events: the live run and every commit are unchanged.
    assert not state.parked
    assert (state.status, state.epoch, state.last_seq, state.owner) == (
        truth.status,
        truth.epoch,
        truth.last_seq,
        truth.owner,
    )
    assert (state.nodes, state.pending_approvals, state.approvals) == (
        truth.nodes,
        truth.pending_approvals,
        truth.approvals,
    )
    committed = {c for c, r in state.records.items() if r.effect_committed}
    assert committed == {c for c, r in truth.records.items() if r.effect_committed}


@PROPS
@given(positioned_runs(), st.data())
def test_c_swapping_two_mainline_events_always_parks(
    case: tuple[GeneratedRun, list[Positioned]], data: st.DataObject
) -> None:
    run, items = case
    mainline = [i for i, z in enumerate(run.zombie) if not z]
    assume(len(mainline) >= 2)
    a, b = sorted(data.draw(st.lists(st.sampled_from(mainline), min_size=2, max_size=2, unique=True)))
    order = list(range(len(items)))
    order[a], order[b] = order[b], order[a]
    swapped = [(run.events[i], PARTITION, place) for place, i in enumerate(order)]
    assert fold_all(swapped).status is RunStatus.GAP


# --------------------------------------------------------------------------- (d) JSON round trip


@PROPS
@given(positioned_runs(), st.data())
def test_d_json_round_trip_preserves_the_digest_of_every_state(
    case: tuple[GeneratedRun, list[Positioned]], data: st.DataObject
) -> None:
    run, items = case
    if data.draw(st.booleans()):  # include parked states too
        order = data.draw(st.permutations(range(len(items))))
        items = [(run.events[i], PARTITION, place) for place, i in enumerate(order)]
    for state in states_along(items):
        back = RunState.from_json(state.to_json())
        assert back == state
        assert state_digest(back) == state_digest(state)


# --------------------------------------------------------------------------- (e) transcripts


@PROPS
@given(positioned_runs(), st.data())
def test_e_transcript_content_never_changes_execution_state(
    case: tuple[GeneratedRun, list[Positioned]], data: st.DataObject
) -> None:
    _, items = case
    rewritten: list[Positioned] = []
    for event, partition, offset in items:
        if event.type in TRANSCRIPT:
            text = data.draw(st.text(max_size=40))
            payload = (
                {"role": data.draw(st.sampled_from(["user", "assistant"])), "content": text}
                if event.type is T.MESSAGE
                else {"subject": data.draw(st.text(max_size=8)), "text": text, "user_id": "someone"}
            )
            event = replace(event, payload=payload)
        rewritten.append((event, partition, offset))
    for ours, theirs in zip(states_along(items), states_along(rewritten), strict=True):
        assert state_digest(ours) == state_digest(theirs)


@PROPS
@given(positioned_runs())
def test_e_a_transcript_event_moves_only_seq_and_positions(
    case: tuple[GeneratedRun, list[Positioned]],
) -> None:
    _, items = case
    before: RunState | None = None
    for (event, _, _), after in zip(items, states_along(items), strict=True):
        if event.type in TRANSCRIPT:
            assert before is not None
            assert (
                replace(
                    after,
                    last_seq=before.last_seq,
                    applied_offset=before.applied_offset,
                    recent_event_ids=before.recent_event_ids,
                )
                == before
            )
        before = after

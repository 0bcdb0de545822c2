"""Replay: rebuild any past state of a run from the journal, and re-execute agent code against it.

DESIGN.md § Replay is not resume: *replay rebuilds any past state (time travel) with
side-effecting tools replaced by their recorded results: the real provider's call count never
changes. resume continues a live run under a new epoch.* Nothing in this module publishes an
event, writes Redis or invokes a tool; Redis is only read for results stored by reference.

* :func:`replay_state` (``runjournal replay RUN_ID [--until-seq N]``): reads the run's records from
  its partition (``read_committed``, offset order) and folds them with the pure reducer, stopping
  as soon as ``last_seq`` reaches ``until_seq`` (the rule of ``consumers.reducer.fold``). An
  undecodable record parks the run BLOCKED and a tombstone erases it, as in the projector.
* :func:`replay_run`: calls ``agent_fn(handle)`` with a :class:`ReplayHandle` over that state; every
  ``handle.call`` returns the recorded result of its step's idempotency key (see
  ``consumers._replay_handle`` for the rules and errors).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict, cast

import redis

from consumers._partitions import run_partition
from consumers._replay_handle import (
    ReplayDivergedError,
    ReplayedCall,
    ReplayedToolError,
    ReplayEndReachedError,
    ReplayError,
    ReplayHandle,
    RunNotFoundError,
)
from consumers.inspect import read_run_events
from consumers.reducer import RunState, apply, block
from producers.results import ResultStore
from runjournal.settings import Settings
from schemas import Event

__all__ = [
    "AgentReplay",
    "ReplayDivergedError",
    "ReplayEndReachedError",
    "ReplayError",
    "ReplayHandle",
    "ReplayedCall",
    "ReplayedState",
    "ReplayedToolError",
    "RunNotFoundError",
    "TimelineRow",
    "replay_run",
    "replay_state",
]


class TimelineRow(TypedDict, total=False):
    """One record of the run as replay folded it."""

    offset: int
    """Its offset in the run's partition."""
    key: str
    """Record key ``{run_id}:{epoch}:{seq}``."""
    seq: int | None
    """Event seq (None for a tombstone or an undecodable record)."""
    epoch: int | None
    """Event epoch (None as for seq)."""
    type: str
    """Event type, ``TOMBSTONE`` or ``UNDECODABLE``."""
    node_id: str | None
    """Envelope ``node_id``."""
    error: str
    """UNDECODABLE only: the codec's error."""


@dataclass(frozen=True)
class ReplayedState:
    """A run's state as of a seq, rebuilt from the topic."""

    run_id: str
    """The run."""
    partition: int
    """Its partition of the events topic."""
    until_seq: int | None
    """The replay point asked for; None: the whole history."""
    state: RunState | None
    """The folded state (execution records included); None when the run has no event (or was erased)."""
    timeline: tuple[TimelineRow, ...]
    """The records folded, in offset order."""
    events: tuple[Event, ...]
    """The decoded events folded, in offset order."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-able: ``run_id``, ``partition``, ``until_seq``, ``state`` (``RunState.to_json`` as an object,
        or None), ``execution_records`` (sorted by intent offset) and ``timeline``."""
        state = json.loads(self.state.to_json()) if self.state is not None else None
        records = sorted((state or {}).get("records", {}).values(),
                         key=lambda r: (r["intended_offset"] is None, r["intended_offset"] or 0, r["call_id"]))
        return {"run_id": self.run_id, "partition": self.partition, "until_seq": self.until_seq, "state": state,
                "execution_records": records, "timeline": [dict(row) for row in self.timeline]}


@dataclass(frozen=True)
class AgentReplay:
    """What re-executing agent code against a recording gave."""

    replayed: ReplayedState
    """The state the code was replayed against."""
    value: Any
    """``agent_fn``'s return value (None when the replay stopped early)."""
    calls: tuple[ReplayedCall, ...]
    """Every call the code made, answered from the recording, in order."""
    stopped: str | None
    """Why the code stopped before returning (a :class:`ReplayEndReachedError` message), or None."""
    unreached_calls: tuple[str, ...]
    """idempotency keys of recorded calls the code never asked for (for a finished run: divergence)."""
    mismatches: tuple[str, ...]
    """Differences between the code's messages/events/outcome and the recorded ones."""


def replay_state(settings: Settings, run_id: str, *, until_seq: int | None = None) -> ReplayedState:
    """Rebuild ``run_id``'s state from its partition, up to ``until_seq``.

    Args:
        settings: bootstrap servers and topic prefix.
        run_id: the run.
        until_seq: stop as soon as the run's ``last_seq`` reaches this seq (default None: everything).
            Events after it — zombie facts included — had not happened yet at that point.

    Returns:
        :class:`ReplayedState`; its ``state`` is None when the topic holds nothing of the run.

    Raises:
        ValueError: ``until_seq`` < 1.
        TopicNotFoundError: the events topic does not exist.
        KafkaException: the broker is unreachable.
    """
    if until_seq is not None and until_seq < 1:
        raise ValueError(f"until_seq is a seq (1-based), got {until_seq}")
    partition = run_partition(settings, run_id)
    state: RunState | None = None
    timeline: list[TimelineRow] = []
    events: list[Event] = []
    for row in read_run_events(settings, run_id):
        if row["key"].rsplit(":", 2)[0] != run_id:
            continue  # another run whose id extends this one's (``a`` vs ``a:b``)
        if until_seq is not None and state is not None and state.last_seq >= until_seq:
            break  # consumers.reducer.fold's rule
        event = row.get("event")
        if event is not None:
            state = apply(state, event, partition=partition, offset=row["offset"])
            events.append(event)
        elif row["type"] == "UNDECODABLE":
            state = block(state, run_id, f"undecodable record: {row.get('error')}", partition=partition,
                          offset=row["offset"])
        else:  # a tombstone: the run is being erased from here on
            state = None
        timeline.append(cast(TimelineRow, {k: v for k, v in row.items() if k != "event"}))
    return ReplayedState(run_id=run_id, partition=partition, until_seq=until_seq, state=state,
                         timeline=tuple(timeline), events=tuple(events))


def replay_run(settings: Settings, run_id: str, agent_fn: Callable[[ReplayHandle], Any], *,
               until_seq: int | None = None, strict_args: bool = True,
               redis_client: redis.Redis | None = None) -> AgentReplay:
    """Re-execute ``agent_fn`` against the recording of ``run_id`` (no tool runs, nothing is published).

    Args:
        settings: bootstrap servers, topic prefix, Redis URL (results stored by reference are read there).
        run_id: the recorded run.
        agent_fn: the agent's code; called once with a :class:`ReplayHandle` where it expects a ``RunHandle``.
        until_seq: replay point (see :func:`replay_state`); the code stops at the first step past it.
        strict_args: a call with arguments other than the recorded ones diverges (default True).
        redis_client: a Redis client (default: from ``settings.redis_url``, connected only if needed).

    Returns:
        :class:`AgentReplay`: the code's return value, the calls answered, where it stopped, mismatches.

    Raises:
        RunNotFoundError: nothing of the run is in the topic (up to ``until_seq``).
        ReplayDivergedError: the code called another tool, other arguments, or a step a finished
            recording does not have (:class:`ReplayEndReachedError` is caught: it ends the replay).
        ReplayedToolError: a recorded failure the code did not catch.
        ResultUnavailableError: a recorded result stored by reference is gone from Redis.
        Anything else ``agent_fn`` raises.
    """
    replayed = replay_state(settings, run_id, until_seq=until_seq)
    client = redis_client if redis_client is not None else redis.Redis.from_url(settings.redis_url)
    handle = ReplayHandle(replayed, results=ResultStore(client, settings.topic_prefix), strict_args=strict_args)
    stopped: str | None = None
    value: Any = None
    try:
        value = agent_fn(handle)
    except ReplayEndReachedError as exc:
        stopped = str(exc)
    return AgentReplay(replayed=replayed, value=value, calls=tuple(handle.calls), stopped=stopped,
                       unreached_calls=tuple(handle.unreached_calls), mismatches=tuple(handle.mismatches))

"""Replay: rebuild any past state of a run from the journal, and re-execute agent code against it.

docs/design/protocol.md § Replay is not resume: *replay rebuilds any past state (time travel) with
side-effecting tools replaced by their recorded results: the real provider's call count never
changes. resume continues a live run under a new epoch.* Nothing in this module publishes an
event, writes Redis or invokes a tool; Redis is only read for results stored by reference.

* :func:`replay_state` (``runjournal replay RUN_ID [--until-seq N]``): reads the run's records from
  its partition (``read_committed``, offset order) and folds them with the pure reducer, stopping
  as soon as ``last_seq`` reaches ``until_seq`` (the rule of ``runjournal.model.reducer.fold``). An
  undecodable record parks the run BLOCKED and a tombstone erases it, as in the projector.
* :func:`replay_run`: calls ``agent_fn(handle)`` with a :class:`ReplayHandle` over that state; every
  ``handle.call`` returns the recorded result of its step's idempotency key (see
  ``runjournal.consumers.ops._replay_handle`` for the rules and errors).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from runjournal.consumers.ops._replay_handle import (
    ReplayDivergedError,
    ReplayedCall,
    ReplayedToolError,
    ReplayEndReachedError,
    ReplayError,
    ReplayHandle,
    RunNotFoundError,
)
from runjournal.consumers.ops._replay_state import ReplayedState, TimelineRow
from runjournal.consumers.ops.inspect import read_run_events
from runjournal.consumers.runtime.partitions import run_partition
from runjournal.core import redis_client as redis_clients
from runjournal.core.ids import RUN_ID
from runjournal.core.settings import Settings
from runjournal.model.reducer import RunState, apply, block
from runjournal.producers.encryption import ContentCrypto
from runjournal.producers.results import ResultStore
from runjournal.schemas import Event
from runjournal.schemas.keys import parse_event_key

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
        InvalidIdError: ``run_id`` is not text (``runjournal.core.ids`` ``check_lookup``).
        TopicNotFoundError: the events topic does not exist.
        KafkaException: the broker is unreachable.
    """
    RUN_ID.check_lookup(run_id)
    if until_seq is not None and until_seq < 1:
        raise ValueError(f"until_seq is a seq (1-based), got {until_seq}")
    partition = run_partition(settings, run_id)
    state: RunState | None = None
    timeline: list[TimelineRow] = []
    events: list[Event] = []
    for row in read_run_events(settings, run_id):
        if parse_event_key(row["key"]).run_id != run_id:
            continue  # another run whose id extends this one's (``a`` vs ``a:b``)
        if until_seq is not None and state is not None and state.last_seq >= until_seq:
            break  # runjournal.model.reducer.fold's rule
        event = row.get("event")
        if event is not None:
            state = apply(state, event, partition=partition, offset=row["offset"], critical=settings.critical_types)
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
               redis_client: Any = None) -> AgentReplay:
    """Re-execute ``agent_fn`` against the recording of ``run_id`` (no tool runs, nothing is published).

    Args:
        settings: bootstrap servers, topic prefix, Redis URL (a cache of results stored by reference, which are
            read from ``{prefix}.payloads``).
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
        ResultUnavailableError: a recorded result stored by reference cannot be read (an old ``sha256:`` one gone
            from Redis, a ``kafka:`` one erased); ResultCorruptError: its records do not make the recorded result.
        Anything else ``agent_fn`` raises.
    """
    replayed = replay_state(settings, run_id, until_seq=until_seq)
    client = redis_client if redis_client is not None else redis_clients.client(settings)
    handle = ReplayHandle(replayed, results=ResultStore(client, settings.topic_prefix, settings),
                          content=ContentCrypto(settings, encrypt=False),
                           strict_args=strict_args)
    stopped: str | None = None
    value: Any = None
    try:
        value = agent_fn(handle)
    except ReplayEndReachedError as exc:
        stopped = str(exc)
    return AgentReplay(replayed=replayed, value=value, calls=tuple(handle.calls), stopped=stopped,
                       unreached_calls=tuple(handle.unreached_calls), mismatches=tuple(handle.mismatches))

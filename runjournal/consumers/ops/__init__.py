"""Operator actions on one run, each reading the journal (the authority) and its projection: inspect, replay,
approve / deny, erase (docs/operations/).

* :func:`inspect_run`, :func:`read_run_events` — a run's projected state and its timeline from its partition.
* :func:`replay_state`, :class:`AgentReplay` — time travel: any past state, agent code re-run against recorded
  results (the provider's call count never changes).
* :func:`submit_decision` — a human's decision on a pending approval, checked against the projection.
* :func:`erase_run` — tombstone a run's events and records, delete its projection and memory.
"""

from runjournal.core.lazy import lazy_exports

_HOMES = {
    **dict.fromkeys(["inspect_run", "read_run_events"], "runjournal.consumers.ops.inspect"),
    **dict.fromkeys(["AgentReplay", "ReplayDivergedError", "ReplayEndReachedError", "replay_run", "replay_state"],
                    "runjournal.consumers.ops.replay"),
    **dict.fromkeys(["ApprovalRefusedError", "submit_decision"], "runjournal.consumers.ops.approvals"),
    **dict.fromkeys(["EraseError", "EraseReport", "RunStillLiveError", "erase_run"], "runjournal.consumers.ops.erase"),
}
__all__ = sorted(_HOMES)
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

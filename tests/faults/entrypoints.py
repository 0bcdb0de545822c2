"""The registry of every entry point that writes to the journal (or decides who may), with its failpoints and what
happens when two actors race on it and when it is killed at each step.

tests/faults/test_registry.py fails when a CLI command or a public method of the journal's classes is in neither
:data:`WRITERS` nor :data:`READERS`, when a production failpoint is missing from
``runjournal.core.failpoints.REGISTRY`` or armed by no test, and when docs/operations/concurrency.md leaves a
writer out. tests/faults/test_entrypoint_matrix.py generates its cases from :data:`WRITERS` (entry point × SIGKILL
at each of its failpoints × a second concurrent actor).
"""

from __future__ import annotations

from dataclasses import dataclass

CALL_POINTS = ("producers.call.before_intent_commit", "producers.call.after_intent", "producers.call.after_tool",
               "producers.call.after_outcome", "producers.txn.after_outcome_commit")
RECOVERY_POINTS = ("recovery.after_fence", "recovery.after_read", "recovery.after_commit", "recovery.inside_handover",
                   "recovery.handover.after_plan", "recovery.handover.after_assign")
PROJECTOR_POINTS = ("projector.before_write", "projector.write_in_flight", "projector.after_write")
ARCHIVE_POINTS = ("archive.after_write", "archive.after_manifest", "archive.after_tombstones")


@dataclass(frozen=True)
class Writer:
    """One entry point that writes to the journal, or takes a run's ownership."""

    failpoints: tuple[str, ...]
    """The production failpoints it passes through (each armed by the crash matrices)."""
    race: str
    """What happens when a second actor acts on the same run at the same time."""
    kill: str
    """What happens when it is SIGKILLed at any of its failpoints."""
    matrix: str | None = None
    """The scenario of tests/faults/test_entrypoint_matrix.py that drives it (None: ``covered_by`` does)."""
    covered_by: str = ""
    """The tests that race and kill it, when the matrix does not."""


_HANDLE_RACE = ("threads and tasks sharing the handle publish one step at a time under the run's lock (tools run "
                "in parallel); a second handle of the run in the same instance is refused (DuplicateSeqError); a "
                "second instance is fenced before it can write (recovery's fence, the lease)")
_HANDLE_KILL = ("the run stays in the instance's owned set; recovery fences the instance, folds the journal and "
                "resumes the run elsewhere: a call killed before its intent was acknowledged never happened, one "
                "killed after it is OUTCOME_UNKNOWN and reconciled by key, never run blind under a new key")
_RECOVERY_RACE = ("every actor fences, then reads, then publishes: of two actors on one run, the one initialised "
                  "later fences the other, whose RUN_RESUMED does not commit (reported `superseded`); an actor "
                  "initialised after another's commit reads it (`owner_alive`, `not_ended`, or it completes that "
                  "hand-over: `handed_over`). Plans are check-and-set on the epoch")
_RECOVERY_KILL = ("before RUN_RESUMED commits: nothing durable happened, the next pass does it all again; after it: "
                  "the run is in its assignee's incoming set and the journal names the assignee, so the next pass "
                  "completes the hand-over, or resumes the run again if the assignee died")

_CONTROL_RACE = ("one request per run (a pending cancel stands, a cancel replaces a pending pause, the same action is "
                 "the same request); the live owner carries it out under the run's lock, or a recovery pass does when "
                 "nobody live owns the run — two passes fence each other (one commits, the other is `superseded`)")
_CONTROL_KILL = ("the request stays in Redis until its event is durable: the owner's next step, the next owner after "
                 "a resume, or the next recovery pass carries it out; a pass killed after its commit finds the run "
                 "paused or ended and only removes the request")

WRITERS: dict[str, Writer] = {
    # -- the agent's API (sync and async) ------------------------------------------------------------------
    "Journal.start_run": Writer((), "the run id is claimed with SET NX: a second start of one id is RunExistsError",
                                "no RUN_STARTED acknowledged: the id is freed by recovery (`no_facts`)",
                                covered_by="tests/producers/test_journal.py, tests/faults/test_producer_crash.py"),
    "Journal.resume": Writer((), "refused unless the plan is assigned here and is the run's newest (StalePlanError)",
                             "publishes nothing by itself", covered_by="tests/producers/test_resume.py"),
    "Journal.publish": Writer(("producers.call.before_intent_commit",), _HANDLE_RACE, _HANDLE_KILL,
                              covered_by="tests/faults/test_one_writer.py, tests/producers/test_fence_race.py"),
    "Journal.publish_record": Writer((), "records commit and abort with the run's events; a fenced instance "
                                         "writes none",
                                     "the transaction aborts: neither the records nor the events land",
                                     covered_by="tests/adapters/test_langgraph_journal.py"),
    "Journal.publish_payload": Writer(("producers.result.before_payload_commit",),
                                      "each result's records under a fresh payload id, produced under one hold of "
                                      "the publisher's lock (one transaction); a fenced instance writes none",
                                      "before the commit: the transaction aborts, nothing references the records "
                                      "and the call is OUTCOME_UNKNOWN; after it: records no event references "
                                      "(never read; erase removes them)",
                                      covered_by="tests/producers/test_large_results.py"),
    "Journal.flush": Writer((), "commits what every thread produced (group commit)", "the open transaction aborts",
                            covered_by="tests/producers/test_journal.py"),
    "Journal.close": Writer((), "as flush; unfinished runs stay owned, without a lease", "as flush",
                            covered_by="tests/producers/test_leases.py"),
    "Journal.surrender": Writer(("producers.surrender.after_flush",),
                                "once per run and epoch; it waits for every request of the handle (any thread) before "
                                "the run leaves the owned set, and two recovery jobs resume it once",
                                "before its Redis write the run is still owned: recovery fences the dead instance "
                                "and resumes it; after it, the surrendered entry is resumed like a live one",
                                covered_by="tests/faults/test_surrender.py"),
    "RunHandle.call": Writer(CALL_POINTS, _HANDLE_RACE, _HANDLE_KILL, matrix="call"),
    "RunHandle.call_steps": Writer(CALL_POINTS, _HANDLE_RACE, _HANDLE_KILL, matrix="call"),
    "RunHandle.advance": Writer(CALL_POINTS, _HANDLE_RACE, _HANDLE_KILL, matrix="call"),
    "RunHandle.advance_call": Writer(CALL_POINTS, _HANDLE_RACE, _HANDLE_KILL, matrix="call"),
    "RunHandle.undeliver": Writer((), "under the run's lock: a value the caller never received reopens the call (its "
                                  "retry keeps the key, gets the recorded value)", "nothing published",
                                  covered_by="tests/faults/test_one_writer.py"),
    "RunHandle.close_steps": Writer((), "under the run's lock: the abandoned call stays open, its retry keeps the key",
                                    "nothing published", covered_by="tests/faults/test_one_writer.py"),
    "RunHandle.emit": Writer((), _HANDLE_RACE, _HANDLE_KILL, covered_by="tests/faults/test_one_writer.py"),
    "RunHandle.node": Writer((), _HANDLE_RACE, _HANDLE_KILL, covered_by="tests/faults/test_producer_crash.py"),
    "RunHandle.message": Writer((), _HANDLE_RACE, _HANDLE_KILL, covered_by="tests/faults/test_one_writer.py"),
    "RunHandle.correction": Writer((), _HANDLE_RACE, _HANDLE_KILL, covered_by="tests/producers/test_journal.py"),
    "RunHandle.request_approval": Writer((), _HANDLE_RACE, _HANDLE_KILL,
                                         covered_by="tests/producers/test_approvals.py"),
    "RunHandle.succeed": Writer((), _HANDLE_RACE, _HANDLE_KILL, covered_by="tests/faults/test_one_writer.py"),
    "RunHandle.fail": Writer((), _HANDLE_RACE, _HANDLE_KILL, covered_by="tests/faults/test_after_the_effect.py"),
    "RunHandle.start_new": Writer((), "as Journal.start_run", "as Journal.start_run",
                                  covered_by="tests/producers/test_journal.py"),
    "AsyncJournal.start_run": Writer((), "as Journal.start_run", "as Journal.start_run",
                                     covered_by="tests/adapters/test_async_journal.py"),
    "AsyncJournal.resume": Writer((), "as Journal.resume", "as Journal.resume",
                                  covered_by="tests/adapters/test_async_journal.py"),
    "AsyncJournal.flush": Writer((), "as Journal.flush", "as Journal.flush",
                                 covered_by="tests/adapters/test_async_journal.py"),
    "AsyncJournal.close": Writer((), "as Journal.close", "as Journal.close",
                                 covered_by="tests/adapters/test_async_journal.py"),
    "AsyncJournal.run_sync": Writer((), "a step runs to its end however often the task is cancelled",
                                    "as the step it runs", covered_by="tests/faults/test_one_writer.py"),
    **{f"AsyncRunHandle.{m}": Writer(CALL_POINTS if m == "call" else (), _HANDLE_RACE, _HANDLE_KILL,
                                     covered_by="tests/faults/test_one_writer.py, tests/adapters/test_async_journal.py")
       for m in ("emit", "message", "correction", "request_approval", "succeed", "fail", "node", "call",
                 "await_approval")},
    "await_approval": Writer((), "the first decision in the inbox wins; the owner journals it",
                             "a pending approval survives: the resumed owner waits for the inbox",
                             covered_by="tests/producers/test_approvals.py"),
    # -- taking a run over ---------------------------------------------------------------------------------
    "RecoveryJob.recover": Writer(RECOVERY_POINTS, _RECOVERY_RACE, _RECOVERY_KILL, matrix="recover"),
    "continue_run": Writer(RECOVERY_POINTS, _RECOVERY_RACE + "; the loser raises RunNotContinuableError; an archived "
                           "run is restored once (one transactional id per run: a later restorer fences an earlier "
                           "one or finds its records — tests/consumers/archive/test_continue_archived.py)",
                           _RECOVERY_KILL + "; killed after an archived run's restore: the next continue_run finds "
                           "it restored and continues it", matrix="continue_run"),
    "cli recover": Writer(RECOVERY_POINTS, _RECOVERY_RACE, _RECOVERY_KILL, matrix="recover"),
    # -- operators -------------------------------------------------------------------------------------------
    "cli approve": Writer((), "checked against the projection; the first decision wins (HSETNX); the owner journals it",
                          "the decision is in the inbox or not; nothing is half-written",
                          covered_by="tests/producers/test_approvals.py"),
    "cli deny": Writer((), "as approve", "as approve", covered_by="tests/producers/test_approvals.py"),
    "cli settle": Writer((), "checked against the projection (a pending unknown-outcome approval); the first decision "
                             "wins (HSETNX); the owner journals the outcome, then the answer",
                         "the decision is in the inbox or not; the owner's crash between the outcome and the answer "
                         "keeps the outcome, and a resumed owner answers from the inbox again",
                         covered_by="tests/faults/test_settle_by_hand.py"),
    "cli console": Writer(RECOVERY_POINTS, "its approve / deny are the CLI's (submit_decision); its cancel / pause / "
                          "resume are the CLI's (Operator): as cli cancel",
                          "approve / deny: as approve; cancel / pause / resume: as cli cancel (the request stays in "
                          "Redis until its event is durable)",
                          covered_by="tests/console/test_console.py, tests/console/test_controls.py, "
                                     "tests/consumers/ops/test_control.py"),
    "cli erase": Writer((), "refused while the run is live (RunStillLiveError); every step idempotent; an archive "
                        "in flight meets its mark in rj:{P:arc}:erased (decision 0057): no archived copy is left",
                        "running it again finishes an interrupted erase",
                        covered_by="tests/consumers/ops/test_erase.py, tests/consumers/archive/test_archive_faults.py"),
    "cli demo": Writer(CALL_POINTS + RECOVERY_POINTS + PROJECTOR_POINTS, "the fleet's agents, recovery and operators "
                       "act at once (the fault campaign)", "every kill of the campaign", covered_by="tests/campaign"),
    "cli projector": Writer(PROJECTOR_POINTS, "group members split the partitions; a stale view is refused by the "
                            "apply script (Redis holds the applied offset)", "the next member re-seeks to Redis's "
                            "offset: nothing double-applied or lost",
                            covered_by="tests/faults/test_projector_crash.py"),
    "cli archiver": Writer(ARCHIVE_POINTS, "its own group; a run is archived only when finished and not live; the "
                           "object name is a function of the run (tenant, finish date by Redis's clock, partition, "
                           "offsets); an erase at the same time: erase marks checked after the write (decision 0057)",
                           "archiving again rewrites the same object, or finishes the removal from the object when "
                           "every live event is in it (a retry never duplicates, a partly tombstoned run is never "
                           "left half-removed; nothing is removed before the read-back check)",
                           covered_by="tests/consumers/archive/test_archive.py, "
                                      "tests/consumers/archive/test_archive_faults.py"),
    "cli memory-extractor": Writer((), "its own group; deterministic point ids",
                                   "a redelivery rewrites the same points",
                                   covered_by="tests/faults/test_memory.py"),
    # -- framework adapters ----------------------------------------------------------------------------------
    **{f"JournalCheckpointSaver.{m}": Writer((), "under the run's lock: the projection's order is the topic's",
                                             "records ride the run's transaction (fenced with it)",
                                             covered_by="tests/adapters/test_langgraph_journal.py, "
                                                        "tests/adapters/test_crash_resume.py")
       for m in ("put", "put_writes", "delete_thread", "aput", "aput_writes", "adelete_thread")},
    **{f"JournalSession.{m}": Writer((), "read-modify-write under the run's lock", "as the checkpointer",
                                     covered_by="tests/adapters/test_crash_resume.py")
       for m in ("add_items", "pop_item", "clear_session")},
    **{f"FrameworkRecordStore.{m}": Writer((), "under the run's lock", "as the checkpointer",
                                           covered_by="tests/adapters/test_langgraph_journal.py")
       for m in ("write", "forget", "project", "rebuild")},
    "JournalRuns.handle": Writer((), "one handle per thread id per instance (a lock)", "as Journal.start_run",
                                 covered_by="tests/adapters/test_langgraph_journal.py"),
    "JournalRuns.async_handle": Writer((), "as handle", "as Journal.start_run",
                                       covered_by="tests/adapters/test_langgraph_journal.py"),
    "JournalRuns.attach": Writer((), "the handle given is the thread's from now on", "rebuilds from the topic",
                                 covered_by="tests/adapters/test_crash_resume.py"),
    **{f"GraphNodeJournal.{m}": Writer((), _HANDLE_RACE, _HANDLE_KILL,
                                       covered_by="tests/adapters/test_langgraph_journal.py, "
                                                  "tests/adapters/test_crash_resume.py")
       for m in ("on_chain_start", "on_chain_end", "on_chain_error")},
    "JournalRunHooks.on_tool_start": Writer((), _HANDLE_RACE, _HANDLE_KILL,
                                            covered_by="tests/adapters/test_crash_resume.py"),
    "JournalRunHooks.on_tool_end": Writer((), _HANDLE_RACE, _HANDLE_KILL,
                                          covered_by="tests/adapters/test_crash_resume.py"),
    "ApprovalInbox.decide": Writer((), "the first decision wins", "written or not",
                                   covered_by="tests/producers/test_approvals.py"),
    "ApprovalInbox.settle": Writer((), "as decide", "as decide", covered_by="tests/faults/test_settle_by_hand.py"),
    "RunHandle.settle_by_hand": Writer((), _HANDLE_RACE, _HANDLE_KILL,
                                       covered_by="tests/faults/test_settle_by_hand.py"),
    "ApprovalInbox.forget": Writer((), "idempotent", "idempotent", covered_by="tests/consumers/ops/test_erase.py"),
    # -- operator controls (docs/design/decisions/0047-operator-controls.md) --------------------------------------
    **{name: Writer(RECOVERY_POINTS, _CONTROL_RACE, _CONTROL_KILL,
                    covered_by="tests/consumers/ops/test_control.py, tests/cli/test_control.py, "
                               "tests/faults/test_controls_crash.py")
       for name in ("cli cancel", "cli pause", "cli resume", "Operator.cancel", "Operator.pause", "Operator.resume")},
    **{name: Writer(RECOVERY_POINTS, "a fork is a new run id claimed with SET NX (two forks never share one); its "
                    "events are one transaction of the recovery producer: of two actors the one fenced retries, "
                    "nothing of its attempt lands",
                    "before its commit nothing of the fork is in the journal (its claim is left, naming the recovery "
                    "producer); after it, the fork is in its assignee's incoming set and the next pass completes the "
                    "hand-over", covered_by="tests/consumers/ops/test_fork.py, tests/cli/test_fork.py")
       for name in ("cli fork", "Operator.fork", "RecoveryJob.start_fork")},
    **{name: Writer((), _HANDLE_RACE + "; a wait's end is a recorded step (the timer's due time, the signal's "
                    "payload), so a re-executed run meets the same answer", "a wait that released the run is a "
                    "request carried out like a pause: held for nobody with its wake-up time, resumed by the sweep",
                    covered_by="tests/consumers/ops/test_waits.py")
       for name in ("RunHandle.sleep", "RunHandle.sleep_steps", "RunHandle.wait_signal", "RunHandle.wait_signal_steps",
                    "AsyncRunHandle.sleep", "AsyncRunHandle.wait_signal")},
    **{name: Writer(RECOVERY_POINTS, "a signal is written once (HSETNX: the first delivery stands); it arms the "
                    "run's timer for now (ZADD LT), so a run held meanwhile wakes at the next sweep; waking is a "
                    "recovery pass over the run (two fence each other)", _RECOVERY_KILL,
                    covered_by="tests/consumers/ops/test_waits.py, tests/cli/test_signal.py")
       for name in ("cli signal", "Operator.signal", "RecoveryJob.wake")},
    "RunHandle.stop_if_requested": Writer((), _HANDLE_RACE + "; an operator's request is carried out once (the "
                                          "handle remembers its stop)", _CONTROL_KILL,
                                          covered_by="tests/consumers/ops/test_control.py"),
    "AsyncRunHandle.stop_if_requested": Writer((), "as RunHandle.stop_if_requested", _CONTROL_KILL,
                                               covered_by="tests/consumers/ops/test_control.py"),
    **{name: Writer((), "as RunHandle.stop_if_requested, after every unknown outcome is settled (a framework's node "
                    "entry)", _CONTROL_KILL, covered_by="tests/adapters/test_langgraph_controls.py")
       for name in ("RunHandle.step_boundary", "AsyncRunHandle.step_boundary")},
    **{name: Writer((), _HANDLE_RACE + "; the default step is the node execution's (its callback run id), counted "
                    "under the registry's lock: calls at once in one node never share a key, a step in flight twice "
                    "is TaskStepError", "as RunHandle.call: a node re-executed after the kill meets its recorded "
                    "calls under the same task keys", covered_by="tests/adapters/test_langgraph_node_calls.py")
       for name in ("JournalRuns.call", "JournalRuns.acall")},
    **{name: Writer((), "as RunHandle.sleep / wait_signal, keyed by the graph task (a sleep) or the signal's name",
                    "as RunHandle.sleep / wait_signal: a node re-run from its checkpoint meets the recorded answer",
                    covered_by="tests/adapters/test_langgraph_controls.py")
       for name in ("JournalRuns.wait_signal", "JournalRuns.await_signal", "JournalRuns.sleep", "JournalRuns.asleep")},
    **{name: Writer((), _HANDLE_RACE + "; a reservation and its settle are calls of two built-in tools whose effect "
                    "is one script on the tenant's ledger (one slot), idempotent by key: agents on many hosts "
                    "reserving against one budget never pass it",
                    "as RunHandle.call: killed between reserve and settle, the estimate stays charged (open) and the "
                    "resumed run meets its recorded reservation; killed inside a step, the step is reconciled by key "
                    "against the ledger, never charged twice",
                    covered_by="tests/producers/test_spend.py, tests/producers/test_spend_async.py, "
                               "tests/faults/test_spend_crash.py")
       for name in ("RunHandle.reserve", "AsyncRunHandle.reserve")},
    **{name: Writer((), _HANDLE_RACE + "; a framework's model call is reserved before it and settled after it "
                    "(RunHandle.reserve / AsyncRunHandle.reserve), keyed by the graph task and the call's number in "
                    "its execution (LangGraph) or the call's number in the run (Agents SDK)",
                    "as RunHandle.reserve: a node or an agent executed again after the kill meets its recorded "
                    "reservations and settles under the same keys, never charged twice; a reservation whose model "
                    "call was killed stays charged at its estimate (open)",
                    covered_by="tests/adapters/test_spend_adapters.py")
       for name in ("GraphSpendJournal.on_chat_model_start", "GraphSpendJournal.on_llm_start",
                    "GraphSpendJournal.on_llm_end", "GraphSpendJournal.on_llm_error", "JournalRunHooks.on_llm_start",
                    "JournalRunHooks.on_llm_end", "JournalRunHooks.settle_open")},
}

READERS: frozenset[str] = frozenset({
    "Journal.probe_lease", "Journal.check_still_owner", "Journal.run_lock", "Journal.claim_assignment",
    "Journal.release_run", "Journal.event_budget_reached",
    # whose key seals a run's content (decision 0059): an in-memory map, no journal, Redis or Kafka access
    "Journal.subject_of", "Journal.scope_of",
    "RunHandle.approval", "RunHandle.wait_idle",
    # ends this owner's trace segment span (decision 0054): no journal, Redis or Kafka write; no lock taken
    "RunHandle.end_trace",
    # run.stream(): partial output to {prefix}.streams, never the journal (decision 0055;
    # tests/producers/test_streams.py kills an agent mid-stream)
    "RunHandle.stream", "AsyncRunHandle.stream", "JournalRuns.stream", "AsyncJournal.open", "AsyncJournal.wrap",
    "AsyncJournal.claim_assignment", "AsyncRunHandle.approval", "ApprovalInbox.from_settings", "ApprovalInbox.key",
    "ApprovalInbox.pending_key", "ApprovalInbox.decision", "ApprovalInbox.requested", "ApprovalInbox.pending",
    "FrameworkRecordStore.key", "FrameworkRecordStore.threads_key", "FrameworkRecordStore.lock",
    "FrameworkRecordStore.fields", "FrameworkRecordStore.entries", "FrameworkRecordStore.get",
    "FrameworkRecordStore.threads", "JournalCheckpointSaver.get_tuple", "JournalCheckpointSaver.list",
    "JournalCheckpointSaver.get_next_version", "JournalCheckpointSaver.aget_tuple", "JournalCheckpointSaver.alist",
    "JournalSession.get_items", "JournalRuns.compile", "RecoveryJob.close", "RecoveryJob.unknown_runs",
    "Journal.request_for", "Journal.request_done", "RunHandle.pending_request", "AsyncRunHandle.pending_request",
    "Operator.select", "Operator.state", "Operator.close", "RunHandle.spend_policy", "RunHandle.spend_ledger",
    "GraphSpendJournal.on_chain_start", "GraphSpendJournal.on_chain_end", "GraphSpendJournal.on_chain_error",
    # read-only commands
    "cli inspect", "cli replay", "cli stream", "cli settings", "cli stack up", "cli stack env", "cli stack down",
    "cli stack status",
    "cli topics create", "cli topics describe", "cli schemas check", "cli schemas publish", "cli memory serve",
    "cli memory search", "cli memory stats", "cli knowledge ingest", "cli knowledge search", "cli knowledge stats",
    "cli acls show", "cli acls create",
    "cli query",  # reads the archive and the projection into in-memory DuckDB copies; writes nothing
    "cli spend",  # reads the projection and the spend ledger
    "cli spend budget",  # writes an operator's limit to the tenant's spend ledger (Redis), never the journal
})
"""Entry points that write nothing to the journal and take no run (they may write elsewhere: topics, ACLs,
the knowledge corpus)."""

CLASSES = ("runjournal.producers:Journal", "runjournal.producers:RunHandle", "runjournal.producers.aio:AsyncJournal",
           "runjournal.producers.aio:AsyncRunHandle", "runjournal.producers.approvals:ApprovalInbox",
           "runjournal.adapters:FrameworkRecordStore", "runjournal.adapters:JournalCheckpointSaver",
           "runjournal.adapters:JournalSession", "runjournal.adapters:JournalRuns",
           "runjournal.adapters:GraphNodeJournal", "runjournal.adapters:GraphSpendJournal",
           "runjournal.adapters:JournalRunHooks",
           "runjournal.consumers.recovery.job:RecoveryJob", "runjournal.consumers.ops.control:Operator")
"""Classes whose every public method must be classified (a new method is a new entry point)."""

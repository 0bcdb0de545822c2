"""``runjournal cancel`` / ``pause`` / ``resume`` / ``fork``: an operator stops, holds, continues or forks a run.

The same semantics as the console's buttons and ``runjournal.consumers.ops.control.Operator`` (the one
implementation; docs/design/decisions/0047-operator-controls.md): a cancel or a pause is a request the run's live
owner carries out at its next step (before a new tool call's intent, on entering a node, while waiting for an
approval) — or a recovery pass here carries out when nobody live owns the run. Each command waits up to ``--wait``
seconds for that and says what happened: ``cancelled`` / ``paused`` / ``resumed``, or ``requested`` (the owner has
not reached a step yet; the request stands). One run by id, or many by filter (``--tenant``, ``--agent``,
``--status``, ``--older-than``) — ``--dry-run`` lists what would change and changes nothing.

Exit codes: 0 every run's action was carried out or requested (or listed, with ``--dry-run``); 1 a run was refused
(unknown, already ended, not paused …) or a dependency failed; 2 a usage error.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

if TYPE_CHECKING:
    from runjournal.consumers.ops.control import ControlResult

__all__ = ["cancel_command", "fork_command", "pause_command", "resume_command", "signal_command"]

console = Console(stderr=True, soft_wrap=True)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(text: str | None) -> float | None:
    """``--older-than``: ``90``, ``90s``, ``15m``, ``2h``, ``1d`` → seconds."""
    if text is None:
        return None
    match = _DURATION.match(text)
    if not match:
        raise typer.BadParameter(f"not a duration: {text!r} (e.g. 90s, 15m, 2h, 1d)")
    return float(match.group(1)) * _UNIT_S[match.group(2) or "s"]


RunArg = Annotated[str | None, typer.Argument(help="The run. Omit it to act on the runs a filter selects.")]
Reason = Annotated[str, typer.Option("--reason", help="Why (recorded in the journal with who asked).")]
By = Annotated[str | None, typer.Option("--by", help="Who asks (default: user@host).")]
Wait = Annotated[float, typer.Option("--wait", min=0,
                                     help="Wait up to this many seconds for the action to be carried out "
                                          "(0: store the request and return).")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="List the runs and what would happen; change nothing.")]
Tenant = Annotated[str | None, typer.Option("--tenant", help="Filter: runs of this tenant.")]
Agent = Annotated[str | None, typer.Option("--agent", help="Filter: runs of this agent.")]
Status = Annotated[list[str] | None, typer.Option("--status", help="Filter: runs in this status (repeatable: "
                                                 "RUNNING, WAITING_APPROVAL, PAUSED).")]
OlderThan = Annotated[str | None, typer.Option("--older-than", help="Filter: runs started longer ago than this "
                                               "(90s, 15m, 2h, 1d).")]
Limit = Annotated[int, typer.Option("--limit", min=1, help="Filter: at most this many runs (oldest first).")]
AsJson = Annotated[bool, typer.Option("--json", help="Print the results as JSON (stdout: one document).")]


def _act(action: str, run_id: str | None, *, reason: str, by: str | None, wait: float, dry_run: bool,
         tenant: str | None, agent: str | None, status: list[str] | None, older_than: str | None, limit: int,
         as_json: bool) -> None:
    from runjournal.cli._errors import cli_errors, fail, printable
    from runjournal.consumers.ops.control import ControlRefusedError, Operator, RunFilter, default_operator
    from runjournal.consumers.runtime.topic_identity import preflight
    from runjournal.core.settings import Settings
    from runjournal.model.reducer import RunStatus

    filtered = any(v for v in (tenant, agent, status, older_than))
    if run_id is None and not filtered:
        raise fail(f"name a run, or select runs with --tenant, --agent, --status or --older-than "
                   f"(runjournal {action} --help)", as_json=as_json, code=2, kind="UsageError")
    if run_id is not None and filtered:
        raise fail("give a run id or filters, not both", as_json=as_json, code=2, kind="UsageError")
    known = [s.value for s in RunStatus]
    if bad := [s for s in status or () if s.upper() not in known]:
        raise fail(f"--status {bad[0]}: not a run status (one of {', '.join(known)}; any case)", as_json=as_json,
                   code=2, kind="UsageError")
    age_s = _duration(older_than)
    settings = Settings.load()
    who = by or default_operator()
    results: list[ControlResult] = []
    refused = False
    with cli_errors(as_json):
        preflight(settings)
        with Operator(settings, wait_s=wait) as operator:
            act = getattr(operator, action)
            if run_id is not None:
                results.append(act(run_id, reason=reason, requested_by=who, dry_run=dry_run))
            else:
                flt = RunFilter(tenant=tenant, agent=agent, status=tuple(s.upper() for s in status or ()),
                                older_than_s=age_s, limit=limit)
                chosen = operator.select(flt, action)
                if not as_json:
                    console.print(f"{action}: {len(chosen)} run(s) match ({flt.describe()})"
                                  f"{' — dry run, nothing changes' if dry_run else ''}", markup=False,
                                  highlight=False)
                for one in chosen:
                    try:
                        results.append(act(one, reason=reason, requested_by=who, dry_run=dry_run))
                    except ControlRefusedError as exc:  # e.g. it ended since the list was read: the others go on
                        from runjournal.consumers.ops.control import ControlResult

                        refused = True
                        results.append(ControlResult(one, action, "refused", str(exc)))
    if as_json:
        out: dict[str, Any] = {"action": action, "dry_run": dry_run, "results": [r.as_dict() for r in results]}
        if run_id is None:
            out["filter"] = {"tenant": tenant, "agent": agent, "status": status or [], "older_than_s": age_s,
                             "limit": limit}
        print(json.dumps(out))
    else:
        for r in results:
            seen = "" if r.seen is None else (" · every live instance has seen it" if r.seen else
                                              " · not yet seen by every live instance")
            console.print(printable(f"{r.run_id}: {r.outcome} ({r.status or '-'}) — {r.detail}{seen}"), markup=False,
                          highlight=False)
    if refused:
        raise typer.Exit(code=1)


def cancel_command(run_id: RunArg = None, reason: Reason = "", by: By = None, wait: Wait = 30.0,
                   dry_run: DryRun = False, tenant: Tenant = None, agent: Agent = None, status: Status = None,
                   older_than: OlderThan = None, limit: Limit = 100, as_json: AsJson = False) -> None:
    """Cancel a run: no new tool call of it is sent once every live instance has seen the request; calls in flight
    end as usual (an unknown outcome is reconciled first); it ends RUN_CANCELLED with who and why, never resumed.
    Exits 1 (nothing stored) for an unknown or ended run."""
    _act("cancel", run_id, reason=reason, by=by, wait=wait, dry_run=dry_run, tenant=tenant, agent=agent,
         status=status, older_than=older_than, limit=limit, as_json=as_json)


def pause_command(run_id: RunArg = None, reason: Reason = "", by: By = None, wait: Wait = 30.0,
                  dry_run: DryRun = False, tenant: Tenant = None, agent: Agent = None, status: Status = None,
                  older_than: OlderThan = None, limit: Limit = 100, as_json: AsJson = False) -> None:
    """Pause a run: its owner stops at its next step and gives it up; it is held for nobody (status PAUSED) until
    `runjournal resume`. Exits 1 (nothing stored) for an unknown, ended or already paused run."""
    _act("pause", run_id, reason=reason, by=by, wait=wait, dry_run=dry_run, tenant=tenant, agent=agent,
         status=status, older_than=older_than, limit=limit, as_json=as_json)


def resume_command(run_id: RunArg = None, reason: Reason = "", by: By = None, wait: Wait = 30.0,
                   dry_run: DryRun = False, tenant: Tenant = None, agent: Agent = None, status: Status = None,
                   older_than: OlderThan = None, limit: Limit = 100, as_json: AsJson = False) -> None:
    """Resume a paused run: RUN_RESUMED under a new epoch, handed to a live instance, which continues it (recorded
    calls return their results). A pause not yet carried out is withdrawn. Exits 1 for a run that is not paused."""
    _act("resume", run_id, reason=reason, by=by, wait=wait, dry_run=dry_run, tenant=tenant, agent=agent,
         status=status, older_than=older_than, limit=limit, as_json=as_json)


def fork_command(
    run_id: Annotated[str, typer.Argument(help="The run to fork.")],
    at: Annotated[str | None, typer.Option("--at", help="The fork point: a seq of the run (its history up to and "
                                           "including it) or an event id. Default: the run's end.")] = None,
    new_run_id: Annotated[str | None, typer.Option("--run-id", help="The fork's run id (default: "
                                                   "<RUN_ID>-fork-<8 hex>).")] = None,
    reason: Reason = "",
    by: By = None,
    assign_to: Annotated[str | None, typer.Option("--assign-to", help="The live instance to hand the fork to "
                                                  "(default: the least loaded).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what the fork does with each of the run's calls "
                                          "— which effects it may perform again — and write nothing.")] = False,
    as_json: AsJson = False,
) -> None:
    """Fork a run from a point of its history: a new run that starts from the run's execution facts up to that
    point and is handed to a live instance. Calls recorded there return their results, calls unknown there are
    reconciled first, and calls after it run under new keys — --dry-run lists exactly those effects. Exits 1 (nothing
    written) for an unknown run, a point outside its history, or a run id that exists."""
    from runjournal.cli._errors import cli_errors, printable
    from runjournal.consumers.ops.control import Operator
    from runjournal.consumers.runtime.topic_identity import preflight
    from runjournal.core.settings import Settings

    at_seq, at_event = (int(at), None) if at is not None and at.isdigit() else (None, at)
    settings = Settings.load()
    with cli_errors(as_json):
        preflight(settings)
        with Operator(settings) as operator:
            result = operator.fork(run_id, at_seq=at_seq, at_event=at_event, new_run_id=new_run_id, reason=reason,
                                   requested_by=by, dry_run=dry_run, assign_to=assign_to)
    if as_json:
        print(json.dumps(result.as_dict()))
        return
    console.print(printable(f"{run_id} at seq {result.at_seq} → {result.fork_run_id}: {result.outcome} — "
                            f"{result.detail}"),
                  markup=False, highlight=False)
    labels = {"returned": "returned from the record (not run)", "reconciled": "unknown: reconciled first",
              "rerun": "failed there: run again under the source's key",
              "may_repeat": "MAY BE PERFORMED AGAIN (after the fork point; new key)"}
    for group, label in labels.items():
        for call in result.preview[group]:
            console.print(f"  {call['tool']} {call['call_id']} ({call['at_fork'] or '-'} at the fork point, "
                          f"{call['now']} now): {label}", markup=False, highlight=False)


def signal_command(
    run_id: Annotated[str, typer.Argument(help="The run.")],
    name: Annotated[str, typer.Argument(help="The signal's name (what run.wait_signal(NAME) waits for).")],
    payload: Annotated[str, typer.Option("--payload", help="The signal's payload as JSON (run.wait_signal returns "
                                         "it), e.g. '{\"approved\": true}'.")] = "null",
    by: By = None,
    as_json: AsJson = False,
) -> None:
    """Deliver a signal to a run, exactly once: a second delivery of the same name is refused (the first stands). A
    run waiting for it takes it; a run held waiting for it is woken and handed to a live instance; a signal sent
    before the run waits is there when it does. Exits 1 for an unknown or ended run, 2 when --payload is not JSON."""
    from runjournal.cli._errors import cli_errors, printable
    from runjournal.consumers.ops.control import Operator
    from runjournal.consumers.runtime.topic_identity import preflight
    from runjournal.core.settings import Settings

    try:
        value = json.loads(payload)
    except ValueError as exc:
        raise typer.BadParameter(f"not JSON ({exc}); e.g. --payload '{{\"approved\": true}}'",
                                 param_hint="--payload") from exc
    settings = Settings.load()
    with cli_errors(as_json):
        preflight(settings)
        with Operator(settings) as operator:
            result = operator.signal(run_id, name, value, requested_by=by)
    if as_json:
        print(json.dumps(result.as_dict()))
    else:
        console.print(printable(f"{run_id}: signal {name} {result.outcome} — {result.detail}"), markup=False,
                      highlight=False)

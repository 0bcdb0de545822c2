"""``runjournal approve`` / ``deny`` / ``settle``: a human's decision on a pending approval.

``approve`` (GRANT) lets the run's owner run the call again under the same key; ``deny`` refuses that; ``settle``
(an unknown outcome only) records that the call happened, with its result — it is never run again.

The decision (``runjournal.consumers.ops.approvals.submit_decision``, shared with the console) goes to the run's
approval inbox (``runjournal.producers.approvals.ApprovalInbox``, Redis); the
run's owner journals it as APPROVAL_GRANTED / APPROVAL_DENIED — the approver never writes the run's
stream (one writer per epoch). Before writing, the projected run state is checked: a call with no
pending APPROVAL_REQUESTED is refused, so a typo or a second decision never lands in an inbox.
"""

from __future__ import annotations

import getpass
import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

if TYPE_CHECKING:
    from runjournal.consumers.ops.approvals import ApprovalRefusedError, submit_decision

__all__ = ["ApprovalRefusedError", "approve_command", "deny_command", "settle_command", "submit_decision"]

_WHAT = {"GRANTED": "the owner runs the call again under the same key",
         "DENIED": "the owner does not run the call again",
         "EXECUTED": "the owner records the call as done with this result and never runs it again"}

console = Console(stderr=True, soft_wrap=True)

#: Names this module re-exports from ``runjournal.consumers.ops.approvals``, imported on first use (PEP 562):
#: the command line's startup loads no consumer.
_REEXPORTS = frozenset({"ApprovalRefusedError", "submit_decision"})


def __getattr__(name: str) -> Any:
    if name in _REEXPORTS:
        from runjournal.consumers.ops import approvals

        return getattr(approvals, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _decide(run_id: str, call_id: str, *, granted: bool, approver: str | None, note: str | None,
            as_json: bool) -> None:
    """Submit the decision (``note``: a grant's comment, a denial's reason) and print it."""
    from runjournal.cli._errors import cli_errors
    from runjournal.consumers.ops.approvals import submit_decision
    from runjournal.consumers.runtime.topic_identity import preflight
    from runjournal.core.settings import Settings

    settings = Settings.load()
    with cli_errors(as_json):  # ApprovalRefusedError included: exit 1, nothing written
        preflight(settings)
        out = submit_decision(settings, run_id, call_id, granted=granted, approver=approver or _os_user(),
                              **({"comment": note} if granted else {"reason": note}))
    if as_json:
        print(json.dumps(out))
    else:
        args = "" if out.get("args") is None else f" with arguments {json.dumps(out['args'], ensure_ascii=False)}"
        said = out["comment"] if granted else out["reason"]
        console.print(f"{out['decision']} {call_id} of run {run_id} ({out['tool'] or 'no tool'}{args}, asked because: "
                      f"{out['request_reason']}) by {out['approver']}{f' ({said})' if said else ''}: "
                      f"{_WHAT[out['decision']]}; the run's owner journals it", markup=False, highlight=False)


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def approve_command(
    run_id: Annotated[str, typer.Argument(help="The run.")],
    call_id: Annotated[str, typer.Argument(help="The call_id of its pending APPROVAL_REQUESTED.")],
    approver: Annotated[str | None, typer.Option("--approver", help="Who approves (default: the OS user).")] = None,
    comment: Annotated[str | None, typer.Option("--comment", help="Recorded with APPROVAL_GRANTED.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the decision as JSON.")] = False,
) -> None:
    """Grant a pending approval: the run's owner runs the call again (same idempotency key). Exits 1 (nothing
    written) when the run has no such pending approval. If the effect already happened, use settle instead."""
    _decide(run_id, call_id, granted=True, approver=approver, note=comment, as_json=as_json)


def deny_command(
    run_id: Annotated[str, typer.Argument(help="The run.")],
    call_id: Annotated[str, typer.Argument(help="The call_id of its pending APPROVAL_REQUESTED.")],
    reason: Annotated[str | None, typer.Option("--reason",
                                               help="Why: recorded as the reason of APPROVAL_DENIED.")] = None,
    approver: Annotated[str | None, typer.Option("--approver", help="Who denies (default: the OS user).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the decision as JSON.")] = False,
) -> None:
    """Deny a pending approval; exits 1 (nothing written) when the run has no such pending approval."""
    _decide(run_id, call_id, granted=False, approver=approver, note=reason, as_json=as_json)


def _json_result(text: str) -> object:
    """``--result``: JSON text (NaN / Infinity refused: they have no JSON form)."""
    def refuse(token: str) -> object:
        raise ValueError(f"{token} is not JSON")

    try:
        return json.loads(text, parse_constant=refuse)
    except ValueError as exc:
        raise typer.BadParameter(f"not JSON ({exc}); e.g. --result '{{\"id\": 7}}' or --result null") from exc


def settle_command(
    run_id: Annotated[str, typer.Argument(help="The run.")],
    call_id: Annotated[str, typer.Argument(help="The approval id of the unknown outcome (<key>@<attempt>).")],
    result: Annotated[str, typer.Option("--result", help="The call's result as JSON (what the tool would have "
                                        "returned), e.g. '{\"id\": 7}'; null when it returns nothing.")],
    approver: Annotated[str | None, typer.Option("--approver", help="Who settles (default: the OS user).")] = None,
    comment: Annotated[str | None, typer.Option("--comment", help="Why you know it happened (recorded).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the decision as JSON.")] = False,
) -> None:
    """Settle an unknown outcome by hand: the call happened, with this result. The run's owner records it as
    TOOL_CALL_RECONCILED(COMMITTED) and never runs the call again; calling it returns the result. Exits 1
    (nothing written) unless the run has this pending approval for a call whose outcome is unknown."""
    from runjournal.cli._errors import cli_errors
    from runjournal.consumers.ops.approvals import submit_settlement
    from runjournal.consumers.runtime.topic_identity import preflight
    from runjournal.core.settings import Settings

    value = _json_result(result)
    settings = Settings.load()
    with cli_errors(as_json):  # ApprovalRefusedError, NonCanonicalValueError included: exit 1, nothing written
        preflight(settings)
        out = submit_settlement(settings, run_id, call_id, result=value, approver=approver or _os_user(),
                                comment=comment)
    if as_json:
        print(json.dumps(out))
    else:
        console.print(f"EXECUTED {call_id} of run {run_id} ({out['tool'] or 'no tool'}) by {out['approver']}: "
                      f"{_WHAT['EXECUTED']}; the run's owner journals it", markup=False, highlight=False)

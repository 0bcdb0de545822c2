"""``runjournal approve`` / ``runjournal deny``: a human's decision on a pending approval.

The decision (``runjournal.consumers.approvals.submit_decision``, shared with the console) goes to the run's
approval inbox (``runjournal.producers.approvals.ApprovalInbox``, Redis); the
run's owner journals it as APPROVAL_GRANTED / APPROVAL_DENIED — the approver never writes the run's
stream (one writer per epoch). Before writing, the projected run state is checked: a call with no
pending APPROVAL_REQUESTED is refused, so a typo or a second decision never lands in an inbox.
"""

from __future__ import annotations

import getpass
import json
from typing import Annotated

import typer
from rich.console import Console

from runjournal.consumers.approvals import ApprovalRefusedError, submit_decision
from runjournal.core.settings import Settings

__all__ = ["ApprovalRefusedError", "approve_command", "deny_command", "submit_decision"]

console = Console(stderr=True, soft_wrap=True)


def _decide(run_id: str, call_id: str, *, granted: bool, approver: str | None, comment: str | None,
            as_json: bool) -> None:
    from runjournal.cli._errors import cli_errors
    from runjournal.consumers.topic_identity import preflight

    settings = Settings.load()
    with cli_errors(as_json):  # ApprovalRefusedError included: exit 1, nothing written
        preflight(settings)
        out = submit_decision(settings, run_id, call_id, granted=granted, approver=approver or _os_user(),
                              comment=comment)
    if as_json:
        print(json.dumps(out))
    else:
        console.print(f"{out['decision']} {call_id} of run {run_id} ({out['tool'] or 'no tool'}: {out['reason']}) "
                      f"by {out['approver']}; the run's owner journals it")


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
    """Grant a pending approval; exits 1 (nothing written) when the run has no such pending approval."""
    _decide(run_id, call_id, granted=True, approver=approver, comment=comment, as_json=as_json)


def deny_command(
    run_id: Annotated[str, typer.Argument(help="The run.")],
    call_id: Annotated[str, typer.Argument(help="The call_id of its pending APPROVAL_REQUESTED.")],
    reason: Annotated[str | None, typer.Option("--reason", help="Recorded with APPROVAL_DENIED.")] = None,
    approver: Annotated[str | None, typer.Option("--approver", help="Who denies (default: the OS user).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the decision as JSON.")] = False,
) -> None:
    """Deny a pending approval; exits 1 (nothing written) when the run has no such pending approval."""
    _decide(run_id, call_id, granted=False, approver=approver, comment=reason, as_json=as_json)

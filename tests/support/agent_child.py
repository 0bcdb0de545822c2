"""Child agent for recovery crash tests: one run that sends an email through the demo provider.

Usage: ``python -m tests.support.agent_child RUN_ID PRODUCER_ID PROVIDER_URL start|resume [SENDS [approval]]``
with the service env and, for a crash, ``RJ_FAILPOINTS=producers.call.<point>=1``. The provider's ledger
is the witness of how many times the email was really sent.

Steps (nodes): ``compose`` (a MESSAGE), ``send`` (the side-effecting call), then a transcript turn
saying the email was sent, then RUN_SUCCEEDED. With ``approval``, each send first waits for a human
decision through the approval inbox (``await_approval``, call_id = the node path: ``send``, ``send#2``…);
a denied send is skipped with a MESSAGE saying so.
"""

from __future__ import annotations

import sys

from runjournal.core import redis_client
from runjournal.core.settings import Settings
from runjournal.demo.tools import ProviderTool
from runjournal.producers import Journal
from runjournal.producers.approvals import ApprovalInbox, await_approval


def script(handle, provider_url: str, sends: int = 1, inbox: ApprovalInbox | None = None) -> None:  # noqa: ANN001
    """The agent's code (``handle``: a RunHandle, or a ReplayHandle); re-executed as is on resume (recorded
    results come from the plan) and on replay (from the journal)."""
    with handle.node("compose"):
        handle.message("assistant", "drafting the confirmation email")
    for i in range(sends):
        args = {"to": "bob@example.com", "subject": f"booking {i}"}
        with handle.node("send") as path:
            if inbox is not None and not await_approval(handle, inbox, path, "send_email needs a human",
                                                        tool="send_email", args=args, timeout_s=60):
                handle.message("assistant", "send_email was not approved")
                continue
            tool = ProviderTool(name="send_email", base_url=provider_url, run_id=handle.run_id, epoch=handle.epoch,
                                result='{"sent": true}', timeout_ms=1000)
            handle.call(tool, args)
    handle.message("assistant", "The email has been sent.")
    handle.succeed({"done": True})


def main() -> None:
    run_id, producer_id, provider_url, mode = sys.argv[1:5]
    resume = mode == "resume"
    sends = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    settings = Settings.load()
    inbox = ApprovalInbox(redis_client.client(settings), settings.topic_prefix) \
        if sys.argv[6:7] == ["approval"] else None
    with Journal(settings, producer_id=producer_id, lease_ttl_ms=2500) as journal:  # short, for tests; 3x a heartbeat
        if resume:
            claimed = journal.claim_assignment(timeout_s=10)
            assert claimed == run_id, claimed
            handle = journal.resume(run_id)
        else:
            handle = journal.start_run("tenant-a", "mailer", {"to": "bob"}, run_id=run_id, user_id="u1")
        script(handle, provider_url, sends, inbox)


if __name__ == "__main__":
    main()

"""An OpenAI Agents SDK agent on the journal, with a tool that needs a human's approval.

    pip install 'runjournal[openai-agents]'
    runjournal stack up && runjournal topics create
    python examples/openai_agents_approval.py                 # waits: approve with the command it prints
    python examples/openai_agents_approval.py --auto-approve  # a stand-in human approves through the inbox

Offline: the Agents SDK's ``ScriptedModel`` (a ``send_email`` call, then an answer); tracing off, no API key.
The paused run's state is recorded in the journal and the approval is a durable APPROVAL_REQUESTED: kill
the process while it waits, run ``runjournal recover --stale`` with another instance open, and the
approval and the run survive (``tests/adapters/test_crash_resume.py`` does exactly that). The session is
a ``JournalSession`` and every tool call is on the run's timeline (``JournalRunHooks``). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid

from agents import Agent, RunConfig, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call

from runjournal import ApprovalInbox, AsyncJournal, Settings, current_idempotency_key
from runjournal.adapters import FrameworkRecordStore, JournalRunHooks, JournalSession, journal_function_tool, run_agent

SENT: list[str] = []


@function_tool(needs_approval=True, failure_error_function=None)
async def send_email(to: str, subject: str) -> str:
    """Send an email (needs approval)."""
    SENT.append(current_idempotency_key() or "")
    return f"sent '{subject}' to {to}"


async def stand_in_human(inbox: ApprovalInbox, run_id: str) -> None:
    """What `runjournal approve RUN_ID CALL_ID` does, once the agent asked."""
    while not (pending := [c for r, c in inbox.pending() if r == run_id]):
        await asyncio.sleep(0.05)
    inbox.decide(run_id, pending[0], granted=True, approver="example", comment="looks fine")


async def main(auto_approve: bool) -> dict[str, object]:
    settings = Settings.load()
    run_id = f"example-agents-{uuid.uuid4().hex[:8]}"
    inbox = ApprovalInbox.from_settings(settings)  # a server or a cluster, ACL user, TLS
    async with await AsyncJournal.open(settings, producer_id=f"example-agents-{run_id[-8:]}") as journal:
        store = FrameworkRecordStore(journal.sync)
        run = await journal.start_run("example", "agents-mailer", {"ask": "email Bob"}, run_id=run_id)
        model = ScriptedModel([[function_call("send_email", {"to": "bob@example.com", "subject": "Booking"},
                                              call_id="call-1")], [assistant_message("Bob has his email.")]])
        agent = Agent(name="mailer", model=model, tools=[journal_function_tool(send_email)])
        if auto_approve:
            human = asyncio.create_task(stand_in_human(inbox, run_id))
        else:
            print(f"waiting for: runjournal approve {run_id} call-1", file=sys.stderr)
        result = await run_agent(agent, "Email Bob his booking", run=run, inbox=inbox, store=store,
                                 session=JournalSession(run, store), hooks=JournalRunHooks(run),
                                 run_config=RunConfig(tracing_disabled=True))
        if auto_approve:
            await human
        items = await JournalSession(run, store).get_items()
        await run.succeed({"final": result.final_output})
    return {"run_id": run_id, "final": result.final_output, "emails_sent": len(SENT), "session_items": len(items)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--auto-approve", action="store_true", help="approve through the inbox (a stand-in human)")
    summary = asyncio.run(main(parser.parse_args().auto_approve))
    print(json.dumps(summary))
    raise SystemExit(0 if summary["emails_sent"] == 1 else 1)

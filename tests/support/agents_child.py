"""Child agent for the OpenAI Agents SDK approval crash test: a tool that needs approval sends an email.

Usage: ``python -m tests.support.agents_child RUN_ID PRODUCER_ID PROVIDER_URL start|resume`` with the
service env. ``start`` runs the agent (scripted model: a ``send_email`` call ``call-1``, then "done") until it
waits for a human on ``call-1``; the test kills it there. ``resume`` claims the recovered run and continues
it from the recorded RunState with a model scripted with "done" only. The provider's ledger is the witness.
"""

from __future__ import annotations

import asyncio
import sys

import redis
from agents import Agent, RunConfig, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call

from runjournal.adapters import current_idempotency_key
from runjournal.adapters._checkpoints import FrameworkRecordStore
from runjournal.adapters.openai_agents import JournalRunHooks, journal_function_tool, resume_agent, run_agent
from runjournal.core.settings import Settings
from runjournal.demo.tools import ProviderTool
from runjournal.producers.aio import AsyncJournal
from runjournal.producers.approvals import ApprovalInbox


def agent_for(provider: ProviderTool, steps: list) -> Agent:  # noqa: ANN001
    @function_tool(needs_approval=True, failure_error_function=None)
    async def send_email(to: str) -> str:
        """Send an email (needs a human's approval)."""
        key = current_idempotency_key()
        assert key is not None
        return str(await asyncio.to_thread(provider, {"to": to}, key))

    tool = journal_function_tool(send_email, timeout_ms=1000, reconcile=provider.reconcile)
    return Agent(name="mailer", model=ScriptedModel(steps), tools=[tool])


async def main() -> None:
    run_id, producer_id, provider_url, mode = sys.argv[1:5]
    settings = Settings.load()
    inbox = ApprovalInbox(redis.Redis.from_url(settings.redis_url), settings.topic_prefix)
    async with await AsyncJournal.open(settings, producer_id=producer_id, lease_ttl_ms=2500) as journal:
        store = FrameworkRecordStore(journal.sync)
        options = {"inbox": inbox, "store": store, "approval_timeout_s": 120,
                   "run_config": RunConfig(tracing_disabled=True)}
        if mode == "resume":
            assert await journal.claim_assignment(timeout_s=30) == run_id
            run = await journal.resume(run_id)
            provider = ProviderTool("send_email", provider_url, run_id, run.epoch, "sent", timeout_ms=1000)
            agent = agent_for(provider, [[assistant_message("done")]])
            result = await resume_agent(agent, run=run, hooks=JournalRunHooks(run), **options)
        else:
            run = await journal.start_run("tenant-a", "agents-mailer", {"ask": "email bob"}, run_id=run_id)
            provider = ProviderTool("send_email", provider_url, run_id, run.epoch, "sent", timeout_ms=1000)
            steps = [[function_call("send_email", {"to": "bob"}, call_id="call-1")], [assistant_message("done")]]
            result = await run_agent(agent_for(provider, steps), "email bob", run=run,
                                     hooks=JournalRunHooks(run), **options)
        await run.succeed({"final": result.final_output})


if __name__ == "__main__":
    asyncio.run(main())

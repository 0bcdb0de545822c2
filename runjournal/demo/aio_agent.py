"""An asyncio demo agent (the ``cancels`` fault): the demo agent's loop on an :class:`AsyncJournal`, whose tool calls
are cancelled now and then — the task of every ``--cancel-every``-th call is cancelled twice while it runs, and the
agent calls again with the same arguments, as an application retrying a cancelled request would. The retry keeps
the call's key: it is reconciled with the provider (executed or not), never run blind.

Run as ``python -m runjournal.demo.aio_agent --producer-id ID --workload FILE --provider URL [--acks FILE]
[--cancel-every N]``; it exits when the queue is empty and ``rj:{P:demo}:done`` is set, or on SIGTERM. Like the
plain agent it leaves a run an operator paused or cancelled (``RunStoppedError``, noted in ``rj:{P:demo}:stopped``)
and runs a fork with the script of its lineage's root.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
from pathlib import Path
from typing import Any

from runjournal.core import redis_client
from runjournal.core.logs import setup_logging
from runjournal.core.settings import Settings
from runjournal.demo.agent import (
    PACE_S,
    AckLog,
    DemoKeys,
    lineage_of,
    load_scripts,
    note_stopped,
    script_for,
    tool_for,
)
from runjournal.demo.spend import acharge_turn, model_turns
from runjournal.demo.workload import RunScript
from runjournal.producers import RunExistsError, RunStoppedError
from runjournal.producers.aio import AsyncJournal, AsyncRunHandle
from runjournal.producers.approvals import ApprovalInbox

__all__ = ["main"]

log = logging.getLogger("runjournal.demo.aio_agent")


class Canceller:
    """Cancels the task of every ``every``-th tool call twice, 5 ms apart, then lets the agent call again."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.calls = 0
        self.cancelled = 0

    async def call(self, handle: AsyncRunHandle, tool: Any, args: dict[str, Any], step: str) -> Any:
        self.calls += 1
        if self.every <= 0 or self.calls % self.every:
            return await handle.call(tool, args, step=step)
        task = asyncio.ensure_future(handle.call(tool, args, step=step))
        await asyncio.sleep(0.002)
        task.cancel()
        await asyncio.sleep(0.005)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
            return task.result()  # it finished before the cancellations reached it
        self.cancelled += 1
        return await handle.call(tool, args, step=step)  # the same call again: same key, reconciled


async def aexecute(handle: AsyncRunHandle, script: RunScript, *, provider_url: str, inbox: ApprovalInbox,
                   canceller: Canceller, pace_s: float = 0.0) -> None:
    """``runjournal.demo.agent.execute`` from asyncio (no turn contexts; each step first takes ``pace_s`` s).

    Raises:
        RunStoppedError: an operator paused or cancelled the run: leave it.
    """
    spend = model_turns(script)
    for i, step in enumerate(script.steps):
        if pace_s:
            await asyncio.sleep(pace_s)
        async with handle.node(f"step{i}") as path:
            await acharge_turn(handle, script, i, spend)  # as the plain agent, under the same step names
            if step.kind == "message":
                await handle.message(step.role, step.content, user_id=script.user_id if step.role == "user" else None)
                continue
            if step.needs_approval and not await handle.await_approval(inbox, path, f"{step.tool} needs a human",
                                                                       tool=step.tool, args=step.args,
                                                                       timeout_s=120.0):
                await handle.message("assistant", f"{step.tool} was not approved")
                continue
            await canceller.call(handle, tool_for(step, handle.sync, provider_url), step.args, f"step{i}")
    if script.succeeded:
        await handle.succeed({"reward": 1.0})
    else:
        await handle.fail("recorded outcome: reward 0.0")


async def run(args: argparse.Namespace, settings: Settings) -> None:
    """Take runs from the queue (and assignments) until the workload is done; print the cancellation counts."""
    scripts = load_scripts(args.workload)
    r = redis_client.client(settings)
    keys = DemoKeys(settings.topic_prefix)
    inbox = ApprovalInbox(r, settings.topic_prefix)
    canceller = Canceller(args.cancel_every)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    acks = AckLog(args.acks) if args.acks else None
    async with await AsyncJournal.open(settings, producer_id=args.producer_id, lease_ttl_ms=args.lease_ttl_ms,
                                       on_acked=acks, producer_threads=8) as journal:
        claimed = keys.claimed(journal.producer_id)
        while not stop.is_set():
            run_id = await journal.claim_assignment(0)
            if run_id:
                handle = await journal.resume(run_id)
            else:
                raw = await asyncio.to_thread(r.lmove, keys.queue, claimed, "LEFT", "RIGHT")
                if raw is None:
                    if await asyncio.to_thread(r.exists, keys.done):
                        break
                    await asyncio.sleep(0.1)
                    continue
                script = scripts[raw.decode()]
                try:
                    handle = await journal.start_run(script.tenant_id, script.agent,
                                                     {"instruction": script.instruction}, run_id=script.run_id,
                                                     user_id=script.user_id)
                except RunExistsError:
                    await asyncio.to_thread(r.lrem, claimed, 0, script.run_id)
                    continue
            script = script_for(scripts, handle.run_id, lineage_of(handle.sync))
            pace = PACE_S if await asyncio.to_thread(r.sismember, keys.paced, handle.run_id) else 0.0
            try:
                await aexecute(handle, script, provider_url=args.provider, inbox=inbox, canceller=canceller,
                               pace_s=pace)
            except RunStoppedError as exc:  # paused, cancelled, released: leave the run, go on with other work
                await asyncio.to_thread(note_stopped, r, keys, journal.producer_id, exc)
            await asyncio.to_thread(r.lrem, claimed, 0, handle.run_id)
    print(json.dumps({"producer_id": args.producer_id, "calls": canceller.calls, "cancelled": canceller.cancelled}))


def main(argv: list[str] | None = None) -> None:
    """Process entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--producer-id", required=True)
    ap.add_argument("--workload", required=True, type=Path)
    ap.add_argument("--provider", required=True)
    ap.add_argument("--lease-ttl-ms", type=int, default=3000)
    ap.add_argument("--acks", type=Path, default=None)
    ap.add_argument("--cancel-every", type=int, default=3, help="cancel every N-th tool call's task twice (0: never)")
    args = ap.parse_args(argv)
    settings = Settings.load()
    setup_logging("WARNING", level=settings.log_level)  # JSON lines, librdkafka's too (runjournal.kafka)
    asyncio.run(run(args, settings))


if __name__ == "__main__":
    main()

"""``runjournal memory-extractor`` and ``runjournal memory search|stats|serve``.

The extractor owns the Qdrant directory (embedded mode) and serves reads to every other process over a
small HTTP API (``runjournal.consumers.cognition``): ``memory search``, ``knowledge search`` and agents'
ContextManagers answer while it writes. ``memory serve`` is the same owner without the extractor. With
``RUNJOURNAL_QDRANT_URL`` every process talks to the Qdrant server directly.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from runjournal.cli._advisory import console, fail, guarded, human_lines
from runjournal.cli._signals import stop_on_signals
from runjournal.cli._values import PORT

if TYPE_CHECKING:
    from runjournal.core.settings import Settings
    from runjournal.stores import MemoryHit, Scope

__all__ = ["memory_app", "memory_extractor_command"]

memory_app = typer.Typer(name="memory", help="Search advisory memory (never execution state).",
                         no_args_is_help=True)


def memory_extractor_command(
    until_caught_up: Annotated[bool, typer.Option("--until-caught-up", help="Exit once lag is 0.")] = False,
    batch_size: Annotated[int, typer.Option(min=1, help="Records per consume call.")] = 500,
    metrics_port: Annotated[int | None, typer.Option(**PORT, help="Serve Prometheus /metrics on this port.")] = None,
    metrics_addr: Annotated[str, typer.Option(help="Bind address of /metrics.")] = "0.0.0.0",
    as_json: Annotated[bool, typer.Option("--json", help="Print the final stats as JSON.")] = False,
) -> None:
    """Run the memory extractor (group ``{prefix}.memory``) until SIGINT/SIGTERM, or until caught up.

    It owns the embedded Qdrant directory and serves memory and knowledge reads to other processes. It runs at
    niceness ``RUNJOURNAL_MEMORY_NICE`` (default 19) under the ``RUNJOURNAL_MEMORY_SCHED`` policy (default ``idle``:
    ``SCHED_IDLE``, it runs only on CPU time the projector and agents do not want), and before each batch of a
    backlog waits (at most ``RUNJOURNAL_MEMORY_HEADROOM_WAIT_MS``, default 2000) until the rest of the host leaves
    ``RUNJOURNAL_MEMORY_HEADROOM_CORES`` cores idle (default 1). Exits 1
    naming the cause when the stack or topic is missing, or a dependency stays away past the outage budget.
    """
    from runjournal.cli._errors import cli_errors
    from runjournal.consumers.cognition import CognitionOwner
    from runjournal.consumers.memory.headroom import CpuHeadroom
    from runjournal.consumers.memory.priority import yield_cpu
    from runjournal.consumers.memory.service import MemoryExtractor
    from runjournal.consumers.runtime.topic_identity import preflight
    from runjournal.consumers.vectors.embed import default_embedder
    from runjournal.core.logs import setup_logging
    from runjournal.core.settings import Settings

    setup_logging("INFO")
    settings = Settings.load()
    with cli_errors(as_json):  # a missing stack or topic: named within 5 s (at the priority it was started with)
        preflight(settings)
    yield_cpu(settings.memory_nice, settings.memory_sched)  # before the consumer, embedder, server: threads inherit
    owner = guarded(lambda: CognitionOwner.open(settings, guarded(default_embedder, as_json=as_json)),
                    as_json=as_json)
    try:
        headroom = CpuHeadroom(settings.memory_headroom_cores, settings.memory_headroom_wait_ms / 1000)
        extractor = guarded(lambda: MemoryExtractor(settings, store=owner.memory, batch_size=batch_size,
                                                    headroom=headroom), as_json=as_json)
        stop = stop_on_signals()  # before /metrics is announced: a SIGTERM from then on withdraws it (finally)
        failed: BaseException | None = None
        try:
            if metrics_port is not None:
                with cli_errors(as_json):  # the port taken: one line naming it (JSON under --json), exit 1
                    _serve_metrics(extractor.metrics, metrics_port, metrics_addr, settings)
            with cli_errors(as_json):  # an outage past the budget, fenced, unauthorised: exit 1 naming it
                stats = extractor.run(until_caught_up=until_caught_up, stop=stop).as_dict()
        except BaseException as exc:
            failed = exc
            raise
        finally:
            if extractor.metrics.server is not None:  # the console: withdrawn, or "stopped since …, why"
                extractor.metrics.server.close(failed)
    finally:
        owner.close()
    if as_json:
        print(json.dumps(stats))
    else:
        console.print(f"extracted {stats['items']} items from {stats['events']} events in {stats['elapsed_s']} s "
                      f"({stats['events_per_s']} events/s); dead-lettered {stats['dead_lettered']}, "
                      f"erased {stats['erased']}, retries {stats['retries']}")


def _serve_metrics(metrics: Any, port: int, addr: str, settings: Settings) -> None:
    from runjournal.core import redis_client

    metrics.serve(port, addr=addr, redis_client=redis_client.client(settings), prefix=settings.topic_prefix)


@memory_app.command("serve")
def serve_command() -> None:
    """Own the embedded Qdrant directory and serve memory and knowledge reads (no extraction) until SIGTERM."""
    from runjournal.consumers.cognition import CognitionOwner
    from runjournal.consumers.vectors.embed import default_embedder
    from runjournal.core.logs import setup_logging
    from runjournal.core.settings import Settings

    setup_logging("INFO")
    settings = Settings.load()
    stop = stop_on_signals()
    with guarded(lambda: CognitionOwner.open(settings, default_embedder()), as_json=False) as owner:
        console.print(f"serving {settings.effective_qdrant_path} at {owner.url or settings.qdrant_url}")
        stop.wait()


@memory_app.command("search")
def search_command(
    query: Annotated[str, typer.Argument(help="What to look for (free text).")],
    tenant: Annotated[str, typer.Option("--tenant", help="Tenant whose memory to search (required).")],
    user: Annotated[str | None, typer.Option("--user", help="Only this user's items.")] = None,
    agent: Annotated[str | None, typer.Option("--agent", help="Only items from this agent's runs.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="Maximum hits.")] = 10,
    all_statuses: Annotated[bool, typer.Option("--all-statuses", help="Include superseded items.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the hits as one JSON array (best first; [] when "
                                                         "none).")] = False,
) -> None:
    """Search one tenant's advisory memory; hits show text, score, scope and provenance."""
    from runjournal.consumers.cognition import open_memory_reader
    from runjournal.core.settings import Settings

    scope = _scope(tenant, user, agent, as_json)
    reader = open_memory_reader(Settings.load())
    try:
        hits: list[MemoryHit] = guarded(lambda: reader.search(scope, query, limit=limit, all_statuses=all_statuses),
                                        as_json=as_json)
    finally:
        reader.close()
    if as_json:  # one JSON document: the hits, best first ([] when none)
        print(json.dumps([hit.as_dict() for hit in hits]))
        return
    for hit in hits:
        p = hit.provenance
        text = hit.text if hit.encrypted is None else f"{hit.text} ({hit.encrypted})"  # sealed, no key (0059)
        print(f"{hit.score:.3f}  [{hit.status}] {hit.kind}/{hit.subject or '-'}  {text}  "
              f"(user {hit.scope.get('user_id') or '-'}, run {p['run_id']}, "
              f"{p['topic']}[{p['partition']}]@{p['offset']}, {hit.freshness['created_at']})")
    if not hits:
        console.print("no memory found")


@memory_app.command("stats")
def stats_command(
    tenant: Annotated[str | None, typer.Option("--tenant", help="Count one tenant's items (default: all).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Collection, embedder and item counts by status."""
    from runjournal.consumers.cognition import open_memory_reader
    from runjournal.core.settings import Settings

    scope = _scope(tenant, None, None, as_json) if tenant is not None else None
    reader = open_memory_reader(Settings.load())
    try:
        out = guarded(lambda: reader.stats(scope), as_json=as_json)
    finally:
        reader.close()
    print(json.dumps(out) if as_json else human_lines(out))


def _scope(tenant: str, user: str | None, agent: str | None, as_json: bool) -> Scope:
    from runjournal.stores import Scope, ScopeError

    try:
        return Scope(tenant, user_id=user, agent_id=agent)
    except ScopeError as exc:
        fail(exc, as_json=as_json, code=2)

"""``runjournal memory-extractor`` and ``runjournal memory search|stats``.

In local mode only one process can open the Qdrant directory: ``memory search`` and ``memory stats``
read it while the extractor is stopped (a clear error says so otherwise) or use the server named
by ``RUNJOURNAL_QDRANT_URL``, which the extractor and any number of readers share.
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich.console import Console

from runjournal.consumers.memory.errors import MemoryPlaneError, ScopeError
from runjournal.consumers.memory.items import MemoryHit, Scope
from runjournal.core.settings import Settings

if TYPE_CHECKING:
    from runjournal.consumers.memory.store import QdrantMemoryStore

__all__ = ["memory_app", "memory_extractor_command"]

T = TypeVar("T")

console = Console(stderr=True)
memory_app = typer.Typer(name="memory", help="Search advisory memory (never execution state).",
                         no_args_is_help=True)


def memory_extractor_command(
    until_caught_up: Annotated[bool, typer.Option("--until-caught-up", help="Exit once lag is 0.")] = False,
    batch_size: Annotated[int, typer.Option(help="Records per consume call.")] = 500,
    as_json: Annotated[bool, typer.Option("--json", help="Print the final stats as JSON.")] = False,
) -> None:
    """Run the memory extractor (group ``{prefix}.memory``) until SIGINT/SIGTERM, or until caught up."""
    from runjournal.cli._errors import cli_errors
    from runjournal.consumers.memory.service import MemoryExtractor
    from runjournal.consumers.topic_identity import preflight
    from runjournal.core.logs import setup_logging

    setup_logging("INFO")
    settings = Settings.load()
    with cli_errors(as_json):  # MemoryPlaneError (a locked directory …), a missing stack or topic: exit 1
        preflight(settings)
        extractor = MemoryExtractor(settings, batch_size=batch_size)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        with cli_errors(as_json):  # an outage past the budget, fenced, unauthorised: exit 1 naming it
            stats = extractor.run(until_caught_up=until_caught_up, stop=stop).as_dict()
    finally:
        extractor.store.close()
    if as_json:
        print(json.dumps(stats))
    else:
        console.print(f"extracted {stats['items']} items from {stats['events']} events in {stats['elapsed_s']} s "
                      f"({stats['events_per_s']} events/s); dead-lettered {stats['dead_lettered']}, "
                      f"erased {stats['erased']}, retries {stats['retries']}")


@memory_app.command("search")
def search_command(
    query: Annotated[str, typer.Argument(help="What to look for (free text).")],
    tenant: Annotated[str, typer.Option("--tenant", help="Tenant whose memory to search (required).")],
    user: Annotated[str | None, typer.Option("--user", help="Only this user's items.")] = None,
    agent: Annotated[str | None, typer.Option("--agent", help="Only items from this agent's runs.")] = None,
    limit: Annotated[int, typer.Option(help="Maximum hits.")] = 10,
    all_statuses: Annotated[bool, typer.Option("--all-statuses", help="Include superseded items.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per hit, one per line.")] = False,
) -> None:
    """Search one tenant's advisory memory; hits show text, score, scope and provenance."""
    scope = _scope(tenant, user, agent)
    with _open_store(as_json) as store:
        hits: list[MemoryHit] = _guarded(lambda: store.search(scope, query, limit=limit, all_statuses=all_statuses),
                                         as_json)
    for hit in hits:
        if as_json:
            print(json.dumps(hit.as_dict()))
        else:
            p = hit.provenance
            print(f"{hit.score:.3f}  [{hit.status}] {hit.kind}/{hit.subject or '-'}  {hit.text}  "
                  f"(user {hit.scope.get('user_id') or '-'}, run {p['run_id']}, "
                  f"{p['topic']}[{p['partition']}]@{p['offset']}, {hit.freshness['created_at']})")
    if not hits and not as_json:
        console.print("no memory found")


@memory_app.command("stats")
def stats_command(
    tenant: Annotated[str | None, typer.Option("--tenant", help="Count one tenant's items (default: all).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Collection, embedder and item counts by status."""
    scope = _scope(tenant, None, None) if tenant is not None else None
    with _open_store(as_json) as store:
        out = _guarded(lambda: store.stats(scope), as_json)
    print(json.dumps(out) if as_json else "\n".join(f"{k}: {v}" for k, v in out.items()))


def _scope(tenant: str, user: str | None, agent: str | None) -> Scope:
    try:
        return Scope(tenant, user_id=user, agent_id=agent)
    except ScopeError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(code=2) from exc


def _guarded(fn: Callable[[], T], as_json: bool = False) -> T:
    from runjournal.cli._errors import fail

    try:
        return fn()
    except MemoryPlaneError as exc:
        raise fail(exc, as_json=as_json) from exc


def _open_store(as_json: bool = False) -> QdrantMemoryStore:
    from runjournal.consumers.memory.embed import default_embedder
    from runjournal.consumers.memory.store import QdrantMemoryStore

    return _guarded(lambda: QdrantMemoryStore.open(Settings.load(), default_embedder()), as_json)

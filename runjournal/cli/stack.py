"""``runjournal stack …`` and ``runjournal topics …`` commands."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from runjournal.cli._tables import folding_table
from runjournal.cli._values import PORT, positive_seconds
from runjournal.deploy.errors import StackError

if TYPE_CHECKING:
    from runjournal.core.settings import Settings
    from runjournal.deploy.stack import Stack, StackPorts

__all__ = ["stack_app", "topics_app"]

stack_app = typer.Typer(help="Start, stop and check the local stack (Kafka, Redis, Qdrant; a schema registry and an "
                             "object store on request).", no_args_is_help=True)
topics_app = typer.Typer(help="Create and check runjournal's Kafka topics.", no_args_is_help=True)
console = Console()
err_console = Console(stderr=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")]


def _stack(settings: Settings, ports: StackPorts | None = None, brokers: int | None = None,
           secure: bool | None = None, redis_cluster: bool | None = None) -> Stack:
    from runjournal.deploy.stack import Stack, StackPorts

    return Stack(settings.stack_dir, settings.cache_dir, ports=ports or StackPorts(), qdrant_url=settings.qdrant_url,
                 brokers=brokers, secure=secure, redis_cluster=redis_cluster, topic_prefix=settings.topic_prefix)


def _fail(exc: Exception | str, as_json: bool = False, code: int = 1) -> typer.Exit:
    from runjournal.cli._errors import fail

    return fail(exc, as_json=as_json, code=code, kind="Interrupted" if code == 130 else None)


@stack_app.command("up")
def stack_up(
    kafka_port: Annotated[int, typer.Option(**PORT, help="Kafka client port on 127.0.0.1 (node i: + 2i).")] = 9092,
    controller_port: Annotated[int, typer.Option(**PORT, help="KRaft controller port on 127.0.0.1 (node i: + 2i).")]
    = 9093,
    redis_port: Annotated[int, typer.Option(**PORT, help="Redis port on 127.0.0.1 (a cluster: node i on + i, its bus "
                                                 "on + 3 + i).")] = 6379,
    brokers: Annotated[int | None, typer.Option(min=1, help="Kafka nodes (broker+controller each, static quorum); 3 is "
                                                     "the production shape: replication 3, min.insync.replicas 2. "
                                                     "Default: the stack's own, or 1.")] = None,
    secure: Annotated[bool, typer.Option("--secure", help="SASL_SSL (SCRAM) listener, a CA and broker certificate "
                                         "made at start, a SCRAM user and ACLs per role; Redis over TLS only, "
                                         "with an ACL user per role and no default user.")] = False,
    redis_cluster: Annotated[bool, typer.Option(
        "--redis-cluster", help="A 3-master Redis Cluster (cluster-enabled redis-server x3 joined by redis-cli "
                                "--cluster create) instead of one Redis server. Default: the stack's own.")] = False,
    timeout_s: Annotated[float, typer.Option(
        "--timeout", callback=positive_seconds, help="Readiness timeout per component, seconds.")] = 120.0,
    registry: Annotated[bool, typer.Option(
        "--registry", help="Also start a schema registry (Apicurio, from Maven Central) and register the "
                           "event schemas in it; commands then use Confluent framing.")] = False,
    registry_port: Annotated[int, typer.Option(**PORT, help="Schema registry HTTP port on 127.0.0.1.")] = 8081,
    object_store: Annotated[bool, typer.Option(
        "--object-store", help="Also start an S3 object store (S3Proxy, from Maven Central; objects are files under "
                               "<stack>/object-store/data) with the bucket runjournal-archive; commands then archive "
                               "to s3://runjournal-archive/<topic prefix>.")] = False,
    object_store_port: Annotated[int, typer.Option(**PORT, help="Object store (S3 API) HTTP port on 127.0.0.1.")]
    = 9000,
    as_json: JsonOpt = False,
) -> None:
    """Start Kafka and Redis (and set up Qdrant's local path); with --registry a schema registry, with
    --object-store an S3 object store too. Idempotent: restarts only what is not running."""
    from runjournal.core.settings import Settings
    from runjournal.deploy.stack import StackPorts
    from runjournal.schemas.errors import SchemaError

    settings = Settings.load()
    ports = StackPorts(kafka_port, controller_port, redis_port, registry_port, object_store_port)
    stack = _stack(settings, ports, brokers, secure or None, redis_cluster or None)
    was_up: set[str] = set()
    try:
        was_up = stack.running()  # processes alive before: a Ctrl-C leaves them alone
        report = stack.up(timeout_s=timeout_s, registry=registry, object_store=object_store)
        if registry:
            report["registry"]["subjects"] = _register(report["registry"]["url"], settings)
    except (StackError, SchemaError) as exc:
        raise _fail(exc, as_json) from exc
    except KeyboardInterrupt:  # Ctrl-C while starting: stop what this command started, say so, exit 130
        stopped = stack.down(only={"kafka", "redis", "registry", "object_store"} - was_up)
        message = "interrupted: stopped what this `stack up` started (" + (", ".join(
            f"{name} {how}" for name, how in stopped.items()) or "nothing yet") + ")"
        if was_up:
            message += f"; {', '.join(sorted(was_up))} ran before it and is left running (`runjournal stack down`)"
        raise _fail(message, as_json, code=130) from None
    if as_json:
        print(json.dumps(report))
        return
    for name in ("kafka", "redis", "qdrant", *(("registry",) if registry else ()),
                 *(("object_store",) if object_store else ())):
        info = report[name]
        where = info.get("bootstrap") or info.get("url") or info.get("path")
        if name == "object_store":
            where = f"{where} (bucket {info.get('bucket')})"
        console.print(f"[green]✓[/] {name:<6} {info['action']:<16} {where}")
    console.print(f"stack up in {report['elapsed_s']} s; state in {settings.stack_dir / 'stack.json'}")
    if report["kafka"].get("secure") or report["redis"].get("secure"):
        console.print("secure: commands use the 'operator' user (Kafka and Redis); `runjournal stack env --role ROLE` "
                      "prints another role's settings")


@stack_app.command("env")
def stack_env(
    role: Annotated[str, typer.Option(help="agent, projector, recovery, memory, operator, archiver, or admin (the "
                                           "stack's administrator).")],
    as_json: JsonOpt = False,
) -> None:
    """Print the RUNJOURNAL_* settings that run a service as ROLE's user on the secure local stack (its Kafka
    SCRAM user and its Redis ACL user)."""
    from runjournal.core.settings import Settings

    try:
        env = _stack(Settings.load()).role_env(role)
    except StackError as exc:
        raise _fail(exc) from exc
    if as_json:
        print(json.dumps(env))
        return
    for key, value in env.items():
        print(f"export {key}={shlex.quote(value)}")


def _register(url: str, settings: Settings) -> dict[str, Any]:
    """Register the published event schemas under ``{prefix}.events-value`` (FULL_TRANSITIVE)."""
    from runjournal.schemas.registration import register_versions

    subject = f"{settings.events_topic}-value"
    rows = register_versions(url, subject)
    refused = [r for r in rows if r.action == "refused"]
    if refused:
        raise StackError(f"the registry refused {refused[0].version} in {subject}: {refused[0].detail}")
    return {subject: [r.as_dict() for r in rows]}


@stack_app.command("down")
def stack_down(as_json: JsonOpt = False) -> None:
    """Stop the processes 'stack up' started (graceful, then forceful). Harmless when nothing runs."""
    from runjournal.core.settings import Settings

    result = _stack(Settings.load()).down()
    if as_json:
        print(json.dumps(result))
        return
    for name, what in result.items():
        console.print(f"{name:<6} {what}")


@stack_app.command("status")
def stack_status(as_json: JsonOpt = False) -> None:
    """Report each component's health; exit code 1 when any is unhealthy."""
    from runjournal.core.settings import Settings

    report = _stack(Settings.load()).status()
    healthy = all(c.get("healthy") for c in report.values())
    if as_json:
        print(json.dumps({**report, "healthy": healthy}))
    else:
        table = folding_table("component", "healthy", "endpoint", "detail")
        for name, info in report.items():
            endpoint = info.get("bootstrap") or info.get("url") or info.get("path") or ""
            detail = info.get("detail") or _status_detail(info)
            table.add_row(name, "[green]yes[/]" if info.get("healthy") else "[red]no[/]", str(endpoint), detail)
        console.print(table)
    if not healthy:
        raise typer.Exit(code=1)


def _status_detail(info: dict[str, Any]) -> str:
    parts = []
    if info.get("version"):
        parts.append(f"v{info['version']}")
    if info.get("pid"):
        parts.append(f"pid {info['pid']}")
    if info.get("rss_bytes"):
        parts.append(f"rss {info['rss_bytes'] / 2**20:.0f} MiB")
    if "aof_enabled" in info:
        parts.append(f"aof {'on' if info['aof_enabled'] else 'off'}")
    return ", ".join(parts)


@topics_app.command("create")
def topics_create(
    partitions: Annotated[
        int | None, typer.Option(min=1, help="Events topic partitions (default RUNJOURNAL_PARTITIONS).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create runjournal.events (compacted) and the two DLQs. Idempotent; refuses a mismatched events topic."""
    from runjournal.cli._errors import cli_errors
    from runjournal.consumers.runtime.topic_identity import preflight
    from runjournal.core.settings import Settings

    settings = Settings.load()
    with cli_errors(as_json):  # TopicConfigError, no broker (named within 5 s): exit 1
        preflight(settings, need_topic=False, need_redis=False)
        reports = _create(settings, partitions)
    _print_topics(reports, as_json)


def _create(settings: Settings, partitions: int | None) -> list[Any]:
    from runjournal.deploy.topics import create_topics

    return create_topics(settings, partitions)


@topics_app.command("describe")
def topics_describe(as_json: JsonOpt = False) -> None:
    """Show partition counts and the configs runjournal relies on; exits 1 after the table when a topic is missing
    (naming `runjournal topics create`)."""
    from runjournal.cli._errors import cli_errors, fail
    from runjournal.consumers.runtime.topic_identity import preflight
    from runjournal.core.settings import Settings
    from runjournal.deploy.topics import describe_topics

    settings = Settings.load()
    with cli_errors(as_json):
        preflight(settings, need_topic=False, need_redis=False)
        reports = describe_topics(settings)
    missing = [r.name for r in reports if r.action == "missing"]
    if not (missing and as_json):  # under --json a failure prints nothing on stdout
        _print_topics(reports, as_json)
    if missing:
        raise fail(f"missing topic(s) {', '.join(missing)} (prefix {settings.topic_prefix}): run "
                   "`runjournal topics create`", as_json=as_json, kind="TopicNotFoundError")


def _print_topics(reports: list[Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps([asdict(r) for r in reports]))
        return
    table = folding_table("topic", "action", "partitions", "topic id", "config")
    for r in reports:
        table.add_row(r.name, r.action, str(r.partitions), r.topic_id or "",
                      ", ".join(f"{k}={v}" for k, v in sorted(r.config.items())))
    console.print(table)

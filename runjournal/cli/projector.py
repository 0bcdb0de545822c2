"""``runjournal projector`` and ``runjournal inspect``."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console

from runjournal.cli._errors import cli_errors
from runjournal.cli._signals import stop_on_signals
from runjournal.cli._tables import folding_table
from runjournal.cli._values import PORT
from runjournal.cli.replay import timeline_type

__all__ = ["inspect_command", "projector_command"]

console = Console()
err_console = Console(stderr=True)


def projector_command(
    until_caught_up: Annotated[bool, typer.Option("--until-caught-up", help="Exit once lag is 0.")] = False,
    rebuild: Annotated[bool, typer.Option("--rebuild", help="Wipe this prefix's projection first; "
                                          "replay from the earliest offset.")] = False,
    batch_size: Annotated[int, typer.Option(min=1, help="Records per consume call.")] = 2000,
    metrics_port: Annotated[int | None, typer.Option(**PORT, help="Serve Prometheus /metrics on this port.")] = None,
    metrics_addr: Annotated[str, typer.Option(help="Bind address of /metrics.")] = "0.0.0.0",
    instance_id: Annotated[str | None, typer.Option(help="Static group membership id (a restart with the same "
                                                    "id takes its partitions back at once).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the final stats as JSON.")] = False,
) -> None:
    """Run the state projector (a consumer-group member) until SIGINT/SIGTERM, or until caught up.

    Exits 1 naming the cause and its fix when the stack or topic is missing, when the projection in Redis
    was built from another topic (``--rebuild`` repairs it), when it is fenced (another member with the same
    ``--instance-id``) or unauthorised, or when a dependency stays away longer than the outage budget.
    """
    from runjournal.consumers.projector.service import Projector
    from runjournal.consumers.runtime.topic_identity import preflight
    from runjournal.core.logs import setup_logging
    from runjournal.core.settings import Settings

    setup_logging("INFO")
    settings = Settings.load()
    with cli_errors(as_json):
        preflight(settings)
        projector = Projector(settings, batch_size=batch_size, group_instance_id=instance_id)
        if rebuild:
            from runjournal.consumers.runtime.topic_identity import check_rebuild, describe_events_topic

            check_rebuild(projector.redis, settings.topic_prefix, describe_events_topic(settings))
            deleted = projector.store.wipe()
            err_console.print(f"rebuild: wiped {deleted} Redis keys of prefix {settings.topic_prefix}; "
                              "replaying from the earliest offset")
        stop = stop_on_signals()  # before /metrics is announced: a SIGTERM from then on withdraws it (finally)
        failed: BaseException | None = None
        try:
            if metrics_port is not None:
                projector.metrics.serve(metrics_port, addr=metrics_addr, redis_client=projector.redis,
                                        prefix=settings.topic_prefix)
            stats = projector.run(until_caught_up=until_caught_up, stop=stop)
        except BaseException as exc:
            failed = exc
            raise
        finally:
            if projector.metrics.server is not None:  # the console: withdrawn, or "stopped since …, why" (fenced …)
                projector.metrics.server.close(failed)
    out = stats.as_dict()
    if as_json:
        print(json.dumps(out))
    else:
        console.print(f"projected {out['events']} events in {out['elapsed_s']} s "
                      f"({out['events_per_s']} events/s); dead-lettered {out['dead_lettered']}, "
                      f"parked {len(out['parked_runs'])}, blocked {len(out['blocked_runs'])}")


def inspect_command(
    run_id: Annotated[str, typer.Argument(help="The run to show.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    timeline: Annotated[bool, typer.Option(help="Read the run's events from the topic too.")] = True,
) -> None:
    """Show a run's projected state (input, output, graph nodes, approvals), execution records and (from the topic)
    its timeline; an archived run is read from the archive, which is named (``"archived"`` in --json)."""
    from runjournal.cli._errors import fail
    from runjournal.consumers.ops.inspect import inspect_run
    from runjournal.consumers.runtime.topic_identity import preflight
    from runjournal.core.settings import Settings

    settings = Settings.load()
    with cli_errors(as_json):
        preflight(settings)
        report = inspect_run(settings, run_id, with_timeline=timeline)
    if report is None:
        from runjournal.cli.archive import archived_report

        with cli_errors(as_json):
            archived = archived_report(settings, run_id)
        if archived is not None:  # archived runs stay first-class (decision 0056): read from the object
            from runjournal.producers.encryption import ContentCrypto

            shown = ContentCrypto(settings, encrypt=False).reveal_state(archived["state"])  # decision 0059
            report = {"run_id": run_id, "partition": archived["partition"], "state": shown,
                      "archived": archived["archived"]}
            if timeline:
                report["timeline"] = archived["timeline"]
    if report is None:
        raise fail(f"no state for run {run_id} in Redis (prefix {settings.topic_prefix}): is the projector running "
                   "(`runjournal projector`), and is RUNJOURNAL_TOPIC_PREFIX right? `runjournal replay RUN_ID` "
                   "rebuilds it from the topic alone.", as_json=as_json, kind="RunNotFound")
    if as_json:
        print(json.dumps(report, default=str))
        return
    st = report["state"]
    console.print(f"run {run_id}  partition {report['partition']}  status [bold]{st['status']}[/]  "
                  f"epoch {st['epoch']}  last seq {st['last_seq']}  owner {st.get('owner') or '-'}")
    if report.get("archived"):
        console.print(f"  archived: {report['archived']}", markup=False, highlight=False)
    for label, key in (("input", "input_json"), ("output", "output_json"), ("error", "error"),
                       ("gap", "gap_reason"), ("blocked", "blocked_reason")):
        if st.get(key):
            console.print(f"  {label}: {_clip(str(st[key]))}", markup=False, highlight=False)
    for line in _control_lines(run_id, st):
        console.print(f"  {line}", markup=False, highlight=False)
    for approval_id, pending in sorted((st.get("pending_approvals") or {}).items()):
        console.print(f"  pending approval {approval_id}: {pending.get('tool') or '-'} — {pending.get('reason')} "
                      f"(`runjournal approve {run_id} {approval_id}` / `deny`)", markup=False, highlight=False)
        if pending.get("args_json"):  # what the approver decides about (envelope v4)
            console.print(f"    arguments: {_clip(pending['args_json'])}", markup=False, highlight=False)
    if st.get("nodes"):  # NODE_* events: a framework's graph (GraphNodeJournal) or RunHandle.node
        nodes = folding_table("node", "status", "attempt", "error", title="graph nodes")
        for path, node in st["nodes"].items():
            nodes.add_row(path, node.get("status"), str(node.get("attempt")), _clip(node.get("error") or "", 200))
        console.print(nodes)
    records = folding_table("call_id", "tool", "status", "attempts", "epoch", "idempotency key",
                            title="execution records")
    for cid, rec in sorted(st.get("records", {}).items()):
        records.add_row(cid, rec.get("tool"), rec.get("status"), str(rec.get("attempts")), str(rec.get("epoch")),
                        str(rec.get("idempotency_key"))[:16])
    console.print(records)
    if report.get("timeline"):
        tl = folding_table("seq", "epoch", "type", "offset", "node", title="timeline")
        for row in report["timeline"]:
            tl.add_row(str(row["seq"]), str(row["epoch"]), timeline_type(row), str(row["offset"]),
                    row.get("node_id") or "")
        console.print(tl)


def _clip(text: str, limit: int = 400) -> str:
    """``text`` on one line, cut at ``limit`` characters with the full length said (``--json`` has it whole)."""
    one = " ".join(text.split())
    return one if len(one) <= limit else f"{one[:limit]}… ({len(one)} characters; --json shows it whole)"


def _control_lines(run_id: str, st: dict[str, Any]) -> list[str]:
    """What operators and waits did to the run, in words (docs/design/decisions/0047-operator-controls.md)."""
    out = []
    who, why = st.get("requested_by"), st.get("request_reason")
    if st.get("status") == "PAUSED":
        if st.get("waiting_for"):
            out.append(f"waiting for signal {st['waiting_for']!r} (runjournal signal {run_id} {st['waiting_for']})")
        elif st.get("resume_at_ms") is not None:
            out.append(f"sleeping until {st['resume_at_ms']} ms (Redis's clock); the recovery sweep resumes it")
        else:
            out.append(f"paused by {who or 'an operator'}{': ' + why if why else ''} "
                       f"(runjournal resume {run_id})")
    elif st.get("status") == "CANCELLED" and who:
        out.append(f"cancelled by {who}")
    elif who and st.get("status") not in ("SUCCEEDED", "FAILED"):
        out.append(f"last resumed or forked by {who}{': ' + why if why else ''}")
    if st.get("forked_from"):
        out.append(f"forked from {st['forked_from']} at seq {st.get('forked_at_seq')}")
    return out

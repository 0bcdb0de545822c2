"""``runjournal demo``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from runjournal.cli._tables import folding_table
from runjournal.cli._values import positive_seconds

__all__ = ["demo_command"]

console = Console(stderr=True)

_SUMMARY_KEYS = ("runs_total", "runs_completed", "runs_outcome_matches_input", "events_published", "agents",
                 "crashes_injected", "projector_kills", "runs_recovered", "side_effects_expected",
                 "side_effects_executed", "side_effect_duplicates", "outcome_unknown_reconciled",
                 "projection_mismatches", "acked_events", "acked_events_missing", "runs_unfinished", "runs_parked",
                 "runs_orphaned", "runs_cancelled", "runs_forked", "controls_ok", "spend_mismatches", "faults_injected",
                 "memory_items_written", "memory_items_without_provenance",
                 "projector_lag_ms_p50", "projector_lag_ms_p99", "contexts_built", "contexts_with_memory",
                 "contexts_with_knowledge", "elapsed_s", "ok")


def demo_command(
    input: Annotated[list[Path] | None, typer.Option("--input", help="tau-bench trajectory JSON (repeatable).")]
    = None,
    agents: Annotated[int, typer.Option(min=1, help="Agent instances running at once.")] = 4,
    kills: Annotated[int, typer.Option(min=0, help="Agent instances to SIGKILL, spread over the demo by progress.")]
    = 10,
    kill_every: Annotated[float | None, typer.Option(callback=positive_seconds,
                                                    help="Instead: SIGKILL an agent every this many seconds.")]
    = None,
    seed: Annotated[int, typer.Option(help="Seed of the chaos (and of the generated workload).")] = 1,
    provider_idempotency: Annotated[str, typer.Option(help="on | off: the provider honours idempotency keys.")]
    = "off",
    runs: Annotated[int, typer.Option(min=1, help="Generated runs when no --input is given.")] = 60,
    partitions: Annotated[int, typer.Option(min=1, help="Partitions of the demo's events topic.")] = 6,
    memory: Annotated[bool, typer.Option(help="Run the memory extractor as a service.")] = True,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the demo's topics, Redis keys, Qdrant collection "
                                       "and work folder (default: removed at the end).")] = False,
    knowledge: Annotated[list[Path] | None, typer.Option(
        "--knowledge", help="Markdown document to ingest as the agents' knowledge corpus (repeatable).")] = None,
    faults: Annotated[str, typer.Option(help="Fault kinds to inject while the fleet runs: all, none, or a comma "
                                        "list of agents, zombies, same_id, projector, projector_stall, broker, "
                                        "broker_stall, redis, recovery, recovery_pair, operators, cancels, skew, "
                                        "graph, partitions, memory, qdrant, registry, "
                                        "archiver, controls.")] = "agents,projector",
    fault_times: Annotated[int, typer.Option(min=1, help="Inject each fault kind at least this many times.")] = 1,
    outcome_commit: Annotated[str | None, typer.Option(
        help="group | strict: the agents' outcome mode (default RUNJOURNAL_OUTCOME_COMMIT, else group).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as one JSON object.")] = False,
    report: Annotated[Path | None, typer.Option(help="Write a self-contained HTML report here.")] = None,
) -> None:
    """The main job: an agent fleet runs real (or generated) runs under a seeded fault campaign; every run is
    verified against independent witnesses (topic, ledger, ack logs, input, Qdrant)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from runjournal.cli._errors import cli_errors, fail
    from runjournal.consumers.runtime.topic_identity import preflight
    from runjournal.core.settings import Settings
    from runjournal.demo.run import DemoOptionError, DemoOptions, run_demo

    if provider_idempotency not in {"on", "off"}:
        raise fail("--provider-idempotency is on or off", as_json=as_json, code=2, kind="UsageError")
    if outcome_commit not in {None, "group", "strict"}:
        raise fail("--outcome-commit is group or strict", as_json=as_json, code=2, kind="UsageError")
    opts = DemoOptions(inputs=list(input or []), agents=agents, kills=kills, kill_every_s=kill_every, seed=seed,
                       provider_idempotency=provider_idempotency == "on", generated_runs=runs, partitions=partitions,
                       memory=memory, knowledge=list(knowledge or []), keep=keep, faults=faults,
                       fault_times=fault_times, outcome_commit=outcome_commit)
    try:  # every value and --input file, before the stack is asked anything or a topic is created
        opts.check()
    except DemoOptionError as exc:
        raise fail(exc, as_json=as_json, code=2) from exc
    with cli_errors(as_json):  # no stack: named within 5 s, before any progress bar
        preflight(Settings.load(), need_topic=False)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=console,
                  transient=as_json) as bar:
        task = bar.add_task("runs completed", total=None, detail="")

        def progress(done: int, total: int, fleet: Any) -> None:
            bar.update(task, completed=done, total=total,
                       detail=f"agents {len(fleet.agents)} · crashes {fleet.crashes_injected} · "
                              f"projector kills {fleet.projector_kills}")

        def on_plan(plan: list[Any], skipped: dict[str, str]) -> None:
            console.print(f"[bold]fault schedule[/bold] (seed {seed}): " + (", ".join(
                f"{s.kind}@{s.at:.0%}" for s in plan) or "none"))
            for kind, why in skipped.items():
                console.print(f"  not in 'all' here: {kind} ({why})")

        try:
            with cli_errors(as_json):  # FaultSpecError: a fault this stack cannot take, named before anything starts
                summary = run_demo(opts, progress=progress, on_plan=on_plan)
        except KeyboardInterrupt:  # run_demo stopped every process it started and (without --keep) removed its data
            bar.stop()
            kept = "its topics, keys and work folder are kept (--keep)" if keep else \
                "its topics, Redis keys and work folder were removed"
            raise fail(f"interrupted: the demo stopped every process it started; {kept}", as_json=as_json, code=130,
                       kind="Interrupted") from None
    if report:
        from runjournal.demo.report import write_report

        write_report(report, summary)
    if as_json:
        print(json.dumps({k: v for k, v in summary.items()
                          if k not in {"per_run", "timeline", "recoveries", "series", "context_example"}}, default=str))
    else:
        failed = [c for c in summary.get("checks", []) if not c["held"]]
        if summary["ok"]:  # the verdict first, then the figures
            Console().print(f"[bold green]PASSED[/] — all {len(summary.get('checks', []))} checks held")
        else:
            Console().print("[bold red]FAILED[/] — " + ("; ".join(f"{c['check']} ({c['observed']})" for c in failed)
                                                        or "see the table"), highlight=False)
        table = folding_table("check", "value", title=f"runjournal demo · {summary['topic_prefix']}")
        for key in _SUMMARY_KEYS:
            value = summary.get(key)
            style = "" if key != "ok" else ("[bold green]" if value else "[bold red]")
            table.add_row(key, f"{style}{value}")
        Console().print(table)
    if not summary["ok"]:
        raise typer.Exit(code=1)

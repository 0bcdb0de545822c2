"""``runjournal recover``."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from runjournal.core.settings import Settings

__all__ = ["recover_command"]

console = Console()


def recover_command(
    stale: Annotated[bool, typer.Option("--stale", help="Runs of every instance whose lease expired.")] = False,
    instance: Annotated[str | None, typer.Option("--instance", help="Runs of this (dead) instance.")] = None,
    run: Annotated[list[str] | None, typer.Option("--run", help="A run to recover (repeatable).")] = None,
    assign_to: Annotated[str | None, typer.Option(help="Hand runs to this live instance (default: least loaded).")]
    = None,
    force: Annotated[bool, typer.Option("--force", help="Recover even if the owner holds a live lease.")] = False,
    watch: Annotated[float | None, typer.Option(help="Repeat a --stale pass every this many seconds.")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="Serve Prometheus /metrics on this port.")] = None,
    metrics_addr: Annotated[str, typer.Option(help="Bind address of /metrics.")] = "0.0.0.0",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
) -> None:
    """Fence dead instances, read end offsets, fold tails, classify calls, resume runs under a new epoch.

    Exits 1 naming the cause and its fix when the stack or topic is missing, the projection was built from
    another topic, a named instance or run is live (without --force), or recovery is fenced by another job.
    Under --json the report is the only thing on stdout; an error is JSON on stderr.
    """
    from runjournal.cli._errors import cli_errors, fail
    from runjournal.cli._signals import stop_on_signals
    from runjournal.consumers.recovery.job import RecoveryJob
    from runjournal.consumers.topic_identity import preflight
    from runjournal.core.logs import setup_logging

    if not (stale or instance or run):
        raise fail("say which runs: --stale, --instance ID or --run RUN_ID", as_json=as_json, code=2,
                   kind="UsageError")
    setup_logging("WARNING")
    settings = Settings.load()
    with cli_errors(as_json):
        preflight(settings)
        job = RecoveryJob(settings)
    try:
        with cli_errors(as_json):  # the metrics port taken: one line naming it (JSON under --json), exit 1
            observed = _Observed(job, metrics_port, metrics_addr)
    except BaseException:
        job.close()
        raise
    stop = stop_on_signals()  # SIGTERM as Ctrl-C: the pass ends, the finally below withdraws the announcement
    try:
        while not stop.is_set():
            with cli_errors(as_json):  # RecoveryError (a live owner, no --force) included: exit 1
                started = time.monotonic()
                try:
                    report = job.recover(stale=stale, instance=instance, runs=run, force=force, assign_to=assign_to)
                except Exception as exc:
                    observed.failed(exc, time.monotonic() - started)
                    raise
            observed.passed(report.as_dict(), time.monotonic() - started)
            _print(report.as_dict(), as_json)
            if watch is None:
                break
            stop.wait(watch)
    finally:
        observed.close()
        job.close()


class _Observed:
    """The sweep's metrics (``--metrics-port``): each pass, its duration and result, and the backlog after it."""

    def __init__(self, job: Any, port: int | None, addr: str) -> None:
        self.job = job
        self.metrics: Any = None
        self._partitions: int | None = None
        if port is not None:
            from runjournal.consumers.recovery.metrics import RecoveryMetrics

            self.metrics = RecoveryMetrics()
            self.metrics.serve(port, addr=addr, redis_client=job.redis, prefix=job.settings.topic_prefix)

    def failed(self, exc: BaseException, duration_s: float) -> None:
        if self.metrics is not None:
            self.metrics.observe_failure(exc, duration_s)

    def passed(self, report: dict[str, Any], duration_s: float) -> None:
        if self.metrics is None:
            return
        from runjournal.consumers._partitions import events_partition_count
        from runjournal.consumers.recovery.metrics import recovery_backlog

        self.metrics.observe_pass(report, duration_s)
        if self._partitions is None:
            self._partitions = events_partition_count(self.job.settings)
        self.metrics.observe_backlog(recovery_backlog(self.job.redis, self.job.settings.topic_prefix,
                                                      self._partitions))

    def close(self) -> None:
        if self.metrics is not None and self.metrics.server is not None:
            self.metrics.server.close()


def _print(report: dict, as_json: bool) -> None:  # type: ignore[type-arg]
    if as_json:
        print(json.dumps(report, default=str))
        return
    table = Table("run", "action", "owner", "epoch", "assigned to", "calls", "detail")
    for r in report["runs"]:
        epoch = f"{r['previous_epoch']}→{r['epoch']}" if r.get("epoch") else str(r.get("previous_epoch"))
        calls = ", ".join(f"{k}={v}" for k, v in sorted(r["calls"].items()))
        table.add_row(r["run_id"], r["action"], str(r["owner"]), epoch, str(r.get("assigned_to") or ""), calls,
                      str(r.get("detail") or ""))
    console.print(table)
    offsets = ", ".join(f"p{p['partition']}:{p['start']}→{p['end']}" for p in report["offsets"])
    console.print(f"recovered {report['runs_recovered']} run(s) in {report['recovery_ms']} ms; fenced "
                  f"{report['fenced'] or 'nobody'}; calls {report['calls']}; offsets read {offsets or '-'}")

"""``runjournal recover``."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer
from rich.console import Console

from runjournal.cli._tables import folding_table
from runjournal.cli._values import PORT, positive_seconds

__all__ = ["recover_command"]

console = Console()


def recover_command(
    stale: Annotated[bool, typer.Option("--stale", help="Runs of every instance whose lease expired.")] = False,
    instance: Annotated[str | None, typer.Option("--instance", help="Runs of this (dead) instance.")] = None,
    run: Annotated[list[str] | None, typer.Option("--run", help="A run to recover (repeatable).")] = None,
    assign_to: Annotated[str | None, typer.Option(help="Hand runs to this live instance (default: least loaded).")]
    = None,
    force: Annotated[bool, typer.Option("--force", help="Recover even if the owner holds a live lease.")] = False,
    watch: Annotated[float | None, typer.Option(callback=positive_seconds,
                                                help="Repeat a --stale pass every this many seconds (> 0).")] = None,
    metrics_port: Annotated[int | None, typer.Option(**PORT, help="Serve Prometheus /metrics on this port.")] = None,
    metrics_addr: Annotated[str, typer.Option(help="Bind address of /metrics.")] = "0.0.0.0",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
) -> None:
    """Fence dead instances, read end offsets, fold tails, classify calls, resume runs under a new epoch.

    Exits 1 naming the cause and its fix when the stack or topic is missing, the projection was built from
    another topic, a named instance or run is live (without --force) or never existed (before any pass), or
    recovery is fenced by another job; exits 2 on a usage error (--watch must be > 0).
    Under --json the report is the only thing on stdout; an error is JSON on stderr.
    """
    from runjournal.cli._errors import cli_errors, fail
    from runjournal.cli._signals import stop_on_signals
    from runjournal.consumers.recovery.job import RecoveryJob
    from runjournal.consumers.runtime.topic_identity import preflight
    from runjournal.core.logs import setup_logging
    from runjournal.core.settings import Settings

    if not (stale or instance or run):
        raise fail("say which runs: --stale, --instance ID or --run RUN_ID", as_json=as_json, code=2,
                   kind="UsageError")
    setup_logging("WARNING")
    stop = stop_on_signals()  # first: SIGTERM as Ctrl-C even before /metrics is announced (the finally withdraws it)
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
    idle = False
    failed: BaseException | None = None
    try:
        _refuse_unknown(job, instance=instance, runs=run or [], as_json=as_json)  # before any pass
        while not stop.is_set():
            with cli_errors(as_json):  # RecoveryError (a live owner, no --force) included: exit 1
                started = time.monotonic()
                try:
                    report = job.recover(stale=stale, instance=instance, runs=run, force=force, assign_to=assign_to)
                except Exception as exc:
                    observed.failed(exc, time.monotonic() - started)
                    raise
            observed.passed(report.as_dict(), time.monotonic() - started)
            if watch is not None and not as_json and not report.runs:
                if not idle:  # an empty pass says so once, not one empty table per pass
                    console.print(f"nothing to recover: no run of an instance without a lease (passes every "
                                  f"{watch:g} s; this line again after a pass that finds one)")
                idle = True
            else:
                _print(report.as_dict(), as_json)
                idle = False
            if watch is None:
                break
            stop.wait(watch)
    except BaseException as exc:
        failed = exc
        raise
    finally:
        observed.close(failed)
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
        from runjournal.consumers.recovery.metrics import recovery_backlog
        from runjournal.consumers.runtime.partitions import events_partition_count

        self.metrics.observe_pass(report, duration_s)
        if self._partitions is None:
            self._partitions = events_partition_count(self.job.settings)
        self.metrics.observe_backlog(recovery_backlog(self.job.redis, self.job.settings.topic_prefix,
                                                      self._partitions))

    def close(self, failed: BaseException | None) -> None:
        """Stop /metrics: withdrawn after a clean stop, a "stopped since …, why" marker after ``failed``."""
        if self.metrics is not None and self.metrics.server is not None:
            self.metrics.server.close(failed)


def _refuse_unknown(job: Any, *, instance: str | None, runs: list[str], as_json: bool) -> None:
    """Exit 1 before any pass when a named run or instance never existed (a typo is not a clean pass): a run with
    no run-id claim and no projected state (``RecoveryJob.unknown_runs``), an instance no Journal ever started
    (``Instances.known``). Nothing is fenced, published or printed on stdout."""
    from runjournal.cli._errors import cli_errors, fail

    with cli_errors(as_json):
        unknown = job.unknown_runs(runs) if runs else []
        never = instance is not None and not job.instances.known(instance)
    if unknown:
        raise fail(f"no run {', '.join(unknown)} in the journal (never claimed, no projected state): check the id "
                   "— `runjournal inspect RUN_ID` shows a run the projection knows", as_json=as_json,
                   kind="UnknownRunError")
    if never:
        raise fail(f"no instance {instance} ever started here (no incarnation of its name, no key of it): check the "
                   "id — it is an event's producer_id (`runjournal inspect RUN_ID` shows a run's owner)",
                   as_json=as_json, kind="UnknownInstanceError")


def _print(report: dict, as_json: bool) -> None:  # type: ignore[type-arg]
    if as_json:
        print(json.dumps(report, default=str))
        return
    table = folding_table("run", "action", "owner", "epoch", "assigned to", "calls", "detail")
    for r in report["runs"]:
        epoch = f"{r['previous_epoch']}→{r['epoch']}" if r.get("epoch") else str(r.get("previous_epoch"))
        calls = ", ".join(f"{k}={v}" for k, v in sorted(r["calls"].items()))
        table.add_row(r["run_id"], r["action"], str(r["owner"]), epoch, str(r.get("assigned_to") or ""), calls,
                      str(r.get("detail") or ""))
    console.print(table)
    offsets = ", ".join(f"p{p['partition']}:{p['start']}→{p['end']}" for p in report["offsets"])
    fenced = ", ".join(report["fenced"]) or "nobody"
    calls = ", ".join(f"{k} {v}" for k, v in sorted(report["calls"].items())) or "none"
    console.print(f"recovered {report['runs_recovered']} run(s) in {report['recovery_ms']} ms; fenced {fenced}; "
                  f"calls {calls}; offsets read {offsets or '-'}")

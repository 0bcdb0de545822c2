"""``runjournal replay``: a run's state at any seq, rebuilt from the topic (time travel; nothing runs)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console

from runjournal.cli._tables import folding_table

__all__ = ["timeline_type", "replay_command"]

console = Console(soft_wrap=True)


def replay_command(
    run_id: Annotated[str, typer.Argument(help="The run to replay.")],
    until_seq: Annotated[int | None, typer.Option("--until-seq", min=1,
                                                  help="Stop once the run reaches this seq (default: all).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Rebuild a run's state, execution records and timeline from the topic, up to --until-seq.

    Reads only the journal (not the Redis projection) and runs no tool: docs/design/protocol.md § Replay is not resume.
    An archived run is rebuilt from the archive, which is named (``"archived"`` in --json). Exits 1 when neither the
    topic nor the archive holds the run.
    """
    from runjournal.cli._errors import cli_errors, fail
    from runjournal.cli.archive import archived_report
    from runjournal.consumers.ops.replay import replay_state
    from runjournal.consumers.runtime.topic_identity import preflight
    from runjournal.core.settings import Settings

    settings = Settings.load()
    with cli_errors(as_json):
        preflight(settings, need_redis=False)
        # an archived run is read from its object: its records in the topic are tombstoned (until compaction
        # drops them they would still fold; decision 0056)
        archived = archived_report(settings, run_id, until_seq=until_seq)
        replayed = None if archived is not None else replay_state(settings, run_id, until_seq=until_seq)
    from runjournal.producers.encryption import ContentCrypto

    content = ContentCrypto(settings, encrypt=False)  # content shown opened, or "encrypted" (decision 0059)
    if archived is not None:
        archived = _revealed(archived, content)
        if as_json:
            print(json.dumps(archived, default=str))
        else:
            _print(archived)
        return
    assert replayed is not None
    if replayed.state is None:
        raise fail(f"the topic holds no event of run {run_id} (never started, or erased)", as_json=as_json,
                   kind="RunNotFound")
    report = _revealed(replayed.as_dict(), content)
    if as_json:
        print(json.dumps(report, default=str))
        return
    _print(report)


def _revealed(report: dict[str, Any], content: Any) -> dict[str, Any]:
    """``report`` with its state's content and its execution records' opened (``ContentCrypto.reveal_state``)."""
    if not isinstance(report.get("state"), dict):
        return report
    state = content.reveal_state(report["state"])
    by_call = {r.get("call_id"): r for r in (state.get("records") or {}).values() if isinstance(r, dict)}
    records = [by_call.get(r.get("call_id"), r) for r in report.get("execution_records") or []]
    return {**report, "state": state, **({"execution_records": records} if "execution_records" in report else {})}


def _print(report: dict[str, Any]) -> None:
    st = report["state"]
    point = f"up to seq {report['until_seq']}" if report["until_seq"] is not None else "full history"
    console.print(f"run {report['run_id']}  partition {report['partition']}  ({point})  status [bold]{st['status']}"
                  f"[/]  epoch {st['epoch']}  last seq {st['last_seq']}  owner {st.get('owner')}")
    if report.get("archived"):
        console.print(f"  archived: {report['archived']}")
    for name in ("blocked_reason", "gap_reason", "output_json", "error"):
        if st.get(name):
            console.print(f"  {name}: {st[name]}")
    if st.get("pending_approvals"):
        console.print(f"  pending approvals: {', '.join(sorted(st['pending_approvals']))}")
    records = folding_table("call_id", "tool", "status", "attempts", "epoch", "result", title="execution records")
    for rec in report["execution_records"]:
        records.add_row(rec["call_id"], rec["tool"], rec["status"], str(rec["attempts"]), str(rec["epoch"]),
                        str(rec.get("result_json") or rec.get("result_ref") or rec.get("error") or "")[:40])
    console.print(records)
    timeline = folding_table("seq", "epoch", "type", "offset", "node", title="timeline")
    for row in report["timeline"]:
        timeline.add_row(str(row["seq"]), str(row["epoch"]), timeline_type(row), str(row["offset"]),
                    row.get("node_id") or "")
    console.print(timeline)


def timeline_type(row: dict[str, Any]) -> str:
    """The timeline's type column: a newer writer's type shows as ``UNKNOWN (SYMBOL)``."""
    return f"UNKNOWN ({row['writer_type']})" if row.get("writer_type") else str(row["type"])

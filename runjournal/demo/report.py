"""``runjournal demo --report PATH``: one self-contained HTML file (inline CSS and SVG; no scripts, no fetches)."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

__all__ = ["write_report"]

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse}td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:left}
.ok{color:#080;font-weight:bold}.bad{color:#c00;font-weight:bold}
.committed{background:#cfe8cf}.reconciled{background:#cfd8f5}.re-run{background:#f8e3b5}
.failed,.unknown{background:#f5c6c6}
.verdict{padding:10px 14px;border-radius:4px;font-size:16px}.verdict.ok{background:#e3f3e3}
.verdict.bad{background:#f8dddd}.status-FAILED{color:#a60}.status-SUCCEEDED{color:#222}
.chip{display:inline-block;padding:1px 6px;margin:1px;border-radius:3px;font-size:12px}
svg text{font-size:10px;fill:#444}
"""
_COLORS = {"spawn": "#4a8", "kill": "#c33", "exit": "#888", "projector_kill": "#c0c", "recovery": "#36c",
           "stop": "#e90", "cont": "#0aa", "fault": "#f60", "fault_end": "#096", "fault_error": "#000"}
_INFRA = ("broker", "redis", "registry", "qdrant", "projector", "memory", "recovery")


def _esc(x: Any) -> str:
    return html.escape(str(x))


def _verdict(summary: dict[str, Any]) -> str:
    """The verdict first: passed or failed, and the checks that did not hold (all of them below, with what was
    observed)."""
    checks = summary.get("checks", [])
    failed = [c for c in checks if not c["held"]]
    if summary.get("ok"):
        head = f"<p class='verdict ok'>PASSED — all {len(checks)} checks held</p>"
    else:
        names = "; ".join(f"{c['check']} ({c['observed']})" for c in failed) or "see the summary"
        head = f"<p class='verdict bad'>FAILED — {_esc(names)}</p>"
    rows = "".join(f"<tr><td class='{'ok' if c['held'] else 'bad'}'>{'held' if c['held'] else 'FAILED'}</td>"
                   f"<td>{_esc(c['check'])}</td><td>{_esc(c['observed'])}</td></tr>" for c in checks)
    return head + ("<table><tr><th></th><th>check</th><th>observed</th></tr>" + rows + "</table>" if rows else "")


def _summary(summary: dict[str, Any]) -> str:
    rows = []
    for k, v in summary.items():
        if isinstance(v, dict | list):
            continue
        cls = ("ok" if v else "bad") if k == "ok" else ""
        rows.append(f"<tr><th>{_esc(k)}</th><td class='{cls}'>{_esc(v)}</td></tr>")
    return "<table>" + "".join(rows) + "</table>"


def _series_svg(points: list[tuple[float, float]], title: str, unit: str, w: int = 900, h: int = 160) -> str:
    if not points:
        return f"<p>{_esc(title)}: no data</p>"
    x0, x1 = points[0][0], max(points[-1][0], points[0][0] + 1)
    ymax = max(p[1] for p in points) or 1
    coords = " ".join(f"{40 + (x - x0) / (x1 - x0) * (w - 50):.1f},{h - 20 - y / ymax * (h - 30):.1f}"
                      for x, y in points)
    return (f"<svg width='{w}' height='{h}'><polyline fill='none' stroke='#36c' stroke-width='1.5' points='{coords}'/>"
            f"<text x='2' y='12'>{_esc(title)} (max {ymax:.0f} {unit})</text>"
            f"<text x='40' y='{h - 4}'>0 s</text><text x='{w - 60}' y='{h - 4}'>{x1 - x0:.0f} s</text></svg>")


def _fleet_svg(timeline: list[dict[str, Any]], w: int = 900) -> str:
    """One lane per process or component (the stack's and services' first), one mark per event; hover for
    its time and detail."""
    lanes: list[str] = []
    for e in timeline:
        if e["kind"] != "recovery" and e["who"] not in lanes:
            lanes.append(e["who"])
    lanes.sort(key=lambda lane: (not lane.startswith(_INFRA), lane))
    lanes.append("recovered runs")
    t_max = max([e["t_s"] for e in timeline] + [1])
    h = 14 * len(lanes) + 20
    parts = [f"<svg width='{w}' height='{h}'>"]
    for i, lane in enumerate(lanes):
        parts.append(f"<text x='0' y='{14 * i + 12}'>{_esc(lane)}</text>")
    for e in timeline:
        lane = "recovered runs" if e["kind"] == "recovery" else e["who"]
        x = 110 + e["t_s"] / t_max * (w - 120)
        y = 14 * lanes.index(lane) + 3
        title = _esc(f"{e['t_s']} s {e['kind']} {e['who']} {e.get('detail', '')}")
        parts.append(f"<rect x='{x:.1f}' y='{y}' width='4' height='10' fill='{_COLORS.get(e['kind'], '#999')}'>"
                     f"<title>{title}</title></rect>")
    parts.append("</svg>")
    return "".join(parts)


def _faults(summary: dict[str, Any]) -> str:
    """The fault schedule, what was injected by kind, and every fault event with its time."""
    injected = summary.get("faults_injected", {})
    wanted = summary.get("faults_requested", {})
    counts = "".join(f"<tr><td>{_esc(k)}</td><td>{injected.get(k, 0)}</td><td>{wanted.get(k, '')}</td></tr>"
                     for k in sorted(set(injected) | set(wanted)))
    events = [e for e in summary.get("timeline", []) if e["kind"].startswith("fault") or "fault" in e.get("detail", "")
              or (e["who"].startswith(_INFRA) and e["kind"] in ("kill", "stop", "cont", "spawn", "exit"))]
    rows = "".join(f"<tr><td>{e['t_s']:.1f} s</td><td>{_esc(e['kind'])}</td><td>{_esc(e['who'])}</td>"
                   f"<td>{_esc(e.get('detail', ''))}</td></tr>" for e in events)
    plan = ", ".join(f"{s['kind']}@{s['at']:.0%}" for s in summary.get("fault_schedule", []))
    return (f"<p>seeded schedule (fraction of runs completed): {_esc(plan) or 'none'}</p>"
            "<table><tr><th>kind</th><th>injected</th><th>requested at least</th></tr>" + counts + "</table>"
            "<table><tr><th>time</th><th>event</th><th>who</th><th>detail</th></tr>" + rows + "</table>")


def _controls(summary: dict[str, Any]) -> str:
    """The operator actions of the ``controls`` faults (pause, cancel, resume, fork): what was done to which run,
    the Operator's outcome, and each rule checked with what was observed (green held, red not)."""
    actions = summary.get("controls", [])
    if not actions:
        return "<p>no operator action (the controls fault was not requested)</p>"
    rows = []
    for a in actions:
        target = a["run_id"] + (f" → {a['fork_run_id']} at seq {a['at_seq']}" if a.get("fork_run_id") else "")
        extra = (f"<br><small>dry run: {_esc(a.get('dry_run'))}; may_repeat {len(a.get('may_repeat', []))}</small>"
                 if a["action"] == "fork" else "")
        checks = "".join(f"<div class='{'ok' if c['held'] else 'bad'}'>{'held' if c['held'] else 'FAILED'}: "
                         f"<span style='font-weight:normal'>{_esc(c['check'])} — {_esc(c['observed'])}</span></div>"
                         for c in a.get("checks", []))
        rows.append(f"<tr><td>{a['t_s']:.1f} s</td><td>{_esc(a['action'])}</td><td>{_esc(target)}{extra}</td>"
                    f"<td>{_esc(a['outcome'])}<br><small>{_esc(a.get('detail', ''))}</small></td>"
                    f"<td>{_esc(a.get('owner') or '—')}</td><td>{checks}</td></tr>")
    return ("<table><tr><th>time</th><th>action</th><th>run</th><th>outcome</th><th>owner / handed to</th>"
            "<th>rules checked</th></tr>" + "".join(rows) + "</table>")


def _runs(per_run: dict[str, Any], limit: int = 400) -> str:
    """One row per run: its status in its own colour (a FAILED run that the input says fails is not an error) and
    whether it ended as its input says with a projection equal to the topic's fold (the check, green or red)."""
    rows = []
    for run_id, info in list(sorted(per_run.items()))[:limit]:
        chips = "".join(f"<span class='chip {c['class'].split()[0]}' title='{_esc(c['call_id'])} epochs {c['epochs']}'>"
                        f"{_esc(c['tool'])}: {_esc(c['class'])}</span>" for c in info.get("calls", []))
        held = info["outcome_matches"] and info["projection_matches"]
        check = "as recorded" if held else ("outcome differs from the input" if not info["outcome_matches"]
                                             else "projection differs from the topic")
        if held and info.get("expected"):
            check = f"as expected: {info['expected']}"
        if info.get("fork_of"):
            check += f" (fork of {info['fork_of']})"
        if info.get("archived"):
            check += " (read from the archive)"
        rows.append(f"<tr><td>{_esc(run_id)}</td><td class='status-{_esc(info['status'])}'>{_esc(info['status'])}"
                    f"</td><td class='{'ok' if held else 'bad'}'>{check}</td><td>{info['epoch']}</td>"
                    f"<td>{info['events']}</td><td>{chips}</td></tr>")
    return ("<table><tr><th>run</th><th>status</th><th>check</th><th>epoch</th><th>events</th>"
            "<th>tool calls (class)</th></tr>" + "".join(rows) + "</table>")


def _recoveries(passes: list[dict[str, Any]], limit: int = 200) -> str:
    """One row per run a recovery pass decided: when, what it did (resumed, finished, parked, deferred …), the
    epochs, the new owner, the calls by class, the instances the pass fenced."""
    rows = []
    for i, p in enumerate(passes[:limit], 1):
        fenced = ", ".join(p.get("fenced", [])) or "—"
        for r in p.get("runs", []):
            calls = ", ".join(f"{k} {v}" for k, v in sorted((r.get("calls") or {}).items())) or "—"
            epochs = f"{r.get('previous_epoch')} → {r.get('epoch')}" if r.get("epoch") else "—"
            rows.append(f"<tr><td>{i}</td><td>{p.get('t_s', '')} s</td><td>{_esc(r['run_id'])}</td>"
                        f"<td>{_esc(r.get('action'))}</td><td>{_esc(epochs)}</td>"
                        f"<td>{_esc(r.get('assigned_to') or '—')}</td><td>{_esc(calls)}</td><td>{_esc(fenced)}</td>"
                        f"<td><small>{_esc(r.get('detail') or '')}</small></td></tr>")
    if not rows:
        return "<p>no pass decided anything</p>"
    more = f"<p>… and {len(passes) - limit} more passes</p>" if len(passes) > limit else ""
    return ("<table><tr><th>pass</th><th>time</th><th>run</th><th>action</th><th>epoch</th><th>assigned to</th>"
            "<th>calls</th><th>fenced</th><th>detail</th></tr>" + "".join(rows) + "</table>" + more)


def _context(ctx: dict[str, Any] | None) -> str:
    """One run's last turn context, as the agent built it: execution facts first, then advice with its label."""
    if not ctx:
        return "<p>no context was built (agents ran without the ContextManager)</p>"
    f = ctx["facts"]
    calls = "".join(f"<tr><td>{_esc(c['call_id'])}</td><td>{_esc(c['tool'])}</td><td>{_esc(c['status'])}</td>"
                    f"<td>{_esc(c['effect_committed'])}</td><td>{c['attempts']}</td></tr>" for c in f["calls"])
    parts = [f"<p>run <b>{_esc(ctx['run_id'])}</b> · query “{_esc(ctx['query'][:300])}”</p>",
             f"<h3>Execution facts ({_esc(f['authority'])}: StateStore / ExecutionRecordStore, as of "
             f"{_esc(f['as_of'])})</h3><p>status {_esc(f['status'])} · epoch {_esc(f['epoch'])} · tenant "
             f"{_esc(f['tenant_id'])} · user {_esc(f['user_id'])}</p>"
             "<table><tr><th>call</th><th>tool</th><th>status</th><th>effect committed</th><th>attempts</th></tr>"
             + calls + "</table>"]
    for source in ("memory", "knowledge"):
        items = ctx[source]
        rows = "".join(
            f"<tr><td>{a['score']}</td><td>{_esc(a['text'][:300])}</td><td><small>{_esc(a['label'])}"
            f"{'<br>conflicts: ' + _esc('; '.join(a['conflicts_with'])) if a['conflicts_with'] else ''}</small></td>"
            f"<td><small>{_esc(json.dumps(a['provenance'], default=str)[:400])}</small></td></tr>" for a in items)
        parts.append(f"<h3>{source.capitalize()} (advisory) — {len(items)} item(s)</h3>"
                     + ("<table><tr><th>score</th><th>text</th><th>label</th><th>provenance</th></tr>" + rows
                        + "</table>" if items else "<p>none</p>"))
    if ctx.get("notes"):
        parts.append("<p>notes: " + _esc("; ".join(ctx["notes"])) + "</p>")
    return "".join(parts)


def write_report(path: Path, summary: dict[str, Any]) -> None:
    """Write the demo report to ``path`` (HTML, self-contained)."""
    series = summary.get("series", {})
    eps = series.get("events_per_s", [])
    lag = series.get("lag_ms", [])
    t0 = eps[0][0] if eps else 0
    lag_pts = [((t / 1000.0), v) for t, v in lag]
    body = [
        f"<h1>runjournal demo · {_esc(summary.get('topic_prefix'))}</h1>",
        _verdict(summary),
        "<h2>Summary</h2>", _summary(summary),
        "<h2>Fleet timeline</h2><p>green: spawn · red: SIGKILL · orange: SIGSTOP · teal: SIGCONT · "
        "dark orange: fault injected · dark green: fault over · grey: exit · blue: recovery of a run</p>",
        _fleet_svg(summary.get("timeline", [])),
        "<h2>Faults</h2>", _faults(summary),
        "<h2>Operator controls</h2><p>pause, cancel, resume and fork through the Operator while the fleet runs "
        "(the controls fault), each checked against its rule from the topic and the provider's ledger</p>",
        _controls(summary),
        "<h2>Throughput and projector lag</h2>",
        _series_svg([(float(t - t0), float(n)) for t, n in eps], "events/s (by occurred_at)", "events/s"),
        _series_svg(lag_pts, "projector lag per poll", "ms"),
        "<h2>Runs</h2><p>committed · <span class='chip reconciled'>reconciled</span> after a crash through the "
        "provider · <span class='chip re-run'>re-run safely</span> (not executed before the crash)</p>",
        _runs(summary.get("per_run", {})),
        "<h2>One run's context</h2><p>What the ContextManager gave the agent for the run's last turn: facts "
        "from the journal first; memory and knowledge after, each labelled advisory with its provenance.</p>",
        _context(summary.get("context_example")),
        "<h2>Recovery passes</h2>", _recoveries(summary.get("recoveries", [])),
    ]
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>runjournal demo</title>"
                    f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>")

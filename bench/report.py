"""Print the bench's rows: a rich table (ours and anchor side by side) or one JSON object."""

from __future__ import annotations

import json
import math
from typing import Any

from rich.console import Console
from rich.table import Table

from bench._model import Row, Summary

__all__ = ["as_json", "print_table"]


def _num(v: float) -> str:
    if math.isnan(v):
        return "n/a"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _side(label: str, s: Summary | None) -> str:
    if s is None:
        return label
    return f"{label}\n[bold]{_num(s.value)}[/] [dim]({_num(s.low)}–{_num(s.high)})[/]"


def _ratio(row: Row) -> str:
    if row.ratio is None:
        return "—"
    text = f"[bold]{row.ratio:.2f}[/]"
    if row.ratio_rounds:
        text += f"\n[dim]({min(row.ratio_rounds):.2f}–{max(row.ratio_rounds):.2f})[/]"
    return text


def _met(row: Row) -> str:
    if row.goal is None:
        return ""
    mark = {True: "[green]met[/]", False: "[red]not met[/]", None: "?"}[row.met]
    return f"{row.goal}\n{mark}"


def print_table(rows: list[Row], header: dict[str, Any], console: Console | None = None) -> None:
    """Print ``rows`` as one table: median (min–max over rounds) of each side, ratio, goal."""
    console = console or Console(width=max(150, Console().width))
    table = Table(title="runjournal bench — every figure next to its anchor, same run, same broker and Redis",
                  show_lines=True)
    for col in ("pair", "metric", "ours: median (min–max)", "anchor: median (min–max)", "ratio", "goal"):
        table.add_column(col)
    for row in rows:
        table.add_row(row.pair, row.metric, _side(row.side, row.ours), _side(row.anchor_side, row.anchor),
                      _ratio(row), _met(row))
    console.print(table)
    for row in rows:
        if row.note:
            console.print(f"[dim]{row.pair} · {row.metric} · {row.side}: {row.note}[/]")
    console.print(" · ".join(f"{k}: {v}" for k, v in header.items()))


def as_json(rows: list[Row], header: dict[str, Any]) -> str:
    """One JSON object: the header fields plus ``rows`` (each with ``ratio`` and its per-round range)."""
    goals = [r for r in rows if r.goal is not None]
    return json.dumps({**header, "goals_met": sum(1 for r in goals if r.met), "goals": len(goals),
                       "rows": [r.as_dict() for r in rows]}, default=str)

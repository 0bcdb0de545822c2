"""Human output for people (issue 35 case 6): 80-column tables cut what must be copied — topic names, run ids, ACL
patterns, ``no_live_i…``. Every CLI table is a ``runjournal.cli._tables.folding_table``: a cell that does not fit
folds onto the next line, whole, never cut with an ellipsis."""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.console import Console

import runjournal.cli
from runjournal.cli._tables import folding_table

LONG = "demo-20261202-165501-3.events-with-a-long-suffix/run:0042"


def _render(width: int) -> str:
    table = folding_table("run", "action", "detail", title="recovery")
    table.add_column("late column")
    table.add_row(LONG, "no_live_instance", "the journal shows no live instance to hand it to", LONG)
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(table)
    return out.getvalue()


def test_a_long_id_folds_whole_instead_of_being_cut() -> None:
    for width in (40, 60, 80):
        text = _render(width)
        assert "…" not in text, text
        rows = [line.split("│")[1:-1] for line in text.splitlines() if line.startswith("│")]
        columns = ["".join(cell.strip() for cell in column) for column in zip(*rows, strict=True)]
        assert columns[0] == LONG == columns[3] and columns[1] == "no_live_instance", (width, text)


def test_no_cli_module_builds_a_cutting_table() -> None:
    """Every table of every command goes through ``folding_table`` (a new command's table too)."""
    cli = Path(runjournal.cli.__file__).parent
    offenders = [p.name for p in cli.glob("*.py") if p.name != "_tables.py" and re.search(r"(?<![\w.])Table\(",
                                                                                          p.read_text())]
    assert offenders == []

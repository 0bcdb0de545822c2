"""Pair 9 — startup of the command line: how long ``runjournal --help`` takes, in a fresh process each time.

* **Ours**: ``runjournal --help`` (the venv's console script, as a user runs it), wall time from spawn to exit,
  output discarded; and ``runjournal inspect --help`` (a command's help: the root's options are processed too).
* **Anchor**: ``python -c "import typer"`` with the same interpreter — what any typer command line pays; and
  ``python -c "import typer, typer.rich_utils, runjournal"`` — the floor of this one (typer's rich help and the
  ``runjournal`` package), so the ratio to it is what the command modules, typer's command tree and the help's
  rendering add.

One round runs each side once, in that order; the headline is the median over the rounds (after one warm-up
round, discarded: a cold page cache). Goal: ``runjournal --help`` ≤ 300 ms (absolute). Needs no stack: the
runner opens none when only stack-free pairs are selected.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from bench._model import Row, goal_met, paired_ratios, summarise
from bench._rounds import Side, interleave

__all__ = ["run_startup"]

PAIR = "9 startup"
GOAL_MS = "≤ 300"


def _runjournal() -> str:
    """The ``runjournal`` console script next to this interpreter (the venv's), else the one on ``PATH``."""
    script = Path(sys.executable).with_name("runjournal")
    return str(script) if script.exists() else "runjournal"


def _wall_ms(argv: list[str]) -> float:
    """Wall time of one run of ``argv``, spawn to exit, in ms.

    Raises:
        RuntimeError: the command exited non-zero (its stderr tail in the message).
    """
    started = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)  # noqa: S603
    elapsed = (time.perf_counter() - started) * 1000
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode()[-2000:]}")
    return elapsed


def run_startup(runs: int) -> list[Row]:
    """Run pair 9: ``runs`` measured rounds of each side (see the module docstring); returns its rows."""
    rj = _runjournal()
    floor = "import typer, typer.rich_utils, runjournal"
    res = interleave(PAIR, [Side("runjournal --help", lambda: _wall_ms([rj, "--help"])),
                            Side("runjournal inspect --help", lambda: _wall_ms([rj, "inspect", "--help"])),
                            Side("import typer", lambda: _wall_ms([sys.executable, "-c", "import typer"])),
                            Side("floor", lambda: _wall_ms([sys.executable, "-c", floor]))],
                     rounds=runs)

    def row(label: str, anchor: str, anchor_label: str, *, note: str, goal: str | None = None) -> Row:
        ours = summarise(res[label])
        return Row(PAIR, "wall ms, fresh process", label, ours, anchor_label, summarise(res[anchor]), goal=goal,
                   met=goal_met(ours.value, goal) if goal else None, note=note,
                   ratio_rounds=paired_ratios(res[label], res[anchor]))

    return [row("runjournal --help", "import typer", 'python -c "import typer"', goal=GOAL_MS,
                note=f"median of {runs} runs, sides interleaved; goal on ours (absolute)"),
            row("runjournal --help", "floor", f'python -c "{floor}"',
                note="what the command modules, typer's command tree and the help's rendering add"),
            row("runjournal inspect --help", "import typer", 'python -c "import typer"',
                note="a command's help: typer also processes the root's options, which imports pydantic "
                     "(typer._adapters) — typer's own cost, not the command's")]

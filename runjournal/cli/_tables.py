"""Tables for people: a cell that does not fit wraps (a long id folds onto the next line) instead of being cut with
an ellipsis — a run id, topic name or ACL pattern in a table is always there whole (issue 35)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

__all__ = ["folding_table"]


def folding_table(*headers: str, **options: Any) -> Table:
    """A ``rich.table.Table`` whose every column folds what does not fit (``overflow="fold"``), never cuts it;
    ``options`` as ``Table``'s (``title``, ``show_lines`` …). Columns added later with ``add_column`` fold too."""
    out = Table(**options)
    for header in headers:
        out.add_column(header, overflow="fold")
    _add_column = out.add_column

    def add_column(*args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("overflow", "fold")
        _add_column(*args, **kwargs)

    out.add_column = add_column  # type: ignore[method-assign]
    return out

"""Tool results as the journal records them: canonical JSON that round-trips, or a named refusal.

DESIGN.md "Decisions after the first build", after the effect: the value the live caller receives is
the value a resumed run receives from the journal. So a result is recorded as canonical JSON
(sorted keys, no whitespace, UTF-8) and the caller is given ``json.loads`` of exactly that text —
a tuple comes back as a list, a dict in key order — never the tool's own object.

A value is *recordable* when that text exists and reads back equal to it: ``None``, ``bool``,
``int``, finite ``float``, ``str`` that is valid Unicode, and ``list`` / ``tuple`` / ``dict`` with
``str`` keys of those. Anything else — a non-string key (``json.dumps`` would silently turn ``1``
into ``"1"``), NaN or infinity (not JSON), a lone surrogate (not UTF-8), a ``datetime``, ``set``,
``bytes``, ``Decimal`` or other object — is not, and :func:`record_value` says where.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["RecordedValue", "record_value"]

_MAX_DEPTH = 500


@dataclass(frozen=True, slots=True)
class RecordedValue:
    """A tool result made ready for the journal."""

    text: str | None
    """Canonical JSON text, or None when the value cannot be recorded faithfully."""
    value: Any
    """``json.loads(text)``: what the live caller (and every resumed run) receives; None when unrecordable."""
    problem: str | None
    """Why the value cannot be recorded (``result['a'][2]: …``), or None."""


def record_value(value: Any) -> RecordedValue:
    """Canonical JSON of ``value`` and the value read back from it, or why it cannot be recorded (no I/O)."""
    problem = _first_problem(value)
    if problem is not None:
        return RecordedValue(None, None, problem)
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return RecordedValue(text, json.loads(text), None)


def _first_problem(value: Any) -> str | None:
    """The first place (``result…``) where ``value`` is not recordable, or None. Iterative: no recursion limit."""
    stack: list[tuple[Any, str, int]] = [(value, "result", 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > _MAX_DEPTH:
            return f"{path}: nested deeper than {_MAX_DEPTH} levels"
        if item is None or isinstance(item, bool | int):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return f"{path}: {item!r} is not a JSON number"
        elif isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError as exc:
                    return f"{path}: text with a lone surrogate at index {exc.start} is not valid Unicode"
        elif isinstance(item, list | tuple):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(item))
        elif isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str):
                    return f"{path}: key {k!r} ({type(k).__name__}) is not a string; JSON would change it"
                stack.append((k, f"{path} key", depth + 1))
                stack.append((v, f"{path}[{k!r}]", depth + 1))
        else:
            return f"{path}: a {type(item).__name__} has no exact JSON form"
    return None

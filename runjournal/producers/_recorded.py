"""Tool results as the journal records them: canonical JSON that round-trips, or a named refusal.

docs/design/protocol.md "Decisions after the first build", after the effect: the value the live caller receives is
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

__all__ = ["RecordedValue", "first_problem", "record_value"]

_MAX_DEPTH = 500
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1


def _short(n: int) -> str:
    """``n`` in a message: its digits when few, else its size (writing a huge int may itself be refused)."""
    return str(n) if n.bit_length() < 1000 else f"of {n.bit_length()} bits"


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
    problem = first_problem(value)
    if problem is not None:
        return RecordedValue(None, None, problem)
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return RecordedValue(text, json.loads(text), None)


def first_problem(value: Any, root: str = "result", *, int64: bool = False) -> str | None:
    """The first place (``result…``, or ``root…``) where ``value`` has no exact canonical JSON form, or None.

    Iterative: no recursion limit. With ``int64``, an integer outside ``-2**63 … 2**64-1`` is a problem too: beyond
    64 bits other JSON readers (orjson in the consumers, Java, JavaScript) read it as a float, and Python writes it
    only up to ``sys.get_int_max_str_digits()`` digits, a per-process setting — so its text, and a digest of it,
    would not be the same everywhere (the arguments and inputs that enter a digest: ``runjournal.producers._digest``).
    """
    stack: list[tuple[Any, str, int]] = [(value, root, 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > _MAX_DEPTH:
            return f"{path}: nested deeper than {_MAX_DEPTH} levels"
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, int):
            if int64 and not _INT64_MIN <= item <= _UINT64_MAX:
                return f"{path}: the integer {_short(item)} is outside -2**63 … 2**64-1 (JSON readers differ on it)"
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

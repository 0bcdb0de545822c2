"""Canonical JSON, digests and the idempotency key (pure functions, no I/O).

What enters a digest or a key is canonical by construction or refused before anything is published: ids by
``runjournal.core.ids`` (:class:`~runjournal.core.ids.InvalidIdError`), the values of a call's arguments and a run's
input by :func:`canonical_value` (:class:`~runjournal.producers.errors.NonCanonicalValueError`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from runjournal.core.ids import NODE_NAME, NODE_PATH, RUN_ID
from runjournal.producers._recorded import first_problem
from runjournal.producers.errors import NonCanonicalValueError

__all__ = ["canonical_json", "canonical_value", "digest", "idempotency_key", "key_preimage"]

#: Length of an idempotency key, hex characters (128 bits of sha256).
KEY_HEX_CHARS = 32


def canonical_json(value: Any) -> str:
    """``value`` as canonical JSON text: sorted keys, no whitespace, UTF-8 kept (not ``\\u`` escaped).

    A value JSON cannot represent (a datetime, a set, an object) is written as its ``repr`` string,
    so the fact that a tool returned *something* is never lost; a resumed run reads back that JSON.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr)


def canonical_value(value: Any, what: str) -> str:
    """``value`` as canonical JSON text when it has exactly one (the call arguments behind ``args_digest``, a run's
    input): the text :func:`canonical_json` writes, byte for byte, so digests of valid values are unchanged.

    Canonical by construction: ``None``, ``bool``, ``int`` in ``-2**63 … 2**64-1``, finite ``float`` (Python's
    shortest round-trip form, the same in every process), ``str`` of valid Unicode, and ``list`` / ``tuple`` /
    ``dict`` with ``str`` keys of those — a tuple is a JSON array, so ``(1, 2)`` and ``[1, 2]`` are the same
    arguments, as a tool's result reads back (``runjournal.producers._recorded``). Everything else would be written
    as something it is not — a ``set`` or an object as its ``repr`` (which varies by process: hash order, addresses,
    and equals the text of a string), a non-string key as a string, NaN as a non-JSON token, ``bytes`` or a
    ``Decimal`` not at all — so a resumed run's digest could differ from the live one, or two different values share
    one, and it is refused.

    Args:
        value: the value.
        what: what it is, for the message (``args``, ``input``): the place is named ``args['when'][2]``.

    Raises:
        NonCanonicalValueError: the first place that has no exact JSON form; nothing was published.
    """
    problem = first_problem(value, what, int64=True)
    if problem is not None:
        raise NonCanonicalValueError(
            f"{what} cannot be recorded canonically ({problem}); pass JSON values: str keys, finite floats, "
            "64-bit integers, valid text — convert sets to sorted lists, datetimes and Decimals to strings "
            "(docs/reference/identifiers.md)", what=what, problem=problem)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(text: str) -> str:
    """``sha256`` hex (64 chars) of ``text`` encoded UTF-8."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def enter_node(entries: dict[str, dict[str, int]], parent: str, name: str) -> str:
    """The path of the next node ``name`` entered under ``parent`` (``""`` at the top), counting entries.

    The rule behind every idempotency key, shared by ``RunHandle`` and replay so both derive the
    same paths: ``outer/inner``; the k-th entry (k >= 2) of one name under one parent is ``name#k``.
    ``entries`` (parent -> name -> count) is updated in place.

    Raises:
        InvalidIdError: ``name`` breaks the node-name rules (``runjournal.core.ids.NODE_NAME``: empty, ``/`` or
            ``#`` — they build paths —, a control character, over 128 bytes), or the path would pass the node-path
            limit (2048 bytes). Nothing is counted then.
    """
    NODE_NAME.check(name)
    counts = entries.get(parent, {})
    n = counts.get(name, 0) + 1
    segment = name if n == 1 else f"{name}#{n}"
    path = NODE_PATH.check(f"{parent}/{segment}" if parent else segment)
    entries.setdefault(parent, {})[name] = n
    return path


def key_preimage(run_id: str, node_path: str, call_index: int) -> bytes:
    """The bytes :func:`idempotency_key` hashes: ``runjournal.call.v1 US run_id US node_path US call_index`` in UTF-8,
    US = U+001F — unchanged since the first build, so a run in flight across an upgrade keeps its keys.

    **Injective** on what it accepts (docs/design/protocol.md § Identifiers and keys): ``run_id`` and ``node_path``
    hold no U+001F (the control-character rule of ``runjournal.core.ids``), the constant head holds none and the
    decimal form of an int holds none, so the text has exactly three U+001F and splitting at them gives back the
    four parts; ``str(call_index)`` of an int >= 1 is canonical (no sign, no leading zero), so it gives back the
    index; and UTF-8 is injective on valid text (no lone surrogate: the lone-surrogate rule). Distinct accepted
    inputs therefore give distinct preimages, and two keys collide only if sha256 truncated to 128 bits does.

    Before the rules, a U+001F inside a part made two splits one text: run ``k␟n`` at node ``x`` and run ``k`` at
    node ``n␟x`` shared a key (issue 28).

    Raises:
        InvalidIdError: ``run_id`` or ``node_path`` breaks its rules (``RUN_ID``, ``NODE_PATH``).
        ValueError: ``call_index`` is not an int >= 1 (a bool is not an index).
    """
    RUN_ID.check(run_id)
    NODE_PATH.check(node_path)
    if not isinstance(call_index, int) or isinstance(call_index, bool) or call_index < 1:
        raise ValueError(f"call_index is an int >= 1 (1-based), got {call_index!r}")
    return f"runjournal.call.v1\x1f{run_id}\x1f{node_path}\x1f{int(call_index)}".encode()


def idempotency_key(run_id: str, node_path: str, call_index: int) -> str:
    """The idempotency key of the ``call_index``-th call (1-based) at ``node_path`` of ``run_id``.

    docs/design/protocol.md § The side-effect protocol, step 1: derived only from (run_id, node path, call
    index), so every resume that reaches the same step derives the same key. Returns the first
    32 hex chars of sha256 over :func:`key_preimage` — the three parts joined by a unit separator (U+001F), which
    no accepted id holds, so no two accepted inputs share a preimage (the argument is on :func:`key_preimage`).

    Raises:
        InvalidIdError: an id breaks its rules (nothing was derived, nothing published).
        ValueError: ``call_index`` < 1.
    """
    return hashlib.sha256(key_preimage(run_id, node_path, call_index)).hexdigest()[:KEY_HEX_CHARS]

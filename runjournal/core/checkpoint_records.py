"""The record key format of ``{prefix}.checkpoints`` (``Settings.checkpoints_topic``), shared by its writer and erase.

The framework adapters (``runjournal.adapters._checkpoints``) write every LangGraph checkpoint, channel blob,
pending write and Agents SDK session item as a record keyed ``<thread_id><SEP><kind><SEP><field>`` on the thread's
partition (murmur2(thread_id) mod the events topic's partition count: a thread is a run, ``run_id = thread_id``).
``runjournal erase`` (``runjournal.consumers.ops.erase``) tombstones a run's records by the same key format; it lives
here, below both, because consumers may not import the adapters (import-linter layers).

**Unambiguous by validation** (docs/design/protocol.md § Identifiers and keys): ``SEP`` is U+001F, a control
character, and no part holds one — the thread id is checked by ``runjournal.core.ids.THREAD_ID`` and every part of
a field by ``KEY_PART`` (:func:`join_field`) before a record is written; kinds are the constants :data:`KINDS`.
So a key splits at its first ``SEP`` into exactly the thread and the rest, and a field at every ``SEP`` into the
parts it was joined from — the format is the one written before the rules, so existing records keep their keys.
Records written before the rules by a thread whose id held U+001F are recognised by :func:`of_thread` (the part
after the thread must be a kind), not by the key's prefix alone.
"""

from __future__ import annotations

from runjournal.core.ids import KEY_PART, THREAD_ID

__all__ = ["KINDS", "PART", "SEP", "join_field", "of_thread", "part_field", "record_key", "split_part_field",
           "thread_key_prefix"]

SEP = "\x1f"
"""Separator of a record key's parts and of a field's parts (ASCII unit separator: never in an id)."""
KINDS = ("cp", "blob", "w", "item", "state", "part")
"""Record kinds: a checkpoint, a channel blob, a pending write, a session item, a paused ``RunState``, and a part
of a record too large for one Kafka record (:func:`part_field`; its projection in Redis: the record's part count)."""
PART = "part"
"""The kind of a large record's parts (``runjournal.adapters._checkpoints``, *Large records*)."""
_KIND_BYTES = frozenset(k.encode() for k in KINDS)


def record_key(thread_id: str, kind: str, field: str) -> str:
    """``<thread_id><SEP><kind><SEP><field>`` — the Kafka record key of one projected entry.

    Raises:
        InvalidIdError: ``thread_id`` breaks ``THREAD_ID`` (a U+001F in it would make the key ambiguous).
        ValueError: ``kind`` is not one of :data:`KINDS`.
    """
    if kind not in KINDS:
        raise ValueError(f"record kind must be one of {KINDS}, got {kind!r}")
    return f"{THREAD_ID.check(thread_id)}{SEP}{kind}{SEP}{field}"


def part_field(index: int, kind: str, field: str) -> str:
    """The field of part ``index`` of the record ``(kind, field)``: ``<index><SEP><kind><SEP><field>`` —
    unambiguous: the index and the kind hold no ``SEP``, the rest is the record's field whole."""
    return f"{index}{SEP}{kind}{SEP}{field}"


def split_part_field(field: str) -> tuple[int, str, str]:
    """``(index, kind, field)`` of a :func:`part_field`. Raises ValueError when ``field`` is not one."""
    index, sep1, rest = field.partition(SEP)
    kind, sep2, whole = rest.partition(SEP)
    if not (sep1 and sep2 and index.isdigit() and kind in KINDS and kind != PART):
        raise ValueError(f"not a record part's field: {field!r}")
    return int(index), kind, whole


def join_field(*parts: str) -> str:
    """A record's field from its parts (``ns``, checkpoint id, channel, version, task id, index), ``SEP``-joined.

    Raises:
        InvalidIdError: a part breaks ``KEY_PART`` (a control character — U+001F would split it —, a lone
            surrogate, over 1024 bytes). An empty part is allowed (the root checkpoint namespace is ``""``).
    """
    for part in parts:
        if part != "":
            KEY_PART.check(part)
    return SEP.join(parts)


def thread_key_prefix(thread_id: str) -> bytes:
    """``<thread_id><SEP>`` as bytes: every record key of ``thread_id`` starts with it. A key of a thread whose id
    starts with ``<thread_id><SEP>`` (possible only for records written before the id rules) starts with it too:
    use :func:`of_thread` to decide."""
    return f"{thread_id}{SEP}".encode()


def of_thread(key: bytes | None, thread_id: str) -> bool:
    """True when the record key ``key`` is one of ``thread_id``'s: it starts with ``<thread_id><SEP>`` and a kind of
    :data:`KINDS` follows, then ``SEP``. Erase and rebuild use it, so a thread ``a`` never takes a record of a thread
    ``a<SEP>x`` written before the rules (unless ``x`` is itself a kind)."""
    if key is None:
        return False
    head = thread_key_prefix(thread_id)
    if not key.startswith(head):
        return False
    kind, sep, _ = key[len(head):].partition(SEP.encode())
    return bool(sep) and kind in _KIND_BYTES

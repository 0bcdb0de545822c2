"""The current envelope's Avro binary, written directly by code generated once per event type.

Private: :class:`~runjournal.schemas.codec.EventCodec` tries it before its checked path (the record dict,
:class:`~runjournal.schemas._validate.RecordValidator`, fastavro's ``schemaless_writer``). For the envelope that
path costs ~35 µs per event here, most of it in walking the schema per value (an 18-branch payload union among
it); everything it decides is fixed by the schema and the event type, so :meth:`DirectWriter.compile` decides it
once: for every type symbol it generates straight-line Python (``exec`` of source built from the parsed schema,
kept in :attr:`DirectWriter.source`) that reads the event's fields and writes their Avro binary (Avro specification
1.11, § Binary Encoding) — a fast function taking string lengths and non-negative ints below 4096 straight from a
table of their varints, and a general one it hands the event to on anything else (negative or larger ints, longer
strings), which tests ranges and computes varints:

| Avro | written as | accepted only when |
|---|---|---|
| int / long | zig-zag varint | exactly ``int`` (not ``bool``), inside [-2**31, 2**31-1] / [-2**63, 2**63-1] |
| string | varint byte length + UTF-8 | exactly ``str`` that encodes as UTF-8 (no lone surrogates) |
| boolean | one byte 00 / 01 | ``True`` or ``False`` |
| timestamp-millis | the long: floor of ms since the Unix epoch | exactly ``datetime``, ``tzinfo`` ``datetime.UTC`` |
| array of string | block count, the strings, 0 (an empty array: 0) | exactly ``list`` of exactly ``str`` |
| ``["null", T]`` | branch index, then T | ``None``, or what T accepts |
| the ``type`` enum, the payload union | the symbol's index, the branch index | (constants of the type) |

The payload must be exactly a ``dict`` whose keys are fields of the type, and a field the contract
(``PAYLOAD_FIELDS``) requires must not be None. Whatever is not accepted — a ``str`` subclass, an aware datetime
in another zone, a value out of range, an unknown key — makes the writer return None, and the codec takes its
checked path, which raises exactly as it always did (``InvalidEventError`` naming the field,
``NaiveDatetimeError``) or writes the same bytes. So the writer accepts a subset of what the checked path accepts,
and writes byte for byte what fastavro writes for it (``tests/schemas/test_direct.py`` holds it to that over
generated events of every type and every type at its field extremes). A schema with anything the table does not
list (a map, a float, another logical type, a named-type reference) gets no writer (:meth:`DirectWriter.compile`
returns None) and a payload record that does not match the contract gets none for its type: those are written by
the checked path only.

Pure apart from two caches: the last timestamp's bytes, and the length-prefixed UTF-8 of the envelope strings that
repeat across events (``repeated``: a run's ids; at most 2,048 texts). Thread-safe.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from runjournal.schemas.events import Event, EventType

__all__ = ["DirectWriter", "zigzag_varint"]

WriteFn = Callable[[Event, bytes], "bytes | None"]
"""A generated writer: ``(event, header) -> header + Avro body``, or None when it does not accept the event."""

_INT = (-(2**31), 2**31 - 1)
_LONG = (-(2**63), 2**63 - 1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
_SMALL_N = 4096
_PRIMITIVE = ("string", "int", "long", "boolean")
_PY_FOR = {"string": str, "int": int, "long": int, "boolean": bool, "array<string>": list}


def zigzag_varint(n: int) -> bytes:
    """Avro's encoding of an int or long ``n`` (within the long range): zig-zag, then base-128 varint."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append(z & 0x7F | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_SMALL: tuple[bytes, ...] = tuple(zigzag_varint(n) for n in range(_SMALL_N))
"""``zigzag_varint(n)`` for 0 <= n < 4096 (1-2 bytes; lengths of most strings, small ints)."""


class _Millis:
    """``occurred_at`` → the varint of its epoch milliseconds; remembers the last datetime object (the journal's
    clock hands out one object per millisecond, so most events of a busy instance share it)."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: tuple[datetime | None, bytes] = (None, b"")
        """The last datetime written and its bytes (one tuple: swapped atomically; the generated code reads it
        before calling)."""

    def __call__(self, at: datetime) -> bytes:
        ms = (at - _EPOCH) // _ONE_MS  # floor, as fastavro: (days*86400 + s)*1000 + int(µs/1000)
        out = _SMALL[ms] if 0 <= ms < _SMALL_N else zigzag_varint(ms)
        self.last = (at, out)
        return out


def _remembering(limit: int) -> dict[str, Any]:
    """``REMEMBERED`` (text -> its length-prefixed UTF-8) and ``remember(text)``, which fills it (clearing it
    when it holds ``limit`` texts). Raises UnicodeEncodeError for a lone surrogate (nothing remembered)."""
    remembered: dict[str, bytes] = {}

    def remember(text: str) -> bytes:
        data = text.encode()
        out = zigzag_varint(len(data)) + data
        if len(remembered) >= limit:
            remembered.clear()
        remembered[text] = out
        return out

    return {"REMEMBERED": remembered, "remember": remember}


def _strings(items: list[Any]) -> bytes | None:
    """An array of strings as fastavro writes it (one block, then 0); None if an item is not exactly a str."""
    if not items:
        return b"\x00"
    k = len(items)
    out = [_SMALL[k] if k < _SMALL_N else zigzag_varint(k)]
    for item in items:
        if item.__class__ is not str:
            return None
        data = item.encode()
        n = len(data)
        out.append(_SMALL[n] if n < _SMALL_N else zigzag_varint(n))
        out.append(data)
    out.append(b"\x00")
    return b"".join(out)


# -- code generation -------------------------------------------------------------------------------------
Kind = str | tuple[str, int, str]
"""``"string"`` / ``"int"`` / ``"long"`` / ``"boolean"`` / ``"timestamp-millis"`` / ``"array<string>"``, or
``("optional", index of the null branch, the other branch's kind)`` for ``["null", T]`` with a primitive T or an
array of strings (RUN_STARTED ``fork_lineage``)."""


def _kind(schema: Any) -> Kind | None:
    """The :data:`Kind` of an Avro schema, or None when it is not written directly."""
    if isinstance(schema, str):
        return schema if schema in _PRIMITIVE else None
    if isinstance(schema, list):
        if len(schema) != 2 or "null" not in schema:
            return None
        null = schema.index("null")
        inner = _kind(schema[1 - null])
        return ("optional", null, inner) if isinstance(inner, str) and (inner in _PRIMITIVE or
                                                                        inner == "array<string>") else None
    if not isinstance(schema, Mapping):
        return None
    kind, logical = schema.get("type"), schema.get("logicalType")
    if kind == "long" and logical == "timestamp-millis":
        return "timestamp-millis"
    if logical is not None:
        return None
    if kind == "array":
        return "array<string>" if _kind(schema.get("items")) == "string" else None
    return kind if isinstance(kind, str) and kind in _PRIMITIVE else None


def _value_code(kind: str, i: int, *, fast: bool) -> tuple[list[str], list[str]]:
    """Lines that check ``v`` (not None) for ``kind`` and put its bytes in piece variables: (lines, pieces).

    ``fast``: lengths and ints straight from the table, no range test: an IndexError (a value >= 4096, or out of
    its Avro range) or a negative int sends the event to the general variant, which tests and uses ``varint``.
    """
    if kind == "string*":  # repeated across events (a run's identity): its bytes are remembered
        return (["if v.__class__ is not str: return None", f"c{i} = REMEMBERED.get(v)",
                 f"if c{i} is None: c{i} = remember(v)"], [f"c{i}"])
    if kind == "string":
        length = f"SMALL[len(b{i})]" if fast else f"SMALL[n] if (n := len(b{i})) < SMALL_N else varint(n)"
        return (["if v.__class__ is not str: return None", f"b{i} = v.encode()", f"l{i} = {length}"],
                [f"l{i}", f"b{i}"])
    if kind in ("int", "long"):
        if fast:
            return (["if v.__class__ is not int or v < 0: return ANY(e, header)", f"x{i} = SMALL[v]"], [f"x{i}"])
        low, high = _INT if kind == "int" else _LONG
        return ([f"if v.__class__ is not int or v < {low} or v > {high}: return None",
                 f"x{i} = SMALL[v] if 0 <= v < SMALL_N else varint(v)"], [f"x{i}"])
    if kind == "boolean":
        return ([f"if v is True: x{i} = TRUE", f"elif v is False: x{i} = FALSE", "else: return None"], [f"x{i}"])
    if kind == "timestamp-millis":
        return (["if v.__class__ is not datetime or v.tzinfo is not UTC: return None",
                 f"x{i} = last[1] if (last := millis.last)[0] is v else millis(v)"], [f"x{i}"])
    if kind == "array<string>":
        return (["if v.__class__ is not list: return None", f"x{i} = strings(v)", f"if x{i} is None: return None"],
                [f"x{i}"])
    raise AssertionError(f"no code for {kind}")


def _field_code(kind: Kind, expr: str, i: int, *, required: bool, fast: bool) -> tuple[list[str], list[str]]:
    """Lines that read ``expr`` into ``v`` and write it (a union: its branch index first): (lines, pieces).

    ``required``: None is refused (returns None) even where Avro allows it — the contract requires the field.
    """
    if isinstance(kind, str):
        lines, pieces = _value_code(kind, i, fast=fast)
        return [f"v = {expr}", *lines], pieces
    _, null, inner = kind
    lines, pieces = _value_code(inner, i, fast=fast)
    if required:
        return [f"v = {expr}", "if v is None: return None", f"u{i} = B{1 - null}", *lines], [f"u{i}", *pieces]
    return ([f"v = {expr}", f"if v is None: u{i} = B{null}; {' = '.join(pieces)} = EMPTY", "else:",
             f"    u{i} = B{1 - null}", *(f"    {line}" for line in lines)], [f"u{i}", *pieces])


@dataclasses.dataclass(frozen=True, slots=True)
class _Envelope:
    """The envelope's fields as code: everything but ``type`` and ``payload`` read from the event."""

    lines: list[str]
    """Statements writing the fields, in schema order; pieces are interleaved by :attr:`pieces`."""
    pieces: list[str]
    """Variable names (or the markers ``TYPE`` / ``PAYLOAD``) in write order."""
    symbols: list[str]
    """The ``type`` enum's symbols, in index order."""
    branches: list[Any]
    """The payload union's branches (parsed record schemas), in index order."""


def _envelope(parsed: Mapping[str, Any], *, fast: bool, repeated: Collection[str]) -> _Envelope | None:
    """The envelope record compiled to code (``fast``: see :func:`_value_code`; ``repeated``: string fields whose
    bytes are remembered), or None when a field is not written directly."""
    attributes = {f.name for f in dataclasses.fields(Event)}
    lines: list[str] = []
    pieces: list[str] = []
    symbols: list[str] = []
    branches: list[Any] = []
    for i, field in enumerate(parsed.get("fields", ())):
        name, schema = field["name"], field["type"]
        if name == "type" and isinstance(schema, Mapping) and schema.get("type") == "enum":
            symbols = list(schema["symbols"])
            pieces.append("TYPE")
        elif name == "payload" and isinstance(schema, list) and all(isinstance(b, Mapping) for b in schema):
            branches = list(schema)
            pieces.append("PAYLOAD")
        elif name in attributes and name not in ("type", "payload") and (kind := _kind(schema)) is not None:
            if name in repeated:
                kind = "string*" if kind == "string" else ("optional", kind[1], "string*") \
                    if isinstance(kind, tuple) and kind[2] == "string" else kind
            code, names = _field_code(kind, f"e.{name}", i, required=False, fast=fast)
            lines += code
            pieces += names
        else:
            return None
    if "TYPE" not in pieces or "PAYLOAD" not in pieces:
        return None
    return _Envelope(lines, pieces, symbols, branches)


def _payload_code(record: Any, contract: Mapping[str, tuple[type, bool]], *,
                  fast: bool) -> tuple[list[str], list[str]] | None:
    """Lines writing payload ``p``'s fields in the record's order: (lines, pieces); None when the record does not
    match the contract (other field names, or a kind that does not carry the contract's Python type)."""
    if not isinstance(record, Mapping) or record.get("type") != "record":
        return None
    fields = record.get("fields", ())
    if {f["name"] for f in fields} != set(contract):
        return None
    lines: list[str] = []
    pieces: list[str] = []
    for k, field in enumerate(fields):
        py, required = contract[field["name"]]
        kind = _kind(field["type"])
        if kind is None or _PY_FOR.get(kind if isinstance(kind, str) else kind[2]) is not py:
            return None
        code, names = _field_code(kind, f"p.get({field['name']!r})", 100 + k, required=required, fast=fast)
        lines += code
        pieces += names
    return lines, pieces


def _function(symbol: str, envelope: _Envelope, payload: tuple[list[str], list[str]], *, fast: bool) -> str:
    """Source of ``write_<symbol>(e, header)`` (``fast``) or of its general variant ``write_<symbol>_any``."""
    lines, names = payload
    general = f"write_{symbol}_any"
    pieces = ["header"]
    for piece in envelope.pieces:
        pieces += [f"TYPE_{symbol}"] if piece == "TYPE" else [f"BRANCH_{symbol}", *names] if piece == "PAYLOAD" \
            else [piece]
    body = [*envelope.lines, "p = e.payload",
            f"if p.__class__ is not dict or not NAMES_{symbol}.issuperset(p): return None", *lines,
            f"return JOIN(({', '.join(pieces)}))"]
    handlers = ["except IndexError:", f"    return {general}(e, header)"] if fast else []
    handlers += ["except UnicodeEncodeError:", "    return None  # a lone surrogate: the checked path names the field"]
    return (f"def {f'write_{symbol}' if fast else general}(e, header):\n    try:\n"
            + "".join(f"        {line.replace('ANY(', f'{general}(')}\n" for line in body)
            + "".join(f"    {line}\n" for line in handlers))


def _type_source(etype: EventType, record_name: str, envelopes: tuple[_Envelope, _Envelope],
                 contract: Mapping[EventType, Mapping[str, tuple[type, bool]]], namespace: dict[str, Any]) -> str:
    """Source of ``etype``'s two writers (fast, general), its constants put in ``namespace``; "" when its payload
    record is missing or does not match the contract."""
    fast, general = envelopes
    symbol, names = etype.value, [b.get("name") for b in fast.branches]
    if symbol not in fast.symbols or record_name not in names or etype not in contract:
        return ""
    record = fast.branches[names.index(record_name)]
    payload, payload_any = (_payload_code(record, contract[etype], fast=f) for f in (True, False))
    if payload is None or payload_any is None:
        return ""
    namespace[f"TYPE_{symbol}"] = zigzag_varint(fast.symbols.index(symbol))
    namespace[f"BRANCH_{symbol}"] = zigzag_varint(names.index(record_name))
    namespace[f"NAMES_{symbol}"] = frozenset(contract[etype])
    return _function(symbol, fast, payload, fast=True) + "\n" + _function(symbol, general, payload_any, fast=False)


class DirectWriter:
    """Writes events of the types it was compiled for (see the module docstring); thread-safe.

    Build with :meth:`compile`. Call ``writer(event, header)``.
    """

    def __init__(self, writers: dict[EventType, WriteFn], source: str) -> None:
        self.writers: Mapping[EventType, WriteFn] = writers
        """The writer of each type it writes (the codec calls them itself: one call less per event)."""
        self.source = source
        """The generated Python source (one function per type), for reading and debugging."""

    @classmethod
    def compile(
        cls,
        parsed: Mapping[str, Any],
        *,
        record_names: Mapping[EventType, str],
        contract: Mapping[EventType, Mapping[str, tuple[type, bool]]],
        repeated: Collection[str] = (),
    ) -> DirectWriter | None:
        """Generate the writers for an envelope schema.

        Args:
            parsed: the envelope, ``fastavro.parse_schema`` output (the codec's current version).
            record_names: each type's payload record full name (``runjournal.MessagePayload``).
            contract: each type's payload fields, name -> (Python type, required) (``PAYLOAD_FIELDS``).
            repeated: envelope string fields that repeat across events (``run_id``, ``tenant_id``, ``producer_id``):
                their length-prefixed UTF-8 is remembered, for up to 2,048 distinct values (then it starts over).

        Returns:
            A writer for every type whose payload record matches its contract (the others go to the checked
            path), or None when the envelope holds a field it cannot write or no type matches.
        """
        envelope = _envelope(parsed, fast=True, repeated=repeated)
        general = _envelope(parsed, fast=False, repeated=repeated)
        if envelope is None or general is None:
            return None
        namespace: dict[str, Any] = {
            "SMALL": _SMALL, "SMALL_N": _SMALL_N, "varint": zigzag_varint, "strings": _strings,
            "millis": _Millis(), "datetime": datetime, **_remembering(2048), "UTC": UTC, "JOIN": b"".join, "EMPTY": b"",
            "TRUE": b"\x01", "FALSE": b"\x00", "B0": _SMALL[0], "B1": _SMALL[1]}
        sources = [source for etype, record_name in record_names.items()
                   if (source := _type_source(etype, record_name, (envelope, general), contract, namespace))]
        if not sources:
            return None
        source = "\n".join(sources)
        exec(compile(source, "<runjournal.schemas._direct>", "exec"), namespace)  # noqa: S102 - our own source
        writers = {etype: namespace[f"write_{etype.value}"] for etype in record_names
                   if f"write_{etype.value}" in namespace}
        return cls(writers, source)

    @property
    def types(self) -> frozenset[EventType]:
        """The event types written directly."""
        return frozenset(self.writers)

    def __call__(self, event: Event, header: bytes) -> bytes | None:
        """``header`` + the Avro body of ``event``, or None when this writer does not accept it (the codec's
        checked path then decides). Never raises for a value that does not fit."""
        etype = event.type
        write = self.writers.get(etype) if etype.__class__ is EventType else None
        return None if write is None else write(event, header)

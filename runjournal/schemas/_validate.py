"""Check a record against its Avro schema before it is written: every value's type and range, the field named.

fastavro's writer checks some values and not others: it writes a Python int of 2**31 into an Avro
``int`` field (a Java or Go reader then fails on the record), while a ``long`` overflow raises deep
inside the writer without naming the field. :class:`RecordValidator` compiles a parsed schema once into
checkers, and :meth:`RecordValidator.__call__` runs them on a record, raising
:class:`~runjournal.schemas.errors.InvalidEventError` whose ``field`` is the dotted path of the first
offending value (``payload.attempt``, ``occurred_at``, ``payload.nodes[3]``). What is checked (Avro
specification 1.11, § Primitive Types, § Complex Types, § Logical Types):

| Avro type | accepted Python values |
|---|---|
| null | ``None`` |
| boolean | ``bool`` only (not 0 / 1) |
| int / long | ``int`` (not ``bool``) within [-2**31, 2**31-1] / [-2**63, 2**63-1] |
| float / double | ``int`` or ``float`` (not ``bool``); a finite float must fit IEEE binary32 / binary64 |
| string | ``str`` that encodes as UTF-8 (no lone surrogates); not ``bytes`` |
| bytes / fixed | ``bytes``, ``bytearray`` or ``memoryview`` (fixed: exactly ``size`` bytes); not ``str`` |
| enum | one of the symbols (a ``str``) |
| array / map | ``list`` or ``tuple`` / ``dict`` with ``str`` keys; every item checked |
| record | a mapping; a missing field is an error unless the field has a default |
| union | a value one branch accepts, or fastavro's tuple notation ``(record fullname, record)`` |
| timestamp-millis / -micros | an aware ``datetime`` (naive: local-timestamp-* only), or an ``int`` in long range |
| date, time-millis / -micros | a ``date`` / ``time``, or an ``int`` within the day (time) or int range (date) |
| uuid | a ``uuid.UUID`` or its canonical text |
| decimal | a finite ``decimal.Decimal`` with at most ``scale`` fraction digits and ``precision`` digits |

Pure; thread-safe after construction.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from runjournal.schemas.errors import InvalidEventError

__all__ = ["RecordValidator"]

INT_RANGE = (-(2**31), 2**31 - 1)
LONG_RANGE = (-(2**63), 2**63 - 1)
_FLOAT32_MAX = 3.4028234663852886e38
_DAY_MS = 86_400_000
_BYTES = (bytes, bytearray, memoryview)

Check = Callable[[Any], None]
"""A compiled checker: ``check(value)`` returns, or raises :class:`_Bad` (the path is added on the way out)."""


class _Bad(Exception):
    """A value that does not fit; ``segments`` is its path, innermost first (filled in while unwinding).
    ``kind`` is the standard error it amounts to (TypeError: wrong type; ValueError: out of range)."""

    def __init__(self, reason: str, kind: type[Exception] = TypeError) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind
        self.segments: list[str] = []

    @property
    def path(self) -> str:
        out = ""
        for seg in reversed(self.segments):
            out += seg if seg.startswith("[") or not out else f".{seg}"
        return out


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _integer(low: int, high: int, avro: str) -> Check:
    def check(value: Any) -> None:
        if not isinstance(value, int) or isinstance(value, bool):
            raise _Bad(f"must be an int for Avro {avro}, got {type(value).__name__} {_show(value)}")
        if not low <= value <= high:
            raise _Bad(f"{value} is outside Avro {avro} [{low}, {high}]", ValueError)
    return check


def _floating(avro: str) -> Check:
    def check(value: Any) -> None:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise _Bad(f"must be a number for Avro {avro}, got {type(value).__name__} {_show(value)}")
        try:
            number = float(value)
        except OverflowError:
            raise _Bad(f"{_show(value)} does not fit Avro {avro}", ValueError) from None
        if avro == "float" and math.isfinite(number) and abs(number) > _FLOAT32_MAX:
            raise _Bad(f"{_show(value)} does not fit Avro float (IEEE binary32)", ValueError)
    return check


def _string(value: Any) -> None:
    if type(value) is not str and not isinstance(value, str):
        raise _Bad(f"must be a str for Avro string, got {type(value).__name__} {_show(value)}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _Bad(f"is not valid Unicode text (lone surrogate at index {exc.start})", ValueError) from None


def _bytes(value: Any) -> None:
    if not isinstance(value, _BYTES):
        raise _Bad(f"must be bytes for Avro bytes, got {type(value).__name__} {_show(value)}")


def _null(value: Any) -> None:
    if value is not None:
        raise _Bad(f"must be None for Avro null, got {type(value).__name__} {_show(value)}")


def _boolean(value: Any) -> None:
    if type(value) is not bool:
        raise _Bad(f"must be a bool for Avro boolean, got {type(value).__name__} {_show(value)}")


_PRIMITIVES: dict[str, Check] = {
    "null": _null,
    "boolean": _boolean,
    "int": _integer(*INT_RANGE, "int"),
    "long": _integer(*LONG_RANGE, "long"),
    "float": _floating("float"),
    "double": _floating("double"),
    "string": _string,
    "bytes": _bytes,
}


def _timestamp(base: Check, *, local: bool) -> Check:
    def check(value: Any) -> None:
        if isinstance(value, dt.datetime):
            if not local and value.utcoffset() is None:
                raise _Bad("is a naive datetime; a timestamp needs a timezone", ValueError)
            return
        base(value)
    return check


def _date(base: Check) -> Check:
    def check(value: Any) -> None:
        if not isinstance(value, dt.date):
            base(value)
    return check


def _time_of_day(base: Check, units_per_day: int) -> Check:
    def check(value: Any) -> None:
        if isinstance(value, dt.time):
            return
        base(value)
        if not 0 <= value < units_per_day:
            raise _Bad(f"{value} is not a time of day (0 <= t < {units_per_day})", ValueError)
    return check


def _uuid(value: Any) -> None:
    if isinstance(value, uuid.UUID):
        return
    _string(value)
    try:
        uuid.UUID(value)
    except ValueError:
        raise _Bad(f"{_show(value)} is not a UUID", ValueError) from None


def _decimal(base: Check, precision: int, scale: int) -> Check:
    def check(value: Any) -> None:
        if not isinstance(value, decimal.Decimal):
            base(value)
            return
        if not value.is_finite():
            raise _Bad(f"{value} is not a finite decimal", ValueError)
        _, digits, exponent = value.as_tuple()
        assert isinstance(exponent, int)
        if -exponent > scale:
            raise _Bad(f"{value} has more than {scale} fraction digits (decimal scale)", ValueError)
        if len(digits) + exponent + scale > precision:
            raise _Bad(f"{value} has more than {precision} digits at scale {scale} (decimal precision)", ValueError)
    return check


def _logical(schema: Mapping[str, Any], base: Check) -> Check:
    kind = schema.get("logicalType")
    if kind in ("timestamp-millis", "timestamp-micros", "local-timestamp-millis", "local-timestamp-micros"):
        return _timestamp(base, local=kind.startswith("local"))
    if kind == "date":
        return _date(base)
    if kind == "time-millis":
        return _time_of_day(base, _DAY_MS)
    if kind == "time-micros":
        return _time_of_day(base, _DAY_MS * 1000)
    if kind == "uuid":
        return _uuid
    if kind == "decimal":
        return _decimal(base, int(schema["precision"]), int(schema.get("scale", 0)))
    return base  # an unknown logical type is its underlying type (Avro spec)


class RecordValidator:
    """A parsed Avro schema compiled into checkers; call it on a record before writing it.

    Args:
        parsed: ``fastavro.parse_schema`` output (named types resolved through ``__named_schemas``).

    Raises:
        ValueError: the schema holds a type this validator does not know.
    """

    def __init__(self, parsed: Mapping[str, Any]) -> None:
        self._named: dict[str, Any] = dict(parsed.get("__named_schemas", {}))
        self._compiled: dict[str, Check] = {}
        self._check = self._compile(parsed)

    def __call__(self, record: Mapping[str, Any]) -> None:
        """Check ``record`` (the envelope as the writer will take it).

        Raises:
            InvalidEventError: a value does not fit its type or range; ``.field`` is its dotted path.
        """
        try:
            self._check(record)
        except _Bad as bad:
            event = record.get("event_id") if isinstance(record, Mapping) else None
            path = bad.path
            raise InvalidEventError(f"event {event}: field {path or '<record>'} {bad.reason}",
                                    field=path or None) from bad.kind(f"{path or '<record>'}: {bad.reason}")

    # -- compilation ------------------------------------------------------------------------------
    def _compile(self, schema: Any) -> Check:
        if isinstance(schema, str):
            if schema in _PRIMITIVES:
                return _PRIMITIVES[schema]
            if schema in self._compiled:  # a named type (possibly recursive): resolved lazily
                return lambda value: self._compiled[schema](value)
            if schema not in self._named:
                raise ValueError(f"unknown Avro type {schema!r}")
            return self._compile(self._named[schema])
        if isinstance(schema, list):
            return self._union(schema)
        kind = schema["type"]
        if kind in _PRIMITIVES or isinstance(kind, dict | list) or kind in self._named:
            return _logical(schema, self._compile(kind))
        build = {"record": self._record, "enum": self._enum, "array": self._array, "map": self._map,
                 "fixed": self._fixed}.get(kind)
        if build is None:
            raise ValueError(f"unknown Avro type {kind!r}")
        return build(schema)

    def _record(self, schema: Mapping[str, Any]) -> Check:
        name = schema.get("name", "")
        self._compiled[name] = _null  # placeholder: a recursive reference resolves after compilation
        fields = [(f["name"], self._compile(f["type"]), "default" in f) for f in schema["fields"]]

        def check(value: Any) -> None:
            if not isinstance(value, Mapping):
                raise _Bad(f"must be a mapping for record {name}, got {type(value).__name__}")
            for field, field_check, has_default in fields:
                try:
                    field_check(value[field])
                except KeyError:
                    if not has_default:
                        bad = _Bad(f"is missing (record {name} has no default for it)", ValueError)
                        bad.segments.append(field)
                        raise bad from None
                except _Bad as bad:
                    bad.segments.append(field)
                    raise

        self._compiled[name] = check
        return check

    def _enum(self, schema: Mapping[str, Any]) -> Check:
        symbols = frozenset(schema["symbols"])
        name = schema.get("name", "enum")

        def check(value: Any) -> None:
            if not isinstance(value, str) or value not in symbols:
                raise _Bad(f"{_show(value)} is not a symbol of enum {name}", ValueError)
        return check

    def _array(self, schema: Mapping[str, Any]) -> Check:
        item = self._compile(schema["items"])

        def check(value: Any) -> None:
            if not isinstance(value, list | tuple):
                raise _Bad(f"must be a list for Avro array, got {type(value).__name__}")
            for i, v in enumerate(value):
                try:
                    item(v)
                except _Bad as bad:
                    bad.segments.append(f"[{i}]")
                    raise
        return check

    def _map(self, schema: Mapping[str, Any]) -> Check:
        item = self._compile(schema["values"])

        def check(value: Any) -> None:
            if not isinstance(value, Mapping):
                raise _Bad(f"must be a dict for Avro map, got {type(value).__name__}")
            for k, v in value.items():
                if not isinstance(k, str):
                    raise _Bad(f"has key {_show(k)}: Avro map keys are strings")
                try:
                    item(v)
                except _Bad as bad:
                    bad.segments.append(f"[{k!r}]")
                    raise
        return check

    def _fixed(self, schema: Mapping[str, Any]) -> Check:
        size = int(schema["size"])

        def check(value: Any) -> None:
            _bytes(value)
            if len(value) != size:
                raise _Bad(f"has {len(value)} bytes, fixed {schema.get('name')} needs {size}", ValueError)
        return _logical(schema, check)

    def _union(self, branches: list[Any]) -> Check:
        checks = [self._compile(b) for b in branches]
        names = [b if isinstance(b, str) else b.get("name", b.get("type")) for b in branches]
        by_name = {n: c for n, c in zip(names, checks, strict=True) if isinstance(n, str)}
        nullable = "null" in names
        others = [c for n, c in zip(names, checks, strict=True) if n != "null"]
        label = " | ".join(str(n) for n in names)

        def check(value: Any) -> None:
            if value is None and nullable:
                return
            if isinstance(value, tuple) and len(value) == 2 and value[0] in by_name:  # fastavro tuple notation
                by_name[value[0]](value[1])
                return
            first: _Bad | None = None
            for branch in others:
                try:
                    branch(value)
                    return
                except _Bad as bad:
                    first = first or bad
            if first is not None and first.segments and len(others) == 1:  # a deeper field decided: name it
                raise first
            if len(others) == 1 and first is not None:
                raise _Bad(f"{first.reason} (or None)" if nullable else first.reason, first.kind)
            raise _Bad(f"{_show(value)} fits none of {label}")
        return check

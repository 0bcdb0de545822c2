"""Static Avro schema-resolution rules (Avro spec § Schema Resolution), walked field by field.

Private helper of :mod:`runjournal.schemas.compat`: it names the *field* a resolution would fail on,
which fastavro's own errors often do not. Both schemas are fastavro-parsed with
``expand=True`` (named types inlined, names fully qualified).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Finding", "enum_schemas", "kind", "resolution_findings", "short_name"]

#: (path, message): one reason a writer schema cannot be read by a reader schema.
Finding = tuple[str, str]

_PROMOTIONS = {
    ("int", "long"),
    ("int", "float"),
    ("int", "double"),
    ("long", "float"),
    ("long", "double"),
    ("float", "double"),
    ("string", "bytes"),
    ("bytes", "string"),
}
_NAMED = {"record", "enum", "fixed"}


def kind(schema: Any) -> str:
    """``union``, a primitive name, or ``record``/``enum``/``array``/``map``/``fixed``."""
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        inner = schema["type"]
        return kind(inner) if isinstance(inner, dict | list) else inner
    return schema


def short_name(schema: Any) -> str:
    """Unqualified name of a named schema, else its kind (for messages and paths)."""
    if isinstance(schema, dict) and kind(schema) in _NAMED:
        return str(schema["name"]).rpartition(".")[2]
    return kind(schema)


def _names_match(writer: dict[str, Any], reader: dict[str, Any]) -> bool:
    if writer["name"] == reader["name"]:
        return True
    namespace = reader["name"].rpartition(".")[0]
    aliases = {a if "." in a else f"{namespace}.{a}" for a in reader.get("aliases", [])}
    return writer["name"] in aliases


def _matches(writer: Any, reader: Any, *, promote: bool) -> bool:
    wk, rk = kind(writer), kind(reader)
    if wk in _NAMED or rk in _NAMED:
        return wk == rk and _names_match(writer, reader)
    return wk == rk or (promote and (wk, rk) in _PROMOTIONS)


def _branch_for(writer: Any, reader_union: list[Any]) -> Any | None:
    for promote in (False, True):
        for branch in reader_union:
            if _matches(writer, branch, promote=promote):
                return branch
    return None


def resolution_findings(writer: Any, reader: Any, path: str = "") -> list[Finding]:
    """Every place a value written with ``writer`` could not be read with ``reader``.

    Args:
        writer, reader: expanded fastavro-parsed schemas (or sub-schemas).
        path: dotted path of this sub-schema (``Event.payload<ToolCallIntendedPayload>.timeout_ms``).

    Returns:
        ``(path, message)`` findings; empty when every writer value resolves.
    """
    path = path or short_name(reader)
    wk, rk = kind(writer), kind(reader)
    if wk == "union":
        out: list[Finding] = []
        for branch in writer:
            out += resolution_findings(branch, reader, _branch_path(path, branch))
        return out
    if rk == "union":
        named = [b for b in reader if wk in _NAMED and _matches(writer, b, promote=False)]
        if len(named) > 1:
            names = ", ".join(short_name(b) for b in named)
            return [(path, f"writer {short_name(writer)} matches several reader union branches ({names})")]
        branch = _branch_for(writer, reader)
        if branch is None:
            return [(path, f"writer {short_name(writer)} matches no branch of the reader union")]
        return resolution_findings(writer, branch, path)
    if not _matches(writer, reader, promote=True):
        return [(path, f"writer type {short_name(writer)} cannot be read as {short_name(reader)}")]
    walker = _WALKERS.get(rk)
    return walker(writer, reader, path) if walker else []


def _branch_path(path: str, branch: Any) -> str:
    return f"{path}<{short_name(branch)}>" if kind(branch) in _NAMED else path


def _record(writer: dict[str, Any], reader: dict[str, Any], path: str) -> list[Finding]:
    out: list[Finding] = []
    by_name = {f["name"]: f for f in writer["fields"]}
    for field in reader["fields"]:
        names = [field["name"], *field.get("aliases", [])]
        source = next((by_name[n] for n in names if n in by_name), None)
        where = f"{path}.{field['name']}"
        if source is None:
            if "default" not in field:
                out.append(
                    (where, f"reader field '{field['name']}' has no default and the writer has no such field")
                )
            continue
        out += resolution_findings(source["type"], field["type"], where)
    return out


def _enum(writer: dict[str, Any], reader: dict[str, Any], path: str) -> list[Finding]:
    missing = [s for s in writer["symbols"] if s not in reader["symbols"]]
    if missing and "default" not in reader:
        return [(path, f"reader enum lacks symbols {missing} and has no default symbol")]
    return []


def _array(writer: dict[str, Any], reader: dict[str, Any], path: str) -> list[Finding]:
    return resolution_findings(writer["items"], reader["items"], f"{path}[]")


def _map(writer: dict[str, Any], reader: dict[str, Any], path: str) -> list[Finding]:
    return resolution_findings(writer["values"], reader["values"], f"{path}{{}}")


def _fixed(writer: dict[str, Any], reader: dict[str, Any], path: str) -> list[Finding]:
    if writer["size"] != reader["size"]:
        return [(path, f"fixed size {writer['size']} cannot be read as size {reader['size']}")]
    return []


_WALKERS: dict[str, Callable[[Any, Any, str], list[Finding]]] = {
    "record": _record,
    "enum": _enum,
    "array": _array,
    "map": _map,
    "fixed": _fixed,
}


def enum_schemas(schema: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every enum inside an expanded schema, with its dotted path."""
    path = path or short_name(schema)
    k = kind(schema)
    if k == "union":
        for branch in schema:
            yield from enum_schemas(branch, _branch_path(path, branch))
    elif k == "enum":
        yield path, schema
    elif k == "record":
        for field in schema["fields"]:
            yield from enum_schemas(field["type"], f"{path}.{field['name']}")
    elif k == "array":
        yield from enum_schemas(schema["items"], f"{path}[]")
    elif k == "map":
        yield from enum_schemas(schema["values"], f"{path}{{}}")

"""The compatibility gate: every pair of envelope versions under :data:`POLICY`, checked for real.

Policy ``FULL_TRANSITIVE`` (see docs/reference/event-contract.md for why): rolling upgrades go in either
order, so

* **backward** — every reader reads bytes written by *every* older version (a replay or a
  rebuilt projection reads v1 events with today's code): each ``(writer vI, reader vJ)``, ``I <= J``;
* **forward** — every reader from :data:`FORWARD_SINCE` on reads bytes written by *every* newer
  version (a new agent may publish before the projector is upgraded): each ``(writer vI, reader
  vJ)``, ``I > J >= FORWARD_SINCE``, resolved the way the codec resolves it — standard Avro rules
  with the **open payload union** (:mod:`runjournal.schemas._open_union`): the payload record of a
  type symbol the older reader does not know needs no reader branch, because that reader decodes
  it as an ``UNKNOWN`` event; the symbol itself needs the older reader's enum default.

v1 → v2 renamed ``instance_id`` and predates the policy (v1 readers are retired), so forward
checks start at v2. Each pair is checked twice:

1. statically, field by field (Avro spec resolution rules), so a problem names its field;
2. dynamically, by real fastavro resolution of generated records, one batch per payload
   branch: each must resolve, land on the *same* payload branch (never another record of the
   union), and keep its ``type`` symbol (or the reader enum's default).

Per schema it also checks that every enum has a ``default`` symbol and that the type enum and
the payload branches agree; for the newest published version, that it matches
``runjournal.schemas.events`` (Event fields and PAYLOAD_FIELDS); and that the published ledger holds.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

from fastavro import schemaless_reader, schemaless_writer
from fastavro.schema import parse_schema
from fastavro.utils import generate_one

from runjournal.schemas._contract import contract_findings
from runjournal.schemas._open_union import open_reader_raw
from runjournal.schemas._resolution import enum_schemas, kind, resolution_findings
from runjournal.schemas.errors import SchemaError
from runjournal.schemas.published import verify_published
from runjournal.schemas.versions import ENVELOPE_DIR, SchemaVersion, load_version, load_versions, payload_record_name

__all__ = ["FORWARD_SINCE", "POLICY", "Problem", "check_all", "check_pair", "check_schema", "opened_reader"]

#: The checked compatibility policy: every reader reads every older *and* every newer writer.
POLICY = "FULL_TRANSITIVE"
#: The oldest reader version the forward half of the policy applies to (v1 → v2 was a rename).
FORWARD_SINCE = 2
_UNKNOWN = "UNKNOWN"
_MAX_DETAIL = 200  # characters of a fastavro error kept in a Problem (some dump whole schemas)


@dataclass(frozen=True, slots=True)
class Problem:
    """One compatibility or contract violation."""

    writer: str
    """Writer schema label (``v1``, ``candidate:v3.avsc``), or ``-`` for a single-schema check."""
    reader: str
    """Reader schema label, or the checked schema for a single-schema check."""
    field: str
    """Dotted path of the offending field (``Event.payload<ToolCallIntendedPayload>.timeout_ms``)."""
    message: str
    """What is wrong, in words."""

    def __str__(self) -> str:
        return f"{self.writer} -> {self.reader}: {self.field}: {self.message}"


def check_all(
    *,
    candidates: Sequence[Path] = (),
    samples: int = 20,
    seed: int = 0,
    directory: Path = ENVELOPE_DIR,
) -> list[Problem]:
    """Check every published version, plus optional candidate schemas, under :data:`POLICY`.

    Args:
        candidates: ``.avsc`` files checked as the next version(s), after the published ones.
        samples: generated records per payload branch per pair.
        seed: seed of the record generator (the check is deterministic for a seed).
        directory: the envelope versions (default ``schemas/avro/envelope``); the published
            ledger is verified only for the default directory.

    Returns:
        Every problem found; empty means the gate passes.
    """
    versions = list(load_versions(directory))
    labels = {id(v): v.label for v in versions}
    problems: list[Problem] = []
    if directory == ENVELOPE_DIR:
        problems += [Problem("-", "published.sha256", "-", message) for message in verify_published()]
    problems += [
        Problem("-", versions[-1].label, f, m) for f, m in contract_findings(_expanded(versions[-1]))
    ]
    problems += _add_candidates(candidates, versions, labels)
    for version in versions:
        problems += _guarded("-", labels[id(version)], lambda v=version: check_schema(v, label=labels[id(v)]))
    for j, reader in enumerate(versions):
        for i, writer in enumerate(versions):
            if i > j and j + 1 < FORWARD_SINCE:
                continue  # forward half starts at FORWARD_SINCE (1-based versions: index j is v{j+1})
            problems += _guarded(
                labels[id(writer)],
                labels[id(reader)],
                lambda w=writer, r=reader, fwd=i > j: check_pair(
                    w, opened_reader(r, w) if fwd else r, samples=samples, seed=seed, labels=labels
                ),
            )
    return problems


def opened_reader(reader: SchemaVersion, writer: SchemaVersion) -> SchemaVersion:
    """``reader`` as the codec resolves ``writer`` with it: its payload union opened for the writer's
    new type symbols (:func:`runjournal.schemas._open_union.open_reader_raw`); ``reader`` itself when
    there are none. The result keeps ``reader``'s label in problems."""
    raw = open_reader_raw(reader.raw, writer.raw)
    if raw is reader.raw:
        return reader
    parsed = parse_schema(raw)
    opened = SchemaVersion(reader.version, reader.path, raw, parsed, reader.canonical_form, reader.fingerprint)
    _OPENED_LABELS[id(opened)] = id(reader)
    return opened


_OPENED_LABELS: dict[int, int] = {}


def _add_candidates(
    paths: Sequence[Path], versions: list[SchemaVersion], labels: dict[int, str]
) -> list[Problem]:
    """Append each loadable candidate to ``versions`` as the next version; unloadable ones are Problems."""
    problems = []
    for path in map(Path, paths):
        try:
            candidate = load_version(path, version=len(versions) + 1)
        except SchemaError as exc:
            problems.append(Problem("-", f"candidate:{path.name}", "-", str(exc)))
            continue
        labels[id(candidate)] = f"candidate:{path.name}"
        versions.append(candidate)
    return problems


def _guarded(writer: str, reader: str, check: Callable[[], list[Problem]]) -> list[Problem]:
    """Run one check; a schema too broken to check at all becomes a Problem instead of an exception."""
    try:
        return check()
    except SchemaError as exc:
        return [Problem(writer, reader, "-", str(exc))]


def check_schema(version: SchemaVersion, *, label: str | None = None) -> list[Problem]:
    """Single-schema rules: every enum has a default symbol; type symbols and payload branches agree."""
    label = label or version.label
    expanded = _expanded(version)
    problems = [
        Problem(
            "-",
            label,
            path,
            f"enum {enum['name']} has no default symbol: a reader could not survive "
            "a symbol it does not know",
        )
        for path, enum in enum_schemas(expanded)
        if enum.get("default") not in enum["symbols"]
    ]
    symbols = [s for s in _type_enum(expanded)["symbols"] if s != _UNKNOWN]
    branches = {b["name"] for b in _payload_branches(expanded)}
    for symbol in symbols:
        if payload_record_name(symbol) not in branches:
            problems.append(
                Problem(
                    "-",
                    label,
                    "Event.payload",
                    f"type {symbol} has no payload record {payload_record_name(symbol)}",
                )
            )
    expected = {payload_record_name(s) for s in symbols}
    for name in sorted(branches - expected):
        problems.append(Problem("-", label, "Event.payload", f"payload record {name} matches no type symbol"))
    return problems


def check_pair(
    writer: SchemaVersion,
    reader: SchemaVersion,
    *,
    samples: int = 20,
    seed: int = 0,
    labels: dict[int, str] | None = None,
) -> list[Problem]:
    """Problems reading ``writer`` bytes with ``reader``: static field walk plus generated records.

    A pair the static walk already refuses reports only what the generated records add beyond it: fastavro failing
    to resolve them restates the field the walk named (one problem, not two), while a record silently read into the
    wrong branch or symbol is a finding of its own."""
    labels = labels or {}
    wl = labels.get(id(writer), writer.label)
    rl = labels.get(_OPENED_LABELS.get(id(reader), id(reader)), reader.label)
    problems = [
        Problem(wl, rl, path, msg) for path, msg in resolution_findings(_expanded(writer), _expanded(reader))
    ]
    static = bool(problems)
    seen: set[str] = set()
    for path, message in _dynamic(writer, reader, samples, seed):
        if static and message.startswith(_UNRESOLVED):
            continue
        if message not in seen:  # one failing envelope field fails every branch the same way
            seen.add(message)
            problems.append(Problem(wl, rl, path, message))
    return problems


_UNRESOLVED = "fastavro could not resolve generated records"


def _dynamic(
    writer: SchemaVersion, reader: SchemaVersion, samples: int, seed: int
) -> Iterator[tuple[str, str]]:
    expanded_reader = _expanded(reader)
    reader_enum = _type_enum(expanded_reader)
    reader_branches = _payload_branches(expanded_reader)
    for branch_name, symbol, record in _generated(writer, samples, seed):
        expected = _reader_branch(branch_name, reader_branches)
        path = f"Event.payload<{branch_name.rpartition('.')[2]}>"
        buf = BytesIO()
        try:
            schemaless_writer(buf, writer.parsed, record)
            buf.seek(0)
            got = schemaless_reader(buf, writer.parsed, reader.parsed, return_record_name=True)
        except Exception as exc:  # any failure of the real resolution is the finding itself
            detail = str(exc) if len(str(exc)) <= _MAX_DETAIL else str(exc)[:_MAX_DETAIL] + "…"
            yield "Event", f"{_UNRESOLVED}: {type(exc).__name__}: {detail}"
            continue
        want_symbol = symbol if symbol in reader_enum["symbols"] else reader_enum.get("default")
        if got["payload"][0] != expected:
            yield (
                path,
                f"a {branch_name} payload was read as union branch {got['payload'][0]} (expected {expected})",
            )
        elif got["type"] != want_symbol:
            yield "Event.type", f"symbol {symbol} was read as {got['type']} (expected {want_symbol})"
        elif want_symbol != _UNKNOWN and payload_record_name(got["type"]) != got["payload"][0]:
            yield path, f"type {got['type']} does not name payload branch {got['payload'][0]}"


def _generated(version: SchemaVersion, samples: int, seed: int) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """``(branch name, type symbol, record)``: ``samples`` envelopes per payload branch, in tuple notation."""
    expanded = _expanded(version)
    symbol_of = {payload_record_name(s): s for s in _type_enum(expanded)["symbols"]}
    state = random.getstate()  # fastavro.utils draws from the global generator
    random.seed(seed)
    try:
        for branch in _payload_branches(expanded):
            symbol = symbol_of.get(branch["name"], _UNKNOWN)
            for _ in range(samples):
                record = generate_one(expanded)
                record.update(type=symbol, payload=(branch["name"], generate_one(branch)))
                yield branch["name"], symbol, record
    finally:
        random.setstate(state)


def _reader_branch(writer_name: str, reader_branches: list[dict[str, Any]]) -> str | None:
    """The reader branch a writer payload record *should* land on: same name, else the one aliasing it."""
    if any(branch["name"] == writer_name for branch in reader_branches):
        return writer_name
    namespace = writer_name.rpartition(".")[0]
    for branch in reader_branches:
        if writer_name in {a if "." in a else f"{namespace}.{a}" for a in branch.get("aliases", [])}:
            return branch["name"]
    return None


def _expanded(version: SchemaVersion) -> dict[str, Any]:
    return parse_schema(version.raw, expand=True, _write_hint=False)


def _field(expanded: dict[str, Any], name: str) -> Any:
    for field in expanded["fields"]:
        if field["name"] == name:
            return field["type"]
    raise SchemaError(f"envelope {expanded.get('name')} has no field {name!r}")


def _type_enum(expanded: dict[str, Any]) -> dict[str, Any]:
    enum = _field(expanded, "type")
    if kind(enum) != "enum":
        raise SchemaError("envelope field 'type' must be an enum")
    return enum


def _payload_branches(expanded: dict[str, Any]) -> list[dict[str, Any]]:
    payload = _field(expanded, "payload")
    branches = payload if isinstance(payload, list) else [payload]
    return [b for b in branches if kind(b) == "record"]

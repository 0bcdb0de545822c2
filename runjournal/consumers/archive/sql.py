"""``runjournal query "SQL"``: DuckDB over the archive and the live projection (issue 30).

Three tables, each an in-memory copy made for the one query (a DuckDB connection of its own, closed after): a
statement can change the copies (``CREATE``, ``INSERT``, ``DROP`` …) but never the journal, Redis or the archive —
nothing is refused, nothing written back.

* ``runs`` — one row per run: from the live projection (Redis, every run the projector holds) and from the archive
  (each manifest's object, its events folded by the reducer). A run in both (archived, not yet removed) is shown
  once, from the archive.
* ``calls`` — one row per tool call (execution record) of those runs: the same two sources.
* ``events`` — one row per event, **archive only**: the live events are in Kafka, and reading them means scanning
  every partition of the events topic (cost grows with the topic's history), so ``query`` does not; ``inspect
  RUN_ID`` shows a live run's timeline.

``location`` says where a row came from: ``live`` or ``archive``. The journal names no provider: a tool is one
provider's API, so "reconciles by provider" groups calls by ``tool``.

With encryption on (decision 0059) the archive holds the journal's tokens as they were written (so crypto-shredding
reaches it); ``events.payload_json`` shows each content field opened with the reader's keys (``RUNJOURNAL_KEYS_DIR``),
or ``"encrypted"`` where this reader cannot open it (no key directory, an erased subject's destroyed key) — never
the token as if it were text. The other columns are structure (ids, statuses, times) and never encrypted.

Reading the archive reads every manifest and every object it names (through fsspec: ``file://`` and ``s3://``
alike): a full scan, the price of an ad-hoc query over cold data.

Needs the ``archive`` extra (pyarrow, fsspec) and ``duckdb`` (``pip install 'runjournal[archive]'``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any

from runjournal.consumers.archive.store import ArchivedRun, ArchiveError, read_archived
from runjournal.consumers.projector.store import ProjectionStore
from runjournal.consumers.runtime.partitions import events_partition_count
from runjournal.core import redis_client
from runjournal.core.settings import Settings
from runjournal.model.reducer import CallStatus, RunState, fold
from runjournal.producers.encryption import CONTENT_FIELDS, ContentCrypto
from runjournal.schemas import Event
from runjournal.stores.errors import ObjectStoreError
from runjournal.stores.object_store import filesystem

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

__all__ = ["CALLS", "EVENTS", "EXAMPLES", "RUNS", "QueryError", "QueryResult", "query"]

RUNS = ("run_id", "tenant_id", "agent", "status", "epoch", "started_at", "finished_at", "calls", "committed",
        "outcome_unknown", "reconciled", "failed", "location", "archived_url")
"""``runs`` columns: ids, ``status`` (RunStatus), ``epoch``, ``started_at`` / ``finished_at`` (timestamps, UTC),
the run's tool calls by status, ``location`` (``live`` | ``archive``) and ``archived_url`` (the object; null live)."""

CALLS = ("run_id", "tenant_id", "agent", "call_id", "tool", "idempotency_key", "status", "reconciled_outcome",
         "effect_committed", "side_effect", "attempts", "epoch", "intended_at", "outcome_at", "day", "location")
"""``calls`` columns: ``status`` (INTENDED, COMMITTED, FAILED, OUTCOME_UNKNOWN, RECONCILED), ``reconciled_outcome``
(the provider's answer: COMMITTED, NOT_EXECUTED, FAILED; null unless RECONCILED), ``effect_committed`` (COMMITTED, or
RECONCILED as COMMITTED), ``attempts``, ``intended_at`` / ``outcome_at`` (timestamps, UTC) and ``day`` (the date of
the outcome, else of the intent, UTC)."""

EVENTS = ("run_id", "tenant_id", "agent", "partition", "offset", "seq", "epoch", "type", "event_id",
          "occurred_at", "node_id", "call_id", "tool", "payload_json", "location")
"""``events`` columns (archive only): position, ``seq`` / ``epoch``, ``type``, ``occurred_at`` (timestamp, UTC), the
node, the call's ``call_id`` and ``tool`` (tool events; null otherwise) and ``payload_json`` (the payload as JSON)."""


EXAMPLES: dict[str, str] = {
    "unknown outcomes by tool":
        "SELECT tool, count(*) AS unknown FROM calls WHERE status = 'OUTCOME_UNKNOWN' GROUP BY tool ORDER BY tool",
    "reconciles by provider":
        "SELECT tool AS provider, reconciled_outcome, count(*) AS reconciles FROM calls WHERE status = 'RECONCILED' "
        "GROUP BY ALL ORDER BY ALL",
    "effects per tenant per day":
        "SELECT tenant_id, day, count(*) AS effects FROM calls WHERE effect_committed GROUP BY ALL ORDER BY ALL",
}
"""The documented example queries (docs/guide/archive.md § Query shows these texts), by title; the console's
``/counts`` page runs them."""


class QueryError(ArchiveError):
    """DuckDB refused the statement (syntax, unknown table or column, a type error): its message is kept."""


QueryResult = tuple[list[str], list[tuple[Any, ...]]]
"""``(columns, rows)``: the column names, then each row as a tuple in that order."""


def query(settings: Settings, sql: str, *, live: bool = True, archive: bool = True,
          redis: Any = None, content: ContentCrypto | None = None) -> QueryResult:
    """Run ``sql`` over ``runs``, ``calls`` and ``events`` (see the module docstring).

    Args:
        settings: the stack (Redis, the events topic's partition count) and ``archive_url``
            (``RUNJOURNAL_ARCHIVE_URL``).
        sql: one DuckDB statement (the last one's result is returned when there are several).
        live: include the live projection (Redis) — default True.
        archive: include the archive — default True.
        redis: a Redis client; default ``runjournal.core.redis_client.client(settings)``.
        content: opens the archived events' content fields (default ``ContentCrypto(settings, encrypt=False)``: the
            settings' key directory); where it cannot, ``payload_json`` holds ``"encrypted"`` (decision 0059).

    Returns:
        :class:`QueryResult` ``(columns, rows)``; a statement with no result set gives no rows (DuckDB may name a
        column, ``Success``).

    Raises:
        QueryError: DuckDB refused the statement.
        ObjectStoreError: the archive's backend is unknown, or the archive extra is not installed.
        ArchiveVerifyError: an object does not match its manifest.
        TopicNotFoundError: the events topic does not exist (live).
    """
    runs: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    archived_ids: set[str] = set()
    if archive:
        opener = content if content is not None else ContentCrypto(settings, encrypt=False)
        for archived in _archived_runs(settings):
            archived_ids.add(archived.manifest["run_id"])
            _add_archived(settings, archived, runs, calls, events, opener)
    if live:
        for state in _live_states(settings, redis):
            if state.run_id not in archived_ids:
                runs.append(_run_row(state, "live", None))
                calls.extend(_call_rows(state, "live"))
    return _run_sql(sql, {"runs": (RUNS, runs), "calls": (CALLS, calls), "events": (EVENTS, events)})


def _run_sql(sql: str, tables: dict[str, tuple[tuple[str, ...], list[dict[str, Any]]]]) -> QueryResult:
    try:
        import duckdb
        import pyarrow as pa
    except ImportError as exc:
        raise ObjectStoreError("runjournal query needs duckdb and pyarrow: pip install 'runjournal[archive]'") \
            from exc
    con = duckdb.connect(":memory:")
    try:
        for name, (columns, rows) in tables.items():
            arrow = pa.Table.from_pylist(rows, schema=_schema(pa, columns))
            con.register(f"_{name}", arrow)
            con.execute(f"CREATE TABLE {name} AS SELECT * FROM _{name}")  # a copy: the query may change only it
            con.unregister(f"_{name}")
        try:
            cursor = con.execute(sql)
        except duckdb.Error as exc:
            raise QueryError(str(exc)) from exc
        if cursor.description is None:
            return [], []
        return [d[0] for d in cursor.description], [tuple(r) for r in cursor.fetchall()]
    finally:
        con.close()


def _schema(pa: Any, columns: tuple[str, ...]) -> Any:
    types = {"partition": pa.int32(), "offset": pa.int64(), "seq": pa.int64(), "epoch": pa.int64(),
             "calls": pa.int64(), "committed": pa.int64(), "outcome_unknown": pa.int64(), "reconciled": pa.int64(),
             "failed": pa.int64(), "attempts": pa.int64(), "effect_committed": pa.bool_(),
             "side_effect": pa.bool_(), "day": pa.date32()}
    stamp = pa.timestamp("ms", tz="UTC")
    return pa.schema([(c, types.get(c, stamp if c.endswith("_at") else pa.string())) for c in columns])


def _archived_runs(settings: Settings) -> Iterable[ArchivedRun]:
    fs, root = filesystem(settings)
    for path in sorted(_manifests(fs, root)):
        with fs.open(path, "rb") as src:
            run_id = json.loads(src.read())["run_id"]
        archived = read_archived(settings, run_id)  # verified against its manifest
        if archived is not None:
            yield archived


def _manifests(fs: AbstractFileSystem, root: str) -> list[str]:
    folder = f"{root}/runs"
    if not fs.exists(folder):
        return []
    return [p for p in fs.ls(folder, detail=False) if str(p).endswith(".json")]


def _add_archived(settings: Settings, archived: ArchivedRun, runs: list[dict[str, Any]],
                  calls: list[dict[str, Any]], events: list[dict[str, Any]], content: ContentCrypto) -> None:
    decoded = archived.events(settings)
    state = fold(decoded, critical=settings.critical_types)
    if state is None:
        return
    runs.append(_run_row(state, "archive", archived.manifest["object_url"]))
    calls.extend(_call_rows(state, "archive"))
    lineage = [state.run_id, *state.fork_lineage]
    for event, partition, offset in decoded:
        payload = _revealed(event, lineage, content)
        tool_event = str(event.type).startswith("TOOL_CALL_")
        events.append({"run_id": event.run_id, "tenant_id": event.tenant_id, "agent": state.agent,
                       "partition": partition, "offset": offset, "seq": event.seq, "epoch": event.epoch,
                       "type": str(event.type), "event_id": event.event_id, "occurred_at": event.occurred_at,
                       "node_id": event.node_id, "call_id": payload.get("call_id") if tool_event else None,
                       "tool": payload.get("tool") if tool_event else None,
                       "payload_json": json.dumps(payload, sort_keys=True, default=str), "location": "archive"})


def _revealed(event: Event, lineage: list[str], content: ContentCrypto) -> dict[str, Any]:
    """``event``'s payload with its content fields opened, or ``"encrypted"`` where ``content`` cannot open them
    (decision 0059); plain text as it is (an escaped ``rjenc:0:`` text unescaped)."""
    fields = CONTENT_FIELDS.get(event.type)
    if not fields:
        return event.payload
    payload = dict(event.payload)
    for name, address in fields:
        if isinstance(payload.get(name), str):
            payload[name] = content.reveal(payload[name], lineage, address(event), name)
    return payload


def _live_states(settings: Settings, redis: Any) -> list[RunState]:
    client = redis if redis is not None else redis_client.client(settings)
    store = ProjectionStore(client, settings.topic_prefix)
    out: list[RunState] = []
    for partition in range(events_partition_count(settings)):
        out.extend(store.load(partition, sorted(store.run_ids(partition))).values())
    return out


def _run_row(state: RunState, location: str, url: str | None) -> dict[str, Any]:
    by_status = [str(r.status) for r in state.records.values()]
    return {"run_id": state.run_id, "tenant_id": state.tenant_id, "agent": state.agent,
            "status": str(state.status), "epoch": state.epoch, "started_at": _stamp(state.started_at_ms),
            "finished_at": _stamp(state.finished_at_ms), "calls": len(by_status),
            "committed": by_status.count(CallStatus.COMMITTED),
            "outcome_unknown": by_status.count(CallStatus.OUTCOME_UNKNOWN),
            "reconciled": by_status.count(CallStatus.RECONCILED), "failed": by_status.count(CallStatus.FAILED),
            "location": location, "archived_url": url}


def _call_rows(state: RunState, location: str) -> list[dict[str, Any]]:
    rows = []
    for r in state.records.values():
        when = r.outcome_at_ms if r.outcome_at_ms is not None else r.intended_at_ms
        rows.append({"run_id": state.run_id, "tenant_id": state.tenant_id, "agent": state.agent,
                     "call_id": r.call_id, "tool": r.tool, "idempotency_key": r.idempotency_key,
                     "status": str(r.status),
                     "reconciled_outcome": None if r.reconciled_outcome is None else str(r.reconciled_outcome),
                     "effect_committed": r.effect_committed, "side_effect": r.side_effect, "attempts": r.attempts,
                     "epoch": r.epoch, "intended_at": _stamp(r.intended_at_ms), "outcome_at": _stamp(r.outcome_at_ms),
                     "day": None if when is None else _day(when), "location": location})
    return rows


def _stamp(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


def _day(ms: int) -> date:
    return datetime.fromtimestamp(ms / 1000, UTC).date()


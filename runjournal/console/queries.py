"""What the console shows, read from the execution plane (projection, topic, inbox) and, beside it, memory.

Every execution fact on a page comes from the journal's stores — the runs index and run states in Redis
(``runjournal.consumers.projector``), the run's records in its partition of the events topic
(``runjournal.consumers.ops.inspect.read_run_events``), the approval inbox — never from memory. A run's memory items
are shown in a section of their own, labelled advisory, each with its provenance back to an event offset.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from runjournal.consumers.ops.control import applies
from runjournal.consumers.ops.inspect import read_run_events
from runjournal.consumers.projector.index import RunSummary, attention, read_entries
from runjournal.consumers.projector.store import ProjectionStore
from runjournal.consumers.runtime.partitions import events_partition_count
from runjournal.core import redis_client as redis_clients
from runjournal.core.crypto.token import PREFIX, decode_plain, is_encrypted
from runjournal.core.errors import RunjournalError
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.model.reducer import CallStatus, RunState, RunStatus
from runjournal.producers.approvals import ApprovalInbox
from runjournal.producers.control import ControlRequest, ControlStore
from runjournal.producers.encryption import ENCRYPTED
from runjournal.producers.handle import approval_scope
from runjournal.producers.spend import RESERVE_TOOL, SETTLE_TOOL, fold_spend
from runjournal.schemas.keys import partition_for
from runjournal.stores.errors import ObjectStoreError

__all__ = ["ConsoleData", "RunPage", "RunsPage", "rank", "record_class", "run_page"]

#: The ``status`` filter's choices beside every RunStatus value.
STATUS_GROUPS = {"parked": {"GAP", "BLOCKED"}, "active": {"RUNNING", "WAITING_APPROVAL"},
                 "terminal": {"SUCCEEDED", "FAILED", "CANCELLED"}}


def rank(entry: dict[str, Any]) -> int:
    """The runs list's sort rank of a decoded index entry, most urgent first: the index's ``attention`` (0 parked,
    1 an OUTCOME_UNKNOWN call, 2 waiting for approval, 3 running, 4 terminal), except that a PAUSED run is 3 —
    held on purpose by an operator: never marked for attention."""
    return 3 if entry["s"] == RunStatus.PAUSED.value else attention(entry)


@dataclass
class RunsPage:
    """One page of the runs list."""

    rows: list[RunSummary]
    """The runs of this page, most urgent first (parked, OUTCOME_UNKNOWN, awaiting approval, running, done),
    then most recently updated first."""
    total: int
    """Runs matching the filters (all pages)."""
    runs_in_projection: int
    """Runs in the projection (no filter)."""
    by_status: dict[str, int]
    """Status → runs of the tenant and agent filters (every run when neither is given); the status filter is
    not applied, so the counts are those of each status tab."""
    tenants: list[str]
    """Every tenant seen (for the filter)."""
    agents: list[str]
    """Every agent seen (for the filter)."""
    page: int
    """This page (1-based)."""
    pages: int
    """Number of pages."""
    elapsed_ms: float
    """Time spent reading and sorting, ms."""
    dead_owners: frozenset[str] = frozenset()
    """Owners of unfinished runs (of the tenant and agent filters) that hold no lease: their runs wait for
    ``recover --stale`` (marked on their rows, counted, and listed by ``status=owner_dead``)."""
    owner_dead: int = 0
    """Unfinished runs (of the tenant and agent filters) whose owner holds no lease."""


@dataclass
class RunPage:
    """Everything the run page shows."""

    run_id: str
    partition: int
    state: RunState
    timeline: list[dict[str, Any]]
    """The run's records in offset order (its event history): ``offset, seq, epoch, type, node_id, producer_id,
    at, at_ms, detail, payload`` — ``payload`` the event's fields with the JSON-valued ones (``args_json``,
    ``result_json``, ``input_json`` …) decoded, pretty-printed (None for a tombstone or an undecodable record);
    ``large`` when it is over :data:`LARGE_PAYLOAD_CHARS`."""
    epochs: list[dict[str, Any]]
    """One row per ownership epoch: ``epoch, began_with, offset, seq, owner, recovered_by, calls, at, at_ms``."""
    records: list[dict[str, Any]]
    """Execution records with their class (``committed``, ``reconciled``, ``outcome unknown`` …)."""
    pending: list[dict[str, Any]]
    """Pending approvals with any decision already waiting in the inbox for the owner to journal."""
    decided: list[dict[str, Any]]
    """Journaled approval decisions."""
    nodes: list[dict[str, Any]] = field(default_factory=list)
    """The run's graph nodes (NODE_* events; a framework run's graph): ``node_path, status, attempt, error`` in
    first-seen order."""
    run_input: str | None = None
    """The run's input (RUN_STARTED ``input_json``), pretty-printed."""
    run_output: str | None = None
    """The run's output (RUN_SUCCEEDED ``output_json``), pretty-printed."""
    behind: int = 0
    """Events of the timeline after the projection's applied offset: the header (the projection) is this many
    events behind the topic — the page says so rather than contradict itself."""
    timeline_total: int = 0
    """Events in the run's history; the page shows the newest :data:`TIMELINE_ROWS` of them."""
    records_total: int = 0
    """Execution records of the run; the page shows those whose outcome is open and the newest up to
    :data:`RECORD_ROWS`."""
    behind_note: str | None = None
    """What the page says when ``behind`` (None when the projection has reached the history's end)."""
    memory: list[Any] = field(default_factory=list)
    """The run's memory items (advisory), each with provenance."""
    memory_note: str | None = None
    """Why memory is not shown (not installed, unavailable …), when it is not."""
    control: ControlRequest | None = None
    """The operator's cancel or pause pending on the run (``ControlStore.get``): stored, not yet carried out."""
    spend: dict[str, Any] | None = None
    """The run's spend, when it reserved any (``fold_spend`` of its records, ``SpendSummary.as_dict``): settled,
    open (unknown spend: reserved, never settled), charged, by model — base units (tokens, model calls,
    ``cost_micros``: micro-units of ``Settings.spend_currency``). None: no spend records."""
    archived: str | None = None
    """The archive object's URL (``file://…`` or ``s3://…/p3-10-42.parquet``) when the run was read from the archive:
    Redis no longer holds it, it was archived past its retention (docs/guide/archive.md, decision 0056) — the page
    is its archived history and no operator control applies. None: a run of the projection."""

    @property
    def actions(self) -> list[str]:
        """The operator controls that apply to the run, in button order: ``cancel`` (not ended, not parked),
        ``pause`` (RUNNING / WAITING_APPROVAL), ``resume`` (PAUSED — or a pause pending, which a resume withdraws):
        ``runjournal.consumers.ops.control.applies``; the action checks the run again when it is asked. None for an
        archived run (finished, out of the hot stores: nothing to act on)."""
        if self.archived is not None:
            return []
        status = self.state.status.value
        pause_pending = self.control is not None and self.control.action == "pause"
        return [a for a in ("cancel", "pause", "resume")
                if applies(a, status) or (a == "resume" and pause_pending and applies("pause", status))]

    def as_dict(self) -> dict[str, Any]:
        """The page as JSON values — ``GET /api/runs/{run_id}`` — with every section the HTML page renders from the
        same fields: the header (status, epoch, tenant, agent, user, last seq, owner, applied offset, times, error,
        parked reason, the operator of the last cancel / pause / resume with why and when paused), the operator's
        request pending on the run (``pending_request``, None when there is none) and the controls that apply
        (``actions``), ``input`` / ``output`` (the recorded JSON, decoded), ``nodes``, ``behind`` and
        ``behind_note``, the timeline, epochs, records, approvals and memory (advisory), and ``archived``: the
        archive object's URL for a run read from the archive (None otherwise)."""
        st = self.state
        return {"run_id": self.run_id, "partition": self.partition, "status": st.status.value, "epoch": st.epoch,
                "tenant_id": st.tenant_id, "agent": st.agent, "user_id": st.user_id, "last_seq": st.last_seq,
                "owner": st.owner, "applied_offset": st.applied_offset, "started_at_ms": st.started_at_ms,
                "finished_at_ms": st.finished_at_ms, "error": st.error,
                "parked": st.gap_reason or st.blocked_reason or None, "requested_by": st.requested_by,
                "request_reason": st.request_reason, "paused_at_ms": st.paused_at_ms,
                "pending_request": self.control.as_dict() if self.control is not None else None,
                "actions": self.actions,
                "input": _json_value(st.input_json), "output": _json_value(st.output_json), "nodes": self.nodes,
                "behind": self.behind, "behind_note": self.behind_note, "timeline": self.timeline,
                "timeline_total": self.timeline_total, "records_total": self.records_total,
                "epochs": self.epochs, "records": self.records, "pending": self.pending, "decided": self.decided,
                "memory": [h.as_dict() for h in self.memory], "memory_note": self.memory_note, "spend": self.spend,
                "archived": self.archived}


def record_class(status: CallStatus, reconciled: Any) -> str:
    """The class shown for an execution record: ``committed``, ``reconciled (<outcome>)``, ``outcome unknown``,
    ``in flight`` (INTENDED by the current epoch) or ``failed``."""
    if status is CallStatus.COMMITTED:
        return "committed"
    if status is CallStatus.RECONCILED:
        return f"reconciled ({str(reconciled.value).lower().replace('_', ' ')})" if reconciled else "reconciled"
    if status is CallStatus.OUTCOME_UNKNOWN:
        return "outcome unknown"
    if status is CallStatus.INTENDED:
        return "in flight"
    return "failed"


class ConsoleData:
    """Reads for the console's pages (one per process; thread-safe: redis-py pools its connections).

    Args:
        settings: bootstrap, Redis URL, topic prefix, Qdrant location.
        redis_client: default from ``settings.redis_url``.
    """

    def __init__(self, settings: Settings, redis_client: redis.Redis | None = None) -> None:
        self.settings = settings
        self.redis = redis_client if redis_client is not None else redis_clients.client(settings)
        self.store = ProjectionStore(self.redis, settings.topic_prefix)
        self.inbox = ApprovalInbox(self.redis, settings.topic_prefix)
        self.controls = ControlStore(self.redis, settings.topic_prefix)
        self._partitions: int | None = None
        self._memory: Any = None

    @property
    def partitions(self) -> int:
        """The events topic's partition count (read once; fixed at creation). Raises TopicNotFoundError."""
        if self._partitions is None:
            self._partitions = events_partition_count(self.settings)
        return self._partitions

    # -- the runs list -----------------------------------------------------------------------------
    def runs(self, *, status: str | None = None, tenant: str | None = None, agent: str | None = None,
             page: int = 1, per_page: int = 100) -> RunsPage:
        """Filter, sort and page the runs index (see :class:`RunsPage`).

        Args:
            status: a RunStatus value, or ``parked`` / ``active`` / ``terminal`` / ``owner_dead`` (unfinished runs
                whose owner holds no lease); None: all.
            tenant, agent: exact matches; None: all.
            page: 1-based page; per_page: rows per page (default 100).
        """
        started = time.perf_counter()
        every = read_entries(self.redis, self.store, range(self.partitions))  # dicts: objects only for the page
        statuses = STATUS_GROUPS.get(status or "", {status} if status else None)
        scoped = [e for e in every if (tenant is None or e["t"] == tenant) and (agent is None or e["a"] == agent)]
        owned = [e for e in scoped if e["o"] and rank(e) in (1, 2, 3) and e["s"] != RunStatus.PAUSED.value]
        dead = self._dead_owners({e["o"] for e in owned})  # a paused run is held for nobody: never "owner dead"
        orphaned = [e for e in owned if e["o"] in dead]
        if status == "owner_dead":
            rows = orphaned
        else:
            rows = [e for e in scoped if statuses is None or e["s"] in statuses]
        rows.sort(key=lambda e: (rank(e), -(e["m"] or 0), e["id"]))
        pages = max(1, -(-len(rows) // per_page))
        page = min(max(1, page), pages)
        return RunsPage(rows=[RunSummary.from_dict(e["pt"], e) for e in rows[(page - 1) * per_page:page * per_page]],
                        total=len(rows), runs_in_projection=len(every),
                        by_status=dict(sorted(Counter(e["s"] for e in scoped).items())),
                        tenants=sorted({e["t"] for e in every if e["t"]}),
                        agents=sorted({e["a"] for e in every if e["a"]}), page=page, pages=pages,
                        elapsed_ms=(time.perf_counter() - started) * 1000, dead_owners=frozenset(dead),
                        owner_dead=len(orphaned))

    def _dead_owners(self, owners: set[str]) -> set[str]:
        """Those of ``owners`` that hold no lease (one pipelined EXISTS per owner, each in its own slot)."""
        if not owners:
            return set()
        keys = RedisKeys(self.settings.topic_prefix)
        pipe = self.redis.pipeline(transaction=False)
        ordered = sorted(owners)
        for owner in ordered:
            pipe.exists(keys.lease(owner))
        return {o for o, alive in zip(ordered, pipe.execute(), strict=True) if not alive}

    # -- one run -----------------------------------------------------------------------------------
    def run(self, run_id: str, *, with_memory: bool = True) -> RunPage | None:
        """The run page of ``run_id``: from the projection, else from the archive (:meth:`archived`: a run archived
        past its retention, ``RunPage.archived`` its object's URL); None when neither holds it.

        Raises:
            ObjectStoreError: the projection has no state and the archive cannot be read (see :meth:`archived`).
        """
        partition = partition_for(run_id, self.partitions)
        state = self.store.get(partition, run_id)
        if state is None:
            page = self.archived(run_id)
            if page is not None and with_memory and page.state is not None:
                page.memory, page.memory_note = self._memory_items(page.state)
            return page
        rows = read_run_events(self.settings, run_id, partition=partition)  # the count read once per console
        page = run_page(run_id, partition, state, rows, inbox_decision=self.inbox.decision,
                        control=self.controls.get(run_id))
        if with_memory:
            page.memory, page.memory_note = self._memory_items(state)
        return page

    def archived(self, run_id: str) -> RunPage | None:
        """The run page of an archived run, read from its archive object (``replay_archived``: the manifest and the
        Parquet rows, checked against each other; docs/guide/archive.md § Read an archived run), with
        ``RunPage.archived`` the object's URL; None when the archive does not hold the run (or the ``archive`` extra
        is not installed: nothing can have been archived by this install). Pending approvals, inbox decisions and
        operator requests are Redis's and gone with the run: none are shown.

        Raises:
            ObjectStoreError: ``RUNJOURNAL_ARCHIVE_URL`` cannot be used, or the archive cannot be read (its backend
                unreachable, an object unreadable) — named, never taken for an archive without the run.
            ArchiveVerifyError: the object does not match its manifest (rows, digest).
        """
        try:
            from runjournal.consumers.archive.store import replay_archived
        except ImportError:
            return None
        try:
            found = replay_archived(self.settings, run_id)
        except RunjournalError:
            raise
        except Exception as exc:  # noqa: BLE001 - any backend's failure (s3fs, botocore, pyarrow), named
            raise ObjectStoreError(f"the archive at {self.settings.effective_archive_url} could not be read for run "
                                   f"{run_id}: {type(exc).__name__}: {exc}") from exc
        if found is None:
            return None
        replayed, url = found
        if replayed.state is None:
            return None
        rows = [{**row, "event": event} for row, event in zip(replayed.timeline, replayed.events, strict=True)]
        page = run_page(run_id, replayed.partition, replayed.state, rows, inbox_decision=lambda _run, _call: None)
        page.archived = url
        return page

    def _memory_items(self, state: RunState) -> tuple[list[Any], str | None]:
        """The run's memory items through the Qdrant directory's owner (or the server); never a failure."""
        if not state.tenant_id:
            return [], "the run has no tenant: memory is always read within one"
        try:
            from runjournal.consumers.cognition import open_memory_reader
            from runjournal.stores import Scope
        except ImportError:
            return [], "memory is not installed (pip install 'runjournal[memory]')"
        if self._memory is None:
            self._memory = open_memory_reader(self.settings, wait_s=2.0, keys=False)  # holds no key: "encrypted"
        try:
            return self._memory.run_items(Scope(state.tenant_id), state.run_id), None
        except Exception as exc:  # noqa: BLE001 - advisory: the page shows the facts either way
            return [], f"memory unavailable: {type(exc).__name__}: {exc}"

    def close(self) -> None:
        """Release the memory reader and the Redis pool."""
        if self._memory is not None:
            self._memory.close()
        self.redis.close()


def shown(value: Any) -> Any:
    """A stored content value as the console shows it (decision 0059): an encrypted token as ``encrypted`` (the
    console holds no key), escaped plain text unescaped, anything else as it is."""
    if not isinstance(value, str) or not value.startswith(PREFIX):
        return value
    return ENCRYPTED if is_encrypted(value) else decode_plain(value)


def _short(value: Any, limit: int = 120) -> str:
    """``value`` on one line, at most ``limit`` characters (the full text is in the row's payload)."""
    text = " ".join(str(shown(value)).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def run_page(run_id: str, partition: int, state: RunState, rows: list[dict[str, Any]], *,
             inbox_decision: Callable[[str, str], Any], control: ControlRequest | None = None) -> RunPage:
    """The run page of ``run_id`` from its projected ``state`` and its records ``rows`` (``read_run_events``'s
    shape, offset order); ``inbox_decision(run_id, call_id)`` gives a decision waiting in the approval inbox (None:
    none); ``control`` is the operator's request pending on the run (None: none). A pure function of its inputs
    (no memory: :meth:`ConsoleData.run` adds it)."""
    if state.error is not None:  # the run's error may be encrypted content (RUN_FAILED error)
        state = replace(state, error=shown(state.error))
    decided = [{"call_id": cid, "decision": d.decision.value, "approver": d.approver, "note": d.note,
                "at_ms": d.decided_at_ms, "scope": _approval_scope(cid, d.scope_attempt),
                "consumed_offset": d.consumed_offset} for cid, d in sorted(state.approvals.items())]
    timeline = [_timeline_row(r) for r in rows[-TIMELINE_ROWS:]]  # a long run's page: its newest events
    behind = sum(1 for r in rows if r["offset"] > state.applied_offset)
    note = None if not behind else (
        f"The projection is {behind} event(s) behind the topic: the run's state shown is as of offset "
        f"{state.applied_offset}, its event history reaches offset {timeline[-1]['offset']}. Refresh in a moment.")
    return RunPage(run_id=run_id, partition=partition, state=state, timeline=timeline, epochs=_epochs(rows),
                   records=_records(state), pending=_pending(state, rows, inbox_decision), decided=decided,
                   nodes=_nodes(state), run_input=_pretty_json(state.input_json),
                   run_output=_pretty_json(state.output_json), behind=behind, behind_note=note, control=control,
                   timeline_total=len(rows), records_total=len(state.records), spend=_spend(state))


def _spend(state: RunState) -> dict[str, Any] | None:
    """The run's spend (docs/guide/spend.md § See it), or None when no record is a reserve or a settle."""
    records = [r for r in state.records.values() if r.tool in (RESERVE_TOOL, SETTLE_TOOL)]
    return fold_spend(records).as_dict() if records else None


def _pending(state: RunState, rows: list[dict[str, Any]],
             inbox_decision: Callable[[str, str], Any]) -> list[dict[str, Any]]:
    """Pending approvals, each with the call's arguments when the journal holds them — the request's own
    (``args_json``, envelope v4), else the latest TOOL_CALL_INTENDED of the call it is bound to (an unknown
    outcome's re-run) — and the decision waiting in the inbox."""
    intents: dict[str, str | None] = {}
    for row in rows:
        event = row.get("event")
        if event is not None and row["type"] == "TOOL_CALL_INTENDED":
            intents[str(event.payload.get("call_id"))] = event.payload.get("args_json")
    out = []
    for call_id, p in sorted(state.pending_approvals.items()):
        key = _approval_call(call_id, p.scope_call_id)
        out.append({"call_id": call_id, "reason": p.reason, "tool": p.tool, "requested_at_ms": p.requested_at_ms,
                    "scope": _approval_scope(call_id, p.scope_attempt),
                    "settleable": _settleable(state, call_id, p.scope_call_id),
                    "args": _pretty_json(p.args_json if p.args_json is not None else intents.get(key)),
                    "inbox": inbox_decision(state.run_id, call_id)})
    return out


def _detail(event: Any) -> str:
    """One line saying what the event did (its payload in full is a click away on the page)."""
    payload = event.payload
    kind = str(event.type)

    def g(name: str) -> Any:
        return shown(payload.get(name))
    if kind == "TOOL_CALL_INTENDED":
        return " ".join(x for x in (g("call_id"), g("tool") or "", _short(g("args_json") or "", 100)) if x)
    if kind.startswith("TOOL_CALL_"):
        extra = g("outcome") or g("error") or (_short(g("result_json"), 80) if g("result_json") else "")
        return " ".join(str(x) for x in (g("call_id"), g("tool") or "", extra) if x)
    if kind == "APPROVAL_REQUESTED":
        return " ".join(str(x) for x in (g("call_id"), g("tool") or "", g("reason") or "") if x)
    if kind.startswith("APPROVAL_"):
        return " ".join(str(x) for x in (g("call_id"), g("approver") or "", g("comment") or g("reason") or "") if x)
    if kind == "RUN_RESUMED":
        return f"epoch {g('previous_epoch')}→{event.epoch}, assigned to {g('assigned_to')}"
    if kind.startswith("NODE_"):
        return " ".join(str(x) for x in (g("node_path") or "", g("error") or "") if x)
    if kind == "RUN_STARTED":
        return f"{g('agent')}: {_short(g('input_json') or '', 100)}"
    if kind == "RUN_SUCCEEDED":
        return _short(g("output_json") or "", 120)
    if kind in ("RUN_FAILED", "RUN_CANCELLED"):
        return _short(g("error") or g("reason") or "", 120)
    if kind == "MESSAGE":
        return f"{g('role')}: {_short(g('content') or '', 110)}"
    if kind == "USER_CORRECTION":
        return f"{g('subject')}: {_short(g('text') or '', 110)}"
    return ""


#: A payload longer than this (characters of its pretty JSON) is shown collapsed, with its size.
LARGE_PAYLOAD_CHARS = 2_000
#: At most this many characters of one payload are sent to the browser (a long run's page stays small); the rest is
#: a line naming ``runjournal inspect RUN_ID --json``, which shows it all.
MAX_PAYLOAD_CHARS = 32_000


def _pretty_json(text: str | None) -> str | None:
    """JSON text pretty-printed (keys as written); text that is not JSON as it is; None stays None."""
    if text is None:
        return None
    text = shown(text)
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def _json_value(text: str | None) -> Any:
    """Recorded JSON text decoded (text that is not JSON as it is; None stays None)."""
    if text is None:
        return None
    text = shown(text)
    try:
        return json.loads(text)
    except ValueError:
        return text


def _payload(event: Any) -> dict[str, Any]:
    """The event's payload with each JSON-valued field (``*_json``) decoded: what the event history shows."""
    out: dict[str, Any] = {}
    for name, value in (event.payload or {}).items():
        value = shown(value)
        if name.endswith("_json") and isinstance(value, str) and value != ENCRYPTED:
            try:
                out[name.removesuffix("_json")] = json.loads(value)
                continue
            except ValueError:
                pass
        out[name] = value
    return out


def _timeline_row(row: dict[str, Any]) -> dict[str, Any]:
    event = row.get("event")
    out = {"offset": row["offset"], "seq": row["seq"], "epoch": row["epoch"], "type": row["type"],
           "node_id": row.get("node_id"), "producer_id": None, "at": None, "at_ms": None,
           "detail": row.get("error", ""), "payload": None, "large": False}
    if event is not None:
        payload = json.dumps(_payload(event), indent=2, ensure_ascii=False, default=str)
        size = len(payload)
        if size > MAX_PAYLOAD_CHARS:
            payload = (f"{payload[:MAX_PAYLOAD_CHARS]}\n… {size - MAX_PAYLOAD_CHARS} more characters: "
                       f"`runjournal inspect {event.run_id} --json` shows the whole event")
        out.update(producer_id=event.producer_id, at=event.occurred_at.isoformat(timespec="milliseconds"),
                   at_ms=int(event.occurred_at.timestamp() * 1000), detail=_detail(event), payload=payload,
                   large=size > LARGE_PAYLOAD_CHARS, size=size)
    return out


def _nodes(state: RunState) -> list[dict[str, Any]]:
    return [{"node_path": path, "status": n.status.value, "attempt": n.attempt, "error": shown(n.error)}
            for path, n in state.nodes.items()]


def _epochs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        event = row.get("event")
        if event is None or str(event.type) not in ("RUN_STARTED", "RUN_RESUMED"):
            continue
        entry = {"epoch": event.epoch, "began_with": str(event.type), "offset": row["offset"], "seq": event.seq,
                 "owner": event.producer_id, "recovered_by": None, "calls": {},
                 "at": event.occurred_at.isoformat(timespec="milliseconds"),
                 "at_ms": int(event.occurred_at.timestamp() * 1000)}
        if str(event.type) == "RUN_RESUMED":
            try:
                plan = json.loads(event.payload.get("plan_json") or "{}")
            except ValueError:
                plan = {}
            entry.update(owner=event.payload.get("assigned_to"), recovered_by=event.payload.get("recovered_by"),
                         calls=plan.get("calls", {}), previous_epoch=event.payload.get("previous_epoch"))
        out.append(entry)
    return out


TIMELINE_ROWS = 1_000
"""Newest events a run page shows (a run of any length: the page's cost stays bounded; ``runjournal inspect RUN_ID
--json`` and ``/api/runs/{id}`` list the same; README § Limits)."""
RECORD_ROWS = 500
"""Execution records a run page shows beside every open one (INTENDED, OUTCOME_UNKNOWN, FAILED): the newest."""
_OPEN = frozenset({"INTENDED", "OUTCOME_UNKNOWN", "FAILED"})


def _records(state: RunState) -> list[dict[str, Any]]:
    """The records a page shows, in intent order: every open one, and the newest :data:`RECORD_ROWS` of the rest."""
    ordered = sorted(state.records.items(), key=lambda kv: (kv[1].intended_offset or -1, kv[0]))
    if len(ordered) > RECORD_ROWS:
        newest = {cid for cid, _ in ordered[-RECORD_ROWS:]}
        ordered = [(cid, rec) for cid, rec in ordered if cid in newest or rec.status.value in _OPEN]
    out = []
    for call_id, rec in ordered:
        out.append({"call_id": call_id, "tool": rec.tool, "class": record_class(rec.status, rec.reconciled_outcome),
                    "status": rec.status.value, "attempts": rec.attempts, "epoch": rec.epoch,
                    "idempotency_key": rec.idempotency_key, "intended_offset": rec.intended_offset,
                    "outcome_offset": rec.outcome_offset, "zombie": rec.zombie, "error": shown(rec.error)})
    return out


def _approval_scope(call_id: str, attempt: int | None = None) -> str:
    """What an approval authorises, for the run page: one re-run of an attempt — as its APPROVAL_REQUESTED recorded
    it (``scope_attempt``, envelope v3), else as its id says (``<key>@<n>``) — or a step / call id
    (docs/design/decisions/0044-approvals-bind-to-one-attempt.md)."""
    if attempt is not None:
        return f"one re-run of attempt {attempt}"
    attempt = approval_scope(call_id)[1]
    return f"one re-run of attempt {attempt}" if attempt is not None else "this call id"


def _approval_call(call_id: str, scope_call_id: str | None) -> str:
    """The call an approval is about: its recorded scope (envelope v3), else the key of a ``<key>@<n>`` id, else
    the approval's own id (an approval asked before the call, under the call's id). The id's form is the producer's
    (``runjournal.producers.handle.approval_scope``), not parsed again here."""
    return scope_call_id or approval_scope(call_id)[0] or call_id


def _settleable(state: RunState, call_id: str, scope_call_id: str | None) -> bool:
    """Whether an operator may settle approval ``call_id`` by hand ("it happened"): it is bound to one call whose
    outcome is unknown (``runjournal.consumers.ops.approvals.submit_settlement`` checks the same)."""
    key = scope_call_id or approval_scope(call_id)[0]
    record = state.records.get(key) if key else None
    return record is not None and record.status in (CallStatus.INTENDED, CallStatus.OUTCOME_UNKNOWN)

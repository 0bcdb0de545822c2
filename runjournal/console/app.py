"""The console's Starlette application: server-rendered Jinja2 pages, no build step, no CDN; one script, the run
page's live stream panel (``static/stream.js``: the page works without it).

Routes:

* ``GET /runs`` — the runs list (``?status=&tenant=&agent=&page=``; ``status=owner_dead``: unfinished runs whose owner
  holds no lease), most urgent first; ``GET /api/runs`` as JSON.
* ``GET /runs/{run_id}`` — input and output, graph nodes, timeline (seq, epoch, offset), epochs, execution records by
  class, approvals, memory, and a note when the projection is behind the history; ``GET /api/runs/{run_id}`` the
  same page as JSON (``RunPage.as_dict``). A run Redis no longer holds is read from the archive (a run archived past
  its retention: docs/guide/archive.md): the page says where it lives (``archived — <object URL>``, ``"archived"`` in
  the JSON) and offers no control; an archive that cannot be read is a 503 naming ``ObjectStoreError``.
  ``GET /search?run_id=ID`` finds a run of either.
* ``POST /runs/{run_id}/approvals/{call_id}`` — ``decision=grant|deny|executed`` (+ ``comment``: a grant's comment,
  a denial's reason — or ``reason`` —, ``result`` for ``executed``, ``csrf``): operators only
  (``runjournal.console.auth``); 403 on a console started without a token, 401 without valid credentials.
* ``POST /runs/{run_id}/cancel``, ``/pause``, ``/resume`` — ``reason``, ``csrf``: the operator controls of
  ``runjournal.consumers.ops.control.Operator`` (the one implementation:
  docs/design/decisions/0047-operator-controls.md), recorded with the operator's name as ``requested_by``, waiting
  up to ``ConsoleConfig.control_wait_s`` for the action to be carried out; then 303 back to the run page with the
  outcome (a browser), or the ``ControlResult`` as JSON. Auth and CSRF as the decisions; 409 when the action does
  not apply to the run (nothing stored).
* ``GET /streams/{run_id}`` — the run's durable stream (``run.stream()``, decision 0055) as Server-Sent Events
  (``text/event-stream``): each record an event ``id: <offset>``, ``event: chunk|end|gap``, ``data: <JSON>``;
  ``Last-Event-ID`` (or ``?from=<offset>``) resumes after that offset with the reader's epoch fence restored;
  a ``: keep-alive`` comment every ``ConsoleConfig.stream_heartbeat_s`` of silence. A read route (no sign-in, as
  the run page). Not under ``/runs/{run_id}/``: a run id may end in ``/stream``. The run page's stream panel reads
  it with ``EventSource`` (``static/stream.js``, the console's one script).
* ``GET /lag`` — projector, memory and recovery lag from the services' ``/metrics`` and the recovery backlog.
* ``GET /counts``, ``GET /api/counts`` — ``runjournal query``'s example queries (unknown outcomes by tool, reconciles
  by provider, effects per tenant per day) over the archive and the live projection: the same counts as the CLI;
  needs the ``archive`` extra (duckdb), else the error page names it.
* ``GET|POST /login``, ``POST /logout`` — operator sign-in (only with a token).
* ``GET /metrics`` — the console's own Prometheus metrics; ``GET /healthz``; ``/static`` — the stylesheet.

A run id in a link is percent-encoded as one path segment (:func:`path_segment`: a run id may hold ``/``, ``?``,
``#``, spaces) and the run routes take the rest of the path as the id; ids from a URL are checked with
``runjournal.core.ids`` ``check_lookup`` (400 when not text) — any id a run was started with stays reachable.

Every page is answered with ``Content-Security-Policy: default-src 'self'`` and ``X-Frame-Options: DENY`` (no
third-party origin, no framing of the approve buttons).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
import redis
from confluent_kafka import KafkaException
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Match, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from runjournal.console.auth import COOKIE, NAME_COOKIE, OperatorAuth
from runjournal.console.lag import LagBoard
from runjournal.console.metrics import ConsoleMetrics
from runjournal.console.queries import STATUS_GROUPS, ConsoleData
from runjournal.consumers.ops.approvals import ApprovalRefusedError, submit_decision, submit_settlement
from runjournal.consumers.ops.control import ControlRefusedError, ControlResult, Operator
from runjournal.consumers.streams import StreamReader
from runjournal.core.errors import RunjournalError
from runjournal.core.ids import CALL_ID, RUN_ID, InvalidIdError
from runjournal.core.settings import Settings
from runjournal.model.reducer import RunStatus
from runjournal.schemas.keys import partition_for

__all__ = ["ConsoleConfig", "build_app"]

_HERE = Path(__file__).parent
#: What a page answers with 503 and the error named (topic missing, Redis or the broker unreachable).
_UNAVAILABLE = (RunjournalError, redis.RedisError, KafkaException, OSError)
#: The operator controls' routes; what the run page says after one (``?control=ACTION&outcome=OUTCOME`` after a POST:
#: only these fixed sentences reach the page from a URL, never free text).
CONTROL_ACTIONS = ("cancel", "pause", "resume")
_CARRIED_OUT = {"cancel": "cancelled", "pause": "paused", "resume": "resumed"}
_OUTCOMES = {
    "cancelled": "the run ended CANCELLED.",
    "paused": "the run is PAUSED, held for nobody until an operator resumes it.",
    "resumed": "the run was handed to a live instance under a new epoch and goes on.",
    "withdrawn": "the pause had not been carried out yet; it is withdrawn and the run goes on.",
    "requested": "requested, not carried out yet — the request pending on the run (below) is carried out by the "
                 "run's owner at its next step (a tool call, a node, an approval wait), or by the recovery service's "
                 "next sweep when nobody live owns the run (a resume the console may not carry out itself: always "
                 "the sweep's).",
    "no_live_instance": "no live instance to take the run: the next recovery pass hands it over.",
    "succeeded": "not carried out: the run ended SUCCEEDED first.",
    "failed": "not carried out: the run ended FAILED first.",
}
_OUTCOME_WORD = re.compile(r"[a-z_]{1,40}")
_HEADERS = {"Content-Security-Policy": "default-src 'self'; form-action 'self'; frame-ancestors 'none'",
            "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin"}


@dataclass(frozen=True)
class ConsoleConfig:
    """How ``runjournal console`` was started."""

    settings: Settings
    """Bootstrap, Redis, topic prefix, Qdrant."""
    operator_token: str | None = None
    """Approve, deny, cancel, pause and resume are possible only with this token (None: a read-only console)."""
    scrape_urls: tuple[str, ...] = ()
    """``/metrics`` URLs to read lag from besides the announced ones."""
    per_page: int = 100
    """Rows per page of the runs list."""
    stream_heartbeat_s: float = 10.0
    """Seconds of silence before ``GET /streams/{run_id}`` sends a keep-alive comment."""
    control_wait_s: float = 5.0
    """How long a cancel, pause or resume from the console waits to be carried out before the page answers (s); a
    request not carried out by then stands (the page shows it pending)."""


def _ms(value: int | None) -> str:
    if not value:
        return ""
    return datetime.fromtimestamp(value / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _spend_amount(dim: str, value: int, currency: str) -> str:
    """A spend amount for people: ``cost_micros`` in currency units with the code (``3450`` → ``0.003450 USD``),
    tokens and model calls as the integers they are."""
    if dim != "cost_micros":
        return str(value)
    from decimal import Decimal

    return f"{Decimal(int(value)).scaleb(-6):f} {currency}"


def _num(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.0f}" if float(value).is_integer() or abs(value) >= 100 else f"{value:.2f}"


class _Timing(BaseHTTPMiddleware):
    """Request duration by route template (``runjournal_console_request_duration_seconds``) and security headers."""

    def __init__(self, app: Any, metrics: ConsoleMetrics, routes: list[Any]) -> None:
        super().__init__(app)
        self.metrics = metrics
        self.routes = routes

    async def dispatch(self, request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        started = time.perf_counter()
        response = await call_next(request)
        template = next((r.path for r in self.routes if r.matches(request.scope)[0] is Match.FULL), "other")
        self.metrics.requests.labels(template, request.method, str(response.status_code)).observe(
            time.perf_counter() - started)
        for key, value in _HEADERS.items():
            response.headers.setdefault(key, value)
        return response


class _Console:
    """The request handlers (one instance per app)."""

    def __init__(self, config: ConsoleConfig, data: ConsoleData, metrics: ConsoleMetrics) -> None:
        self.config = config
        self.data = data
        self.metrics = metrics
        self.auth = OperatorAuth(config.operator_token)
        self.lag = LagBoard(data.redis, config.settings.topic_prefix, lambda: data.partitions,
                            extra_urls=config.scrape_urls,
                            on_error=lambda service: metrics.scrape_errors.labels(service).inc())
        self.templates = Jinja2Templates(env=jinja2.Environment(
            loader=jinja2.FileSystemLoader(_HERE / "templates"), autoescape=True))  # every value HTML-escaped
        self.templates.env.filters["ms"] = _ms
        self.templates.env.filters["segment"] = path_segment  # an id inside a link: /runs/{{ r.run_id|segment }}
        self.templates.env.globals["fmt_num"] = _num
        self.templates.env.globals["fmt_lag"] = lambda v: "—" if v is None else f"{v:.2f} s"
        self.templates.env.globals["prefix"] = config.settings.topic_prefix
        self.templates.env.globals["event_budget"] = config.settings.run_events_warn  # README § Limits
        currency = config.settings.spend_currency
        self.templates.env.globals["spend_amount"] = lambda dim, value: _spend_amount(dim, value, currency)

    def _page(self, request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> Response:
        operator = self.auth.is_operator(request)
        base = {"operator": operator, "auth_enabled": self.auth.enabled,
                "csrf": self.auth.csrf() if operator else None, "approver": self.auth.approver(request)}
        return self.templates.TemplateResponse(request, name, {**base, **context}, status_code=status_code)

    def _error(self, request: Request, exc: Exception | str, status_code: int = 503, kind: str = "Error") -> Response:
        """The error page; under ``/api/`` JSON ``{"error": <class or kind>, "message": <text>}`` (same status)."""
        if request.url.path.startswith("/api/"):
            name, text = (type(exc).__name__, str(exc)) if isinstance(exc, Exception) else (kind, exc)
            return JSONResponse({"error": name, "message": text}, status_code=status_code)
        shown = f"{type(exc).__name__}: {exc}" if isinstance(exc, Exception) else exc
        return self._page(request, "error.html", {"error": shown}, status_code)

    # -- pages -----------------------------------------------------------------------------------
    def runs(self, request: Request) -> Response:
        q = request.query_params
        filters = {k: q.get(k) or None for k in ("status", "tenant", "agent")}
        number = q.get("page") or "1"
        if not number.isdecimal():  # a bad query is the client's: 400, not a 503 naming a ValueError
            return self._error(request, f"page must be a positive whole number, not {number!r}", 400,
                               kind="BadRequest")
        try:
            page = self.data.runs(**filters, page=int(number), per_page=self.config.per_page)
        except _UNAVAILABLE as exc:
            return self._error(request, exc)
        self.metrics.runs_listed.set(page.runs_in_projection)
        if request.url.path.startswith("/api/"):
            return JSONResponse({"runs": [{"run_id": r.run_id, **{k: getattr(r, k) for k in r.__slots__}}
                                          for r in page.rows], "total": page.total, "page": page.page,
                                 "pages": page.pages, "by_status": page.by_status, "owner_dead": page.owner_dead,
                                 "dead_owners": sorted(page.dead_owners)})
        link = {k: v for k, v in filters.items() if v}
        return self._page(request, "runs.html", {
            "page": page, "filters": filters,
            "statuses": [*STATUS_GROUPS, "owner_dead", *(s.value for s in RunStatus)],
            "lag": self.lag.view(), "query": lambda **kw: urlencode({**link, **kw})})

    def run(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            RUN_ID.check_lookup(run_id)  # any id a run was ever started with, rules or not
        except InvalidIdError as exc:
            return self._error(request, exc, 400, kind="BadRequest")
        try:
            page = self.data.run(run_id)
        except _UNAVAILABLE as exc:
            return self._error(request, exc)
        if page is None:
            return self._error(request, f"no state for run {run_id} in the projection of prefix "
                                        f"{self.config.settings.topic_prefix} (is the projector running?) nor in "
                                        f"the archive ({self.config.settings.effective_archive_url})", 404,
                               kind="RunNotFound")
        if request.url.path.startswith("/api/"):  # the page's own fields (RunPage.as_dict): JSON and HTML agree
            return JSONResponse(page.as_dict())
        return self._page(request, "run.html", {"run": page, "decided_now": request.query_params.get("decided"),
                                                "control_notice": _control_notice(request.query_params)})

    async def stream(self, request: Request) -> Response:
        """``GET /streams/{run_id}``: the run's stream as Server-Sent Events (module docstring)."""
        run_id = request.path_params["run_id"]
        try:
            RUN_ID.check_lookup(run_id)
        except InvalidIdError as exc:
            return PlainTextResponse(f"refused: {exc}", status_code=400)
        last = request.headers.get("last-event-id") or request.query_params.get("from")
        if last is not None and not last.strip().lstrip("-").isdecimal():
            return PlainTextResponse("Last-Event-ID is a stream offset (a whole number)", status_code=400)
        start = None if last is None else max(0, int(last) + (1 if "last-event-id" in request.headers else 0))
        try:
            # the console holds no key (decision 0059): a sealed chunk is shown as "encrypted", never its token
            reader = await run_in_threadpool(lambda: StreamReader(self.config.settings, run_id, start, content=None))
        except (LookupError, *_UNAVAILABLE) as exc:
            return PlainTextResponse(f"stream unavailable: {type(exc).__name__}: {exc}", status_code=503)
        return StreamingResponse(self._events(request, reader), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def _events(self, request: Request, reader: StreamReader) -> AsyncIterator[str]:
        """The SSE body: records as events, a keep-alive comment after each heartbeat of silence; stops when the
        client goes."""
        try:
            yield "retry: 1000\n\n"
            quiet_since = time.monotonic()
            while not await request.is_disconnected():
                batch = await run_in_threadpool(reader.poll, 0.5)
                for event in batch:
                    data = json.dumps(event.as_dict(), ensure_ascii=False)
                    yield f"id: {event.offset}\nevent: {event.kind}\ndata: {data}\n\n"
                if batch:
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since >= self.config.stream_heartbeat_s:
                    quiet_since = time.monotonic()
                    yield ": keep-alive\n\n"
        finally:
            await run_in_threadpool(reader.close)

    def search(self, request: Request) -> Response:
        """``/search?run_id=ID``: 303 to the run's page (any id, ``/`` and ``%`` too: one escaped path segment);
        a missing or malformed id is a 400 naming the rule."""
        run_id = request.query_params.get("run_id", "")
        if not run_id:
            return self._error(request, "give a run id: /search?run_id=ID", 400, kind="BadRequest")
        try:
            RUN_ID.check_lookup(run_id)
        except InvalidIdError as exc:
            return self._error(request, exc, 400, kind="BadRequest")
        return RedirectResponse(f"/runs/{path_segment(run_id)}", status_code=303)

    def lag_page(self, request: Request) -> Response:
        return self._page(request, "lag.html", {"lag": self.lag.view()})

    async def counts(self, request: Request) -> Response:
        """The documented example queries (``runjournal query``'s ``EXAMPLES``) over the archive and the live
        projection: the counts ``runjournal query`` prints. ``/api/counts``: ``{title: {"columns", "rows"}}``."""
        try:
            from runjournal.consumers.archive.sql import EXAMPLES, query

            tables = {}
            for title, sql in EXAMPLES.items():
                columns, rows = await run_in_threadpool(query, self.config.settings, sql, redis=self.data.redis)
                tables[title] = {"sql": sql, "columns": columns, "rows": [[_cell(v) for v in r] for r in rows]}
        except (ImportError, RunjournalError, redis.RedisError, KafkaException) as exc:
            return self._error(request, exc)
        if request.url.path.startswith("/api/"):
            return JSONResponse({t: {"columns": v["columns"], "rows": v["rows"]} for t, v in tables.items()})
        return self._page(request, "counts.html", {"tables": tables})

    # -- decisions -------------------------------------------------------------------------------
    async def decide(self, request: Request) -> Response:
        run_id, call_id = request.path_params["run_id"], request.path_params["call_id"]
        try:
            RUN_ID.check_lookup(run_id)
            CALL_ID.check_lookup(call_id)
        except InvalidIdError as exc:
            return PlainTextResponse(f"refused: {exc}", status_code=400)
        form = await request.form()
        decision = str(form.get("decision", ""))
        if not self.auth.enabled:
            self.metrics.decisions.labels(decision or "none", "unauthorized").inc()
            return PlainTextResponse("approve and deny are disabled: this console was started without an operator "
                                     "token (RUNJOURNAL_CONSOLE_OPERATOR_TOKEN)", status_code=403)
        if not self.auth.is_operator(request) or not self.auth.csrf_ok(request, _text(form.get("csrf"))):
            self.metrics.decisions.labels(decision or "none", "unauthorized").inc()
            return PlainTextResponse("operator credentials required: sign in with the operator token",
                                     status_code=401)
        if decision not in ("grant", "deny", "executed"):
            return PlainTextResponse("decision must be grant (run the call again), deny (never) or executed (it "
                                     "happened: record the result)", status_code=400)
        note = _text(form.get("reason")) or _text(form.get("comment")) or None
        try:
            if decision == "executed":  # settled by hand: the result is JSON the operator typed
                try:
                    result = _json_value(_text(form.get("result")) or "null")
                except ValueError as exc:  # NonCanonicalValueError included (a number past 64 bits)
                    return PlainTextResponse(f"refused: the result is not JSON ({exc})", status_code=400)
                await run_in_threadpool(submit_settlement, self.config.settings, run_id, call_id, result=result,
                                        approver=self.auth.approver(request), comment=note,
                                        redis_client=self.data.redis)
            else:  # the one text field is a grant's comment, a denial's reason (as approve --comment, deny --reason)
                await run_in_threadpool(submit_decision, self.config.settings, run_id, call_id,
                                        granted=decision == "grant", approver=self.auth.approver(request),
                                        **({"comment": note} if decision == "grant" else {"reason": note}),
                                        redis_client=self.data.redis)
        except ApprovalRefusedError as exc:
            self.metrics.decisions.labels(decision, "refused").inc()
            return PlainTextResponse(f"refused: {exc}", status_code=409)
        except _UNAVAILABLE as exc:
            self.metrics.decisions.labels(decision, "unavailable").inc()
            return PlainTextResponse(f"not written: {type(exc).__name__}: {exc}", status_code=503)
        self.metrics.decisions.labels(decision, "written").inc()
        if "text/html" not in request.headers.get("accept", ""):
            return JSONResponse({"run_id": run_id, "call_id": call_id, "decision": decision, "written": True})
        return RedirectResponse(f"/runs/{path_segment(run_id)}?{urlencode({'decided': call_id})}", status_code=303)

    # -- operator controls -------------------------------------------------------------------------
    async def cancel(self, request: Request) -> Response:
        """``POST /runs/{run_id}/cancel``: :meth:`Operator.cancel` (:meth:`control`)."""
        return await self.control(request, "cancel")

    async def pause(self, request: Request) -> Response:
        """``POST /runs/{run_id}/pause``: :meth:`Operator.pause` (:meth:`control`)."""
        return await self.control(request, "pause")

    async def resume(self, request: Request) -> Response:
        """``POST /runs/{run_id}/resume``: :meth:`Operator.resume` (:meth:`control`)."""
        return await self.control(request, "resume")

    async def control(self, request: Request, action: str) -> Response:
        """An operator's ``action`` (``cancel`` / ``pause`` / ``resume``) on the run, through ``Operator`` — form
        fields ``reason`` and ``csrf``, checked exactly as a decision's: 403 on a console without a token, 401
        without valid credentials or CSRF field, 400 for an id that is not text, 409 when the action does not apply
        (``ControlRefusedError``: nothing stored), 503 when a dependency is away. Otherwise 303 to the run page with
        the outcome (``Accept: text/html``) or the ``ControlResult`` as JSON."""
        run_id = request.path_params["run_id"]
        try:
            RUN_ID.check_lookup(run_id)
        except InvalidIdError as exc:
            return PlainTextResponse(f"refused: {exc}", status_code=400)
        form = await request.form()
        if not self.auth.enabled:
            self.metrics.controls.labels(action, "unauthorized").inc()
            return PlainTextResponse("cancel, pause and resume are disabled: this console was started without an "
                                     "operator token (RUNJOURNAL_CONSOLE_OPERATOR_TOKEN)", status_code=403)
        if not self.auth.is_operator(request) or not self.auth.csrf_ok(request, _text(form.get("csrf"))):
            self.metrics.controls.labels(action, "unauthorized").inc()
            return PlainTextResponse("operator credentials required: sign in with the operator token",
                                     status_code=401)
        reason = (_text(form.get("reason")) or "").strip()[:500]
        html = "text/html" in request.headers.get("accept", "")
        try:
            result = await run_in_threadpool(self._act, action, run_id, reason, self.auth.approver(request))
        except ControlRefusedError as exc:
            self.metrics.controls.labels(action, "refused").inc()
            if html:
                return await run_in_threadpool(self._refused, request, run_id, action, exc)
            return PlainTextResponse(f"refused: {exc}", status_code=409)
        except _UNAVAILABLE as exc:
            self.metrics.controls.labels(action, "unavailable").inc()
            return PlainTextResponse(f"not done: {type(exc).__name__}: {exc}", status_code=503)
        self.metrics.controls.labels(action, result.outcome).inc()
        if not html:
            return JSONResponse(result.as_dict())
        notice = urlencode({"control": action, "outcome": result.outcome})
        return RedirectResponse(f"/runs/{path_segment(run_id)}?{notice}", status_code=303)

    def _act(self, action: str, run_id: str, reason: str, requested_by: str) -> ControlResult:
        """Run ``Operator.<action>`` for one request (an operator of its own: its recovery producer fences, reads and
        publishes for this action only), then wait briefly for the projection to show the outcome, so that the run
        page the browser is sent to agrees with it. An archived run (no state in Redis, held by the archive) is
        refused first: it is finished and out of the hot stores (docs/guide/archive.md)."""
        archived = self._archived_url(run_id)
        if archived is not None:
            raise ControlRefusedError(f"run {run_id} is archived ({archived}): it is finished and out of the hot "
                                      f"stores; {action} does not apply")
        with Operator(self.config.settings, wait_s=self.config.control_wait_s) as operator:
            result: ControlResult = getattr(operator, action)(run_id, reason=reason, requested_by=requested_by)
        if result.outcome in ("cancelled", "paused", "resumed"):
            self._await_projection(run_id, result.outcome, timeout_s=min(2.0, self.config.control_wait_s))
        return result

    def _archived_url(self, run_id: str) -> str | None:
        """The archive object's URL of ``run_id`` when the projection has no state for it and the archive holds it;
        None otherwise. Raises ObjectStoreError (the archive cannot be read)."""
        if self.data.store.get(partition_for(run_id, self.data.partitions), run_id) is not None:
            return None
        page = self.data.archived(run_id)
        return None if page is None else page.archived

    def _await_projection(self, run_id: str, outcome: str, *, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` until the projection shows ``outcome`` carried out on ``run_id`` (the projector
        applies what the action wrote); the page notes a projection behind the history either way."""
        shown = {"cancelled": {"CANCELLED"}, "paused": {"PAUSED"}, "resumed": {"RUNNING", "WAITING_APPROVAL"}}[outcome]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.data.store.get(partition_for(run_id, self.data.partitions), run_id)
            if state is None or state.status.value in shown:
                return
            time.sleep(0.1)

    def _refused(self, request: Request, run_id: str, action: str, exc: ControlRefusedError) -> Response:
        """A refusal shown to a browser: the run page with the message, status 409 (the error page when the run
        has no page)."""
        message = f"{action} refused: {exc} — nothing was written."
        try:
            page = self.data.run(run_id)
        except _UNAVAILABLE:
            page = None
        if page is None:
            return self._page(request, "error.html", {"error": message}, 409)
        return self._page(request, "run.html", {"run": page, "control_refused": message}, 409)

    # -- sign-in -----------------------------------------------------------------------------------
    async def login(self, request: Request) -> Response:
        if not self.auth.enabled:
            return self._page(request, "error.html", {"error": "this console was started without an operator "
                                                               "token: it is read-only"}, 404)
        if request.method == "GET":
            return self._page(request, "login.html", {"failed": False})
        form = await request.form()
        if not self.auth.token_matches(_text(form.get("token")) or ""):
            return self._page(request, "login.html", {"failed": True}, 401)
        response = RedirectResponse("/runs", status_code=303)
        response.set_cookie(COOKIE, self.auth.session_value(), httponly=True, samesite="strict", path="/")
        response.set_cookie(NAME_COOKIE, (_text(form.get("name")) or "operator")[:64], httponly=True,
                            samesite="strict", path="/")
        return response

    async def logout(self, request: Request) -> Response:
        response = RedirectResponse("/runs", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response


def _cell(value: Any) -> Any:
    """A query's cell for JSON and the page: a date or timestamp as ISO text, anything else as DuckDB gave it."""
    return value.isoformat() if hasattr(value, "isoformat") else value


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _control_notice(query: Any) -> str | None:
    """What the run page says after a cancel, pause or resume (``?control=ACTION&outcome=OUTCOME``, the
    ``ControlResult.outcome``): a fixed sentence per outcome; an outcome word without one is named as it is (a
    recovery pass's: ``superseded`` …)."""
    action, outcome = query.get("control"), query.get("outcome") or ""
    if action not in CONTROL_ACTIONS or not _OUTCOME_WORD.fullmatch(outcome):
        return None
    said = _OUTCOMES.get(outcome, f"the recovery pass reported {outcome}; the page shows the run as it is now.")
    if outcome == _CARRIED_OUT[action]:
        said = f"carried out — {said}"
    elif outcome in ("cancelled", "paused", "resumed"):
        said = f"not carried out as asked — {said}"
    return f"{action.capitalize()}: {said}"


def path_segment(value: Any) -> str:
    """``value`` percent-encoded as one URL path segment (``/``, ``?``, ``#``, ``%`` and spaces too): a run id
    may hold any of them (``runjournal.core.ids``), and the run routes take the rest of the path as the id."""
    return quote(str(value), safe="")


def build_app(config: ConsoleConfig, *, data: ConsoleData | None = None,
              metrics: ConsoleMetrics | None = None) -> Starlette:
    """The console's ASGI app (serve it with uvicorn; ``runjournal console`` does).

    Args:
        config: settings, operator token, extra scrape URLs.
        data: the reads (default: :class:`ConsoleData` on ``config.settings``).
        metrics: the console's own metrics (default: a new registry).
    """
    data = data or ConsoleData(config.settings)
    metrics = metrics or ConsoleMetrics()
    console = _Console(config, data, metrics)
    routes = [
        Route("/", lambda _r: RedirectResponse("/runs", status_code=307)),
        Route("/runs", console.runs), Route("/api/runs", console.runs), Route("/search", console.search),
        # {run_id:path}: a run id may hold "/" (it arrives percent-encoded, the server decodes it); the decide route
        # takes the last two segments, so a run id holding "/approvals/" still reaches its run page by GET.
        Route("/runs/{run_id:path}/approvals/{call_id:str}", console.decide, methods=["POST"]),
        Route("/runs/{run_id:path}/cancel", console.cancel, methods=["POST"]),
        Route("/runs/{run_id:path}/pause", console.pause, methods=["POST"]),
        Route("/runs/{run_id:path}/resume", console.resume, methods=["POST"]),
        Route("/runs/{run_id:path}", console.run), Route("/api/runs/{run_id:path}", console.run),
        Route("/streams/{run_id:path}", console.stream),
        Route("/lag", console.lag_page),
        Route("/counts", console.counts), Route("/api/counts", console.counts),
        Route("/login", console.login, methods=["GET", "POST"]), Route("/logout", console.logout, methods=["POST"]),
        Route("/healthz", lambda _r: JSONResponse({"ok": True})),
        Route("/metrics", lambda _r: Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)),
        Mount("/static", app=StaticFiles(directory=str(_HERE / "static")), name="static"),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        with contextlib.suppress(Exception):  # read the partition count once, before the first request
            await run_in_threadpool(lambda: data.partitions)
        yield
        console.lag.close()
        data.close()

    async def not_found(request: Request, exc: Exception) -> Response:  # an unknown /api/ path: JSON too
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": "NotFound", "message": f"no such endpoint: {request.url.path}"}, 404)
        return PlainTextResponse("Not Found", status_code=404)

    return Starlette(routes=routes, middleware=[Middleware(_Timing, metrics=metrics, routes=routes)],
                     lifespan=lifespan, exception_handlers={404: not_found})


def _json_value(text: str) -> Any:
    """A settled result typed by an operator: JSON with an exact canonical form (NaN / Infinity refused).

    Raises:
        ValueError: not JSON, or no canonical form (``NonCanonicalValueError`` is a ``ValueError``).
    """
    from runjournal.producers import canonical_value

    def refuse(token: str) -> Any:
        raise ValueError(f"{token} has no JSON form")

    value = json.loads(text, parse_constant=refuse)
    canonical_value(value, "result")
    return value

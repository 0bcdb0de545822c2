"""Optional W3C trace context (``traceparent``) for journal events, without an OpenTelemetry dependency.

A run handle stamps each event with a traceparent — the one given explicitly to
``Journal.start_run`` / ``Journal.resume``, else the one active in :data:`current_traceparent`
when the event is emitted — into the envelope's ``traceparent`` field and a Kafka header of
the same name. A tracing integration sets the context variable (``with use_traceparent(tp):``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = ["RunTrace", "current_traceparent", "use_traceparent", "valid_traceparent"]

#: The traceparent active in this context, or None.
current_traceparent: ContextVar[str | None] = ContextVar("runjournal_traceparent", default=None)

_TRACEPARENT = re.compile(r"[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def valid_traceparent(value: str) -> bool:
    """True when ``value`` is a W3C ``traceparent`` (``vv-<32 hex trace>-<16 hex span>-ff``, ids non-zero)."""
    return bool(_TRACEPARENT.fullmatch(value)) and not value.startswith("ff")


def check_traceparent(value: str | None) -> str | None:
    """``value`` unchanged when None or valid; raises ValueError otherwise."""
    if value is not None and not valid_traceparent(value):
        raise ValueError(f"not a W3C traceparent: {value!r}")
    return value


@contextmanager
def use_traceparent(value: str | None) -> Iterator[None]:
    """Make ``value`` the active traceparent inside the block. Raises ValueError when malformed."""
    token = current_traceparent.set(check_traceparent(value))
    try:
        yield
    finally:
        current_traceparent.reset(token)


#: The call events a tool call's span records as span events (by their type's name).
_CALL_EVENTS = frozenset({"TOOL_CALL_INTENDED", "TOOL_CALL_COMMITTED", "TOOL_CALL_FAILED", "TOOL_CALL_RECONCILED"})


class RunTrace:
    """The OpenTelemetry spans of one run segment this instance owns (docs/guide/tracing.md): the segment, its
    nodes and its tool calls. Made by a ``RunHandle`` only when ``runjournal.core.otel.tracer()`` is on, so an
    untraced run never reaches this class (nor imports ``opentelemetry``).

    Spans: ``runjournal.run.segment`` (span id derived from run id and epoch, child of the run's root span),
    ``runjournal.node`` (child of the enclosing node or the segment) and ``runjournal.tool_call`` (child of its
    node). Attributes: ``runjournal.run_id``, ``runjournal.epoch``, ``runjournal.seq`` (the intent's, or the
    NODE_STARTED's), ``runjournal.idempotency_key``, ``runjournal.tool``, ``runjournal.outcome`` (``committed``,
    ``recorded``, ``reconciled``, ``failed``, ``unknown``). Not thread-safe by itself: the handle calls it under
    the run's lock (or from the one thread that drives the call).

    Args:
        tracer: an ``opentelemetry.trace.Tracer`` (from ``runjournal.core.otel.tracer()``).
        run_id, tenant_id, agent, epoch: the run and the segment's epoch.
        resumed: True for a resumed segment: it links the previous owner's segment (epoch - 1) and the recovery
            job's hand-over span of this epoch.
        sealed: the run's content is encrypted (``RUNJOURNAL_ENCRYPTION=on``, decision 0059): an error is then
            recorded by its class only (``exception.type``; the status description is the class name), never its
            text, which is content (a tool's or the run's error) the journal seals: a trace backend is one more
            copy that no key erasure reaches.
    """

    def __init__(self, tracer: Any, *, run_id: str, tenant_id: str, agent: str, epoch: int, resumed: bool,
                 sealed: bool = False) -> None:
        from runjournal.core import otel

        self._tracer = tracer
        self._otel = otel
        self._sealed = sealed
        self.run_id = run_id
        self.epoch = epoch
        self._base = {"runjournal.run_id": run_id, "runjournal.epoch": epoch}
        links = [otel.span_link(run_id, otel.segment_span_id(run_id, epoch - 1)),
                 otel.span_link(run_id, otel.recovery_span_id(run_id, epoch))] if resumed else []
        with otel.forced_ids(0, otel.segment_span_id(run_id, epoch)):
            self.segment = tracer.start_span(
                "runjournal.run.segment", context=otel.run_context(run_id), links=links,
                attributes={**self._base, "runjournal.tenant_id": tenant_id, "runjournal.agent": agent,
                            "runjournal.resumed": resumed})
        self._segment_tp = otel.span_traceparent(self.segment)
        self._nodes: dict[str, tuple[Any, str | None]] = {}
        self._calls: dict[str, tuple[Any, str | None]] = {}
        self._intended: set[str] = set()
        self._outcomes: dict[str, str] = {}

    def start_root(self, agent: str, caller: str | None) -> Any:
        """Start the run's root span ``runjournal.run`` (trace and span id derived from the run id; a root even
        when a caller's span is active, linked to ``caller``, a W3C traceparent). The caller ends it."""
        from opentelemetry.context import Context

        otel = self._otel
        link = otel.traceparent_link(caller)
        with otel.forced_ids(*otel.run_trace(self.run_id)):
            return self._tracer.start_span("runjournal.run", context=Context(), links=[link] if link else [],
                                           attributes={"runjournal.run_id": self.run_id, "runjournal.agent": agent})

    # -- stamping ---------------------------------------------------------------------------------
    def traceparent_for(self, payload: dict[str, Any], node_id: str | None) -> str | None:
        """The traceparent an event of this segment carries: its call's span, else its node's, else the segment's."""
        call = self._calls.get(payload.get("call_id") or "")
        if call is not None:
            return call[1]
        node = self._nodes.get(node_id or "")
        return node[1] if node is not None else self._segment_tp

    def published(self, etype: str, payload: dict[str, Any], seq: int) -> None:
        """An event of this segment was published: a call event becomes a span event of its call's span."""
        if etype not in _CALL_EVENTS:
            return
        key = payload.get("call_id") or ""
        call = self._calls.get(key)
        if call is None:
            return
        span = call[0]
        span.add_event(etype, {"runjournal.seq": seq})
        if etype == "TOOL_CALL_INTENDED":
            self._intended.add(key)
            span.set_attribute("runjournal.seq", seq)
            span.set_attribute("runjournal.attempt", int(payload.get("attempt") or 1))
        elif etype == "TOOL_CALL_COMMITTED":
            self._outcomes[key] = "committed"
        elif etype == "TOOL_CALL_FAILED":
            self._outcomes[key] = "failed"
        else:
            self._outcomes[key] = "reconciled"

    # -- spans ------------------------------------------------------------------------------------
    def _context(self, node_path: str | None) -> Any:
        from opentelemetry import trace

        node = self._nodes.get(node_path or "")
        return trace.set_span_in_context(node[0] if node is not None else self.segment)

    def open_node(self, path: str, parent: str | None, attempt: int) -> None:
        """Start the span of node ``path`` (child of node ``parent``, or of the segment)."""
        span = self._tracer.start_span("runjournal.node", context=self._context(parent), attributes={
            **self._base, "runjournal.node_path": path, "runjournal.attempt": attempt})
        self._nodes[path] = (span, self._otel.span_traceparent(span))

    def close_node(self, path: str, error: BaseException | None = None) -> None:
        """End node ``path``'s span (``error``: recorded, status ERROR)."""
        node = self._nodes.pop(path, None)
        if node is not None:
            _end(node[0], error, self._sealed)

    def open_call(self, key: str, tool: str, node_path: str | None) -> None:
        """Start the span of the call ``key`` (its idempotency key) of ``tool``, child of its node."""
        span = self._tracer.start_span("runjournal.tool_call", context=self._context(node_path), attributes={
            **self._base, "runjournal.idempotency_key": key, "runjournal.tool": tool})
        self._calls[key] = (span, self._otel.span_traceparent(span))

    def close_call(self, key: str, error: BaseException | None) -> None:
        """End the call ``key``'s span with its outcome class (``runjournal.outcome``); an error is recorded."""
        call = self._calls.pop(key, None)
        if call is None:
            return
        span = call[0]
        outcome = self._outcomes.pop(key, None)
        intended = key in self._intended
        self._intended.discard(key)
        if error is not None and type(error).__name__ == "OutcomeUnknownError":
            outcome = "unknown"
            span.add_event("OUTCOME_UNKNOWN", {"runjournal.error": _error_text(error, self._sealed)})
        elif error is not None:
            outcome = outcome or "failed"
        elif outcome is None:  # committed by the next group commit, or answered from the journal
            outcome = "committed" if intended else "recorded"
            if intended:
                span.add_event("TOOL_CALL_COMMITTED", {"runjournal.group_commit": True})
        span.set_attribute("runjournal.outcome", outcome)
        _end(span, error, self._sealed)

    def end(self, outcome: str, error: str | None = None) -> None:
        """End the segment (the run ended here, or was surrendered): ``runjournal.outcome`` = ``outcome``."""
        for path in list(self._nodes):
            self.close_node(path)
        self.segment.set_attribute("runjournal.outcome", outcome)
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            self.segment.set_status(Status(StatusCode.ERROR, "error (encrypted)" if self._sealed else error[:512]))
        self.segment.end()


def _error_text(error: BaseException, sealed: bool) -> str:
    """What a span says of ``error``: its class and text, or its class only when the run's content is sealed."""
    return type(error).__name__ if sealed else f"{type(error).__name__}: {error}"[:512]


def _end(span: Any, error: BaseException | None, sealed: bool = False) -> None:
    if error is not None and not isinstance(error, GeneratorExit):
        from opentelemetry.trace import Status, StatusCode

        if sealed:  # the class, never the text or the traceback's locals (RunTrace: sealed)
            span.add_event("exception", {"exception.type": type(error).__qualname__, "exception.escaped": False})
        else:
            span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, _error_text(error, sealed)))
    span.end()

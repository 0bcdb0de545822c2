"""OpenTelemetry traces (the ``otel`` extra): one switch, one tracer provider, and the run's trace identity.

Off by default, and off costs nothing: this module imports no ``opentelemetry`` package until tracing is switched
on, and every caller asks :func:`tracer` (a global read) once per run segment, node, call or batch — never per event.

Switched on (checked once, at the first :func:`tracer` call) when

* :func:`configure_tracing` was called (tests pass a span processor around the SDK's ``InMemorySpanExporter``), or
* ``RUNJOURNAL_TRACING=otel`` (``Settings.tracing``), or
* a standard variable names a trace exporter: ``OTEL_TRACES_EXPORTER`` (other than ``none``),
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``.

``RUNJOURNAL_TRACING=off`` wins over the ``OTEL_*`` variables. The default exporter is the SDK's
``OTLPSpanExporter`` (OTLP over HTTP/protobuf) behind a ``BatchSpanProcessor``, built by the SDK from the standard
``OTEL_*`` variables (endpoint, headers, timeout, ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``, batch
sizes): this module parses none of them.

One trace per run (docs/design/decisions/0054-traces.md): the run's trace id and its root span id are derived from
the run id (:func:`run_trace`), so the first owner, the recovery job and every later owner name the same trace
without reading anything; an owner's segment of epoch N has the span id :func:`segment_span_id` (run id, N). The
provider's ``IdGenerator`` (:class:`_DerivedIds`) hands out those ids to the spans started under :func:`forced_ids`.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from runjournal.core.errors import ConfigError

__all__ = [
    "TRACING_ENV",
    "apply_setting",
    "configure_tracing",
    "current_link",
    "emit_run_span",
    "forced_ids",
    "header_links",
    "recovery_span_id",
    "run_context",
    "run_trace",
    "run_traceparent",
    "segment_span_id",
    "shutdown_tracing",
    "span_link",
    "span_traceparent",
    "step_span",
    "traceparent_link",
    "tracer",
    "tracing_requested",
]

#: The switch: ``otel`` turns traces on, ``off`` keeps them off whatever the ``OTEL_*`` variables say
#: (``Settings.tracing``; unset → on when a standard OTLP / trace-exporter variable is set).
TRACING_ENV = "RUNJOURNAL_TRACING"
_OTEL_SWITCHES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_SCOPE = "runjournal"

_lock = threading.Lock()
_checked = False
_tracer: Any = None
_provider: Any = None
_forced: ContextVar[tuple[int, int] | None] = ContextVar("runjournal_forced_ids", default=None)


def tracing_requested(environ: dict[str, str] | None = None) -> bool:
    """True when the environment asks for traces (see the module docstring; no import happens here).

    Args:
        environ: the variables to read (default: ``os.environ``).
    """
    env = os.environ if environ is None else environ
    switch = env.get(TRACING_ENV, "").strip().lower()
    if switch == "off":
        return False
    if switch == "otel":
        return True
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter and exporter != "none":
        return True
    return any(env.get(name) for name in _OTEL_SWITCHES)


def tracer() -> Any:
    """The runjournal tracer (an ``opentelemetry.trace.Tracer``), or None when tracing is off.

    The first call decides (:func:`tracing_requested`) and, when on, builds the provider from the ``OTEL_*``
    variables; later calls read a global.

    Raises:
        ConfigError: tracing is asked for but the ``otel`` extra is not installed (``pip install 'runjournal[otel]'``).
    """
    if _checked:
        return _tracer
    with _lock:
        if not _checked:
            _setup(None) if tracing_requested() else _set(None, None)
    return _tracer


def apply_setting(mode: str) -> None:
    """Apply ``Settings.tracing`` given in code (``Journal`` and ``RecoveryJob`` call it with their settings):
    ``otel`` switches traces on in this process when they are off (the exporter from the ``OTEL_*`` variables);
    ``off`` keeps them off when nothing has decided yet; ``auto`` leaves the decision to the environment
    (:func:`tracer`). A provider installed by :func:`configure_tracing` is never replaced.

    Raises:
        ConfigError: ``otel`` without the ``otel`` extra installed (``pip install 'runjournal[otel]'``).
    """
    if mode == "auto" or (mode == "off" and _checked):
        return
    with _lock:
        if mode == "otel" and _tracer is None:
            _setup(None)
        elif mode == "off" and not _checked:
            _set(None, None)


def configure_tracing(span_processor: Any = None) -> Any:
    """Switch traces on in this process with a provider of runjournal's own (the test hook).

    Args:
        span_processor: an ``opentelemetry.sdk.trace.SpanProcessor`` to send spans to (tests:
            ``SimpleSpanProcessor(InMemorySpanExporter())``); default: a ``BatchSpanProcessor`` around the SDK's
            ``OTLPSpanExporter``, configured by the standard ``OTEL_*`` variables.

    Returns:
        The ``opentelemetry.sdk.trace.TracerProvider`` (its ``force_flush`` / ``shutdown`` are the caller's).

    Raises:
        ConfigError: the ``otel`` extra is not installed.
    """
    with _lock:
        return _setup(span_processor)


def shutdown_tracing() -> None:
    """Flush and shut the provider down (a service's exit), then tracing is off until configured again."""
    global _checked
    with _lock:
        if _provider is not None:
            _provider.shutdown()
        _set(None, None)
        _checked = False


def _set(provider: Any, trc: Any) -> None:
    global _checked, _tracer, _provider
    _provider, _tracer, _checked = provider, trc, True


def _setup(span_processor: Any) -> Any:
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        if span_processor is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            span_processor = BatchSpanProcessor(OTLPSpanExporter())  # endpoint, headers …: OTEL_* (the SDK's)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"traces are switched on ({TRACING_ENV} or OTEL_*) but the OpenTelemetry SDK is not "
                          f"installed ({exc.name}): pip install 'runjournal[otel]'") from exc
    if _provider is not None:
        _provider.shutdown()
    provider = TracerProvider(resource=Resource.create(), id_generator=_derived_ids())
    provider.add_span_processor(span_processor)
    _set(provider, provider.get_tracer(_SCOPE))
    return provider


def _derived_ids() -> Any:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class _DerivedIds(RandomIdGenerator):
        """Random ids, except inside :func:`forced_ids`: then the forced trace id / span id (one span)."""

        def generate_span_id(self) -> int:
            forced = _forced.get()
            return forced[1] if forced is not None else super().generate_span_id()

        def generate_trace_id(self) -> int:
            forced = _forced.get()
            return forced[0] if forced is not None else super().generate_trace_id()

    return _DerivedIds()


@contextmanager
def forced_ids(trace_id: int, span_id: int) -> Iterator[None]:
    """Spans started inside the block get ``trace_id`` (for a root) and ``span_id``: a run's derived ids."""
    token = _forced.set((trace_id, span_id))
    try:
        yield
    finally:
        _forced.reset(token)


def _derive(*parts: object) -> bytes:
    return hashlib.sha256("\x1f".join(["runjournal-trace", *map(str, parts)]).encode("utf-8")).digest()


def run_trace(run_id: str) -> tuple[int, int]:
    """``(trace_id, root_span_id)`` of run ``run_id``: 128 and 64 bits of sha256 of the run id, never zero."""
    d = _derive(run_id)
    return int.from_bytes(d[:16], "big") or 1, int.from_bytes(d[16:24], "big") or 1


def segment_span_id(run_id: str, epoch: int) -> int:
    """The span id of the segment of run ``run_id`` its owner writes under ``epoch`` (64 bits, never zero)."""
    return int.from_bytes(_derive(run_id, "segment", epoch)[:8], "big") or 1


def run_context(run_id: str, span_id: int | None = None) -> Any:
    """An OpenTelemetry ``Context`` whose parent is the run's root span (or ``span_id`` in the run's trace)."""
    from opentelemetry import trace

    trace_id, root = run_trace(run_id)
    parent = trace.SpanContext(trace_id, root if span_id is None else span_id, is_remote=True,
                               trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
    return trace.set_span_in_context(trace.NonRecordingSpan(parent))


def span_link(run_id: str, span_id: int) -> Any:
    """An OpenTelemetry ``Link`` to span ``span_id`` of run ``run_id``'s trace."""
    from opentelemetry import trace

    trace_id, _root = run_trace(run_id)
    return trace.Link(trace.SpanContext(trace_id, span_id, is_remote=True,
                                        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED)))


def span_traceparent(span: Any) -> str | None:
    """The W3C ``traceparent`` of ``span`` (``00-<32 hex>-<16 hex>-<2 hex>``), or None for an invalid context."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def traceparent_link(traceparent: str | None) -> Any:
    """An OpenTelemetry ``Link`` to the span a W3C ``traceparent`` names, or None (absent or malformed)."""
    if not traceparent:
        return None
    parts = traceparent.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    from opentelemetry import trace

    try:
        ctx = trace.SpanContext(int(parts[1], 16), int(parts[2], 16), is_remote=True,
                                trace_flags=trace.TraceFlags(int(parts[3], 16)))
    except ValueError:
        return None
    return trace.Link(ctx) if ctx.is_valid else None


def recovery_span_id(run_id: str, epoch: int) -> int:
    """The span id of the recovery job's hand-over of run ``run_id`` to ``epoch`` (64 bits, never zero): the new
    owner's segment links it without reading anything."""
    return int.from_bytes(_derive(run_id, "recovery", epoch)[:8], "big") or 1


def run_traceparent(run_id: str, span_id: int) -> str:
    """The W3C ``traceparent`` of span ``span_id`` in run ``run_id``'s trace (sampled)."""
    return f"00-{run_trace(run_id)[0]:032x}-{span_id:016x}-01"


@contextmanager
def step_span(name: str, attributes: dict[str, Any] | None = None, links: list[Any] | None = None) -> Iterator[Any]:
    """A span around a service's step (a batch, a recovery step), current inside the block; yields it, or None
    when tracing is off (one global read: call it per batch, not per event). An exception is recorded on it.

    Args:
        name: the span's name (``runjournal.<service>.<step>``).
        attributes: span attributes (str, bool, int, float values).
        links: ``opentelemetry.trace.Link`` objects (from :func:`current_link`, :func:`span_link`).
    """
    trc = tracer()
    if trc is None:
        yield None
        return
    with trc.start_as_current_span(name, attributes=attributes, links=links) as span:
        yield span


def emit_run_span(name: str, run_id: str, span_id: int, *, attributes: dict[str, Any], links: list[Any],
                  error: str | None = None) -> None:
    """Start and end, at once, span ``span_id`` named ``name`` in run ``run_id``'s trace (child of its root span):
    the recovery job's hand-over of a run, or the stand-in segment of an owner that died (0054). No-op when off."""
    trc = tracer()
    if trc is None:
        return
    with forced_ids(0, span_id):
        span = trc.start_span(name, context=run_context(run_id), links=links, attributes=attributes)
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, error))
    span.end()


def current_link() -> Any:
    """A ``Link`` to the span current in this context (e.g. a recovery pass), or None (off, or none current)."""
    if tracer() is None:
        return None
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    return trace.Link(ctx) if ctx.is_valid else None


def header_links(messages: Any, limit: int = 64) -> list[Any]:
    """Links from a service's batch span to the runs it touches: one per distinct trace among the Kafka
    ``traceparent`` headers of ``messages`` (confluent-kafka ``Message`` objects), at most ``limit``. Call it only
    when :func:`tracer` is on (it reads every message's headers)."""
    seen: dict[str, str] = {}
    for msg in messages:
        for key, value in msg.headers() or ():
            if key == "traceparent" and value:
                text = value.decode("ascii", "replace")
                seen.setdefault(text[3:35], text)
        if len(seen) >= limit:
            break
    return [link for tp in seen.values() if (link := traceparent_link(tp)) is not None]

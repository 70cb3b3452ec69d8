"""OpenTelemetry traces, off unless the standard ``OTEL_*`` variables ask for them.

Tracing is on when ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``, ``console``,
``b2bhub_file``, any installed under the entry-point group
``opentelemetry_traces_exporter``) and ``OTEL_SDK_DISABLED`` is not true; ``none`` or
unset leaves it off. The rest is the SDK's own environment configuration:
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, the exporter's
``OTEL_EXPORTER_OTLP_*`` and the batch processor's ``OTEL_BSP_*``. The packages come
with the ``tracing`` extra (``pip install 'b2bhub[tracing]'``).

When on, each process (web, worker, beat) sets up a tracer provider once, the maintained
instrumentations of Flask, Celery and requests, and the hub's own spans: ``dispatch``
(a message stored and routed), ``claim`` (a worker claiming due deliveries) and
``attempt`` (one delivery attempt). A message's trace crosses from the process that
received it to the worker that delivers it through the message row: ``dispatch``
records its W3C ``traceparent`` in ``messages.trace_parent`` and each ``attempt`` is a
child of it, however the worker was woken (a broker wake-up, the sweep, a retry hours
later). The message page shows the trace id.

When off nothing of OpenTelemetry is imported: :func:`span` is a ``nullcontext`` and
:func:`traceparent` None. The domain core does not use this module.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)
_lock = threading.Lock()
_state: dict[str, Any] = {"configured": False, "tracer": None, "pid": None}


def enabled() -> bool:
    """Whether the environment configures a trace exporter."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    names = [n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")]
    return any(n and n != "none" for n in names)


def setup(service: str | None = None) -> bool:
    """Set up the tracer provider of this process from the environment (once); True
    when tracing is on. ``service``: the ``service.name`` unless ``OTEL_SERVICE_NAME``
    says otherwise."""
    if not enabled():
        return False
    with _lock:
        if _state["configured"]:
            return True
        try:
            from opentelemetry import trace
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise RuntimeError(f"OTEL_TRACES_EXPORTER is set but {exc.name} is missing: "
                               "install b2bhub[tracing] (or unset the variable)") from exc

        attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {
            "service.name": service or "b2bhub"}
        provider = TracerProvider(resource=Resource.create(attributes))
        for exporter in _exporters():
            provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        from opentelemetry.instrumentation.requests import RequestsInstrumentor
        RequestsInstrumentor().instrument()
        _state.update(configured=True, tracer=trace.get_tracer("b2bhub"),
                      provider=provider)
    return True


def _exporters() -> list:
    """The exporters ``OTEL_TRACES_EXPORTER`` names, by the SDK's entry-point group."""
    from importlib.metadata import entry_points

    out = []
    for name in os.environ.get("OTEL_TRACES_EXPORTER", "").split(","):
        name = name.strip()
        if not name or name == "none":
            continue
        found = entry_points(group="opentelemetry_traces_exporter", name=name)
        if not found:
            raise RuntimeError(f"OTEL_TRACES_EXPORTER names {name!r}, which no installed "
                               "package provides (entry point group "
                               "opentelemetry_traces_exporter)")
        out.append(next(iter(found)).load()())
    return out


def instrument_flask(app) -> None:
    """The Flask instrumentation on ``app`` (a no-op when tracing is off)."""
    if setup("b2bhub-web"):
        from opentelemetry.instrumentation.flask import FlaskInstrumentor
        FlaskInstrumentor().instrument_app(app, excluded_urls="api/v1/health,metrics")


def instrument_celery() -> None:
    """The Celery instrumentation in a worker or beat process (no-op when off)."""
    if setup("b2bhub-worker"):
        from opentelemetry.instrumentation.celery import CeleryInstrumentor
        instrumentor = CeleryInstrumentor()
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument()


def shutdown() -> None:
    """Flush and stop the exporters (a process about to exit)."""
    provider = _state.get("provider")
    if provider is not None:
        provider.shutdown()


_OFF = contextlib.nullcontext()  # reusable: entering it yields None


def span(name: str, parent: str | None = None, **attributes: Any
         ) -> contextlib.AbstractContextManager[Any]:
    """A span of the hub's own, a child of the current one or of the W3C
    ``traceparent`` ``parent`` when given; entering yields the span (None when tracing
    is off, at the cost of one shared no-op context manager)."""
    if not _state["configured"]:
        return _OFF
    return _span(name, parent, attributes)


@contextlib.contextmanager
def _span(name: str, parent: str | None, attributes: dict) -> Iterator[Any]:
    context = _context_of(parent) if parent else None
    with _state["tracer"].start_as_current_span(
            name, context=context,
            attributes={k: v for k, v in attributes.items() if v is not None}) as current:
        yield current


def _context_of(traceparent: str):
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


def traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span, None without one (or when off)."""
    if not _state["configured"]:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")


def trace_id(traceparent_value: str | None) -> str | None:
    """The trace id (32 hex digits) a ``traceparent`` names; None if it names none."""
    parts = (traceparent_value or "").split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or parts[1] == "0" * 32:
        return None
    try:
        int(parts[1], 16)
    except ValueError:
        return None
    return parts[1]

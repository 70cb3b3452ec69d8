"""A span exporter writing one JSON object per finished span to a file.

Selected with ``OTEL_TRACES_EXPORTER=b2bhub_file``; the file is
``OTEL_EXPORTER_B2BHUB_FILE`` (default ``spans.jsonl`` in the working directory). Each
line holds ``name``, ``trace_id``, ``span_id``, ``parent_id`` (hex), ``kind``,
``service`` (the resource's ``service.name``), ``pid``, ``start``/``end`` (ns since the
epoch) and ``attributes``. Several processes may append to one file: each span is one
``write`` of a whole line to a file opened for appending. Meant for a look at traces
without a collector, and for tests; a deployment uses ``otlp``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


class FileSpanExporter(SpanExporter):
    def __init__(self, path: str | None = None):
        self.path = path or os.environ.get("OTEL_EXPORTER_B2BHUB_FILE") or "spans.jsonl"
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(_record(s), default=str) + "\n" for s in spans)
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, lines.encode())
            finally:
                os.close(fd)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _record(span: ReadableSpan) -> dict:
    ctx = span.get_span_context()
    parent = span.parent
    return {"name": span.name, "trace_id": f"{ctx.trace_id:032x}",
            "span_id": f"{ctx.span_id:016x}",
            "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
            "kind": span.kind.name,
            "service": span.resource.attributes.get("service.name"), "pid": os.getpid(),
            "start": span.start_time, "end": span.end_time,
            "attributes": dict(span.attributes or {})}

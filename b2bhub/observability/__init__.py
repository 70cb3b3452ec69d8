"""What the hub tells about itself beyond its own pages.

``tracing`` turns OpenTelemetry traces on from the standard ``OTEL_*`` variables;
``trace_file`` is the span exporter that writes one JSON line per span; ``logstream``
ships every process's log records to the database for the Logs page and the API.
(Metrics are served by :mod:`b2bhub.api.metrics`.)
"""

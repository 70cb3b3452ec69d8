"""Prometheus ``GET /metrics`` at the root (SPEC 16), with the API's bearer tokens
(viewer): Prometheus sends one with ``authorization: {credentials: ...}``.

Every value is read from the database at the scrape (``b2bhub.engine.stats``), so any
web process answers for the whole hub and nothing is lost when a process restarts.
"""

from __future__ import annotations

from datetime import UTC

from flask import Blueprint, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from b2bhub.api.auth import authenticate_request
from b2bhub.api.blueprint import bp, document_operation, role_for
from b2bhub.api.errors import ApiError, api_error_response
from b2bhub.config.extensions import db
from b2bhub.engine import stats
from b2bhub.models import utcnow

metrics_bp = Blueprint("metrics", __name__)
metrics_bp.before_request(authenticate_request)
metrics_bp.register_error_handler(ApiError, api_error_response)


@metrics_bp.get("/metrics")
def metrics():
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HubCollector(db.session))
    return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)


@bp.document_hook
def document_metrics(doc: dict, registry) -> None:
    """``/metrics`` is outside the API's prefix, but callers need it described too."""
    operation = {
        "operationId": "get_metrics", "tags": ["system"],
        "summary": "Prometheus metrics",
        "description": "The hub's figures in the Prometheus text exposition format, read "
                       "from the database at the scrape (any web process answers for the "
                       "whole hub).",
        "responses": {200: {"description": "the metrics", "content": {"text/plain": {
            "schema": {"type": "string"}}}}}}
    document_operation(operation, role_for(metrics, "GET"))
    doc["paths"]["/metrics"] = {"get": operation}


class HubCollector:
    def __init__(self, session):
        self.session = session

    def collect(self):
        now = utcnow()
        figures = stats.current(self.session, now)
        yield _labelled("b2bhub_messages", "Messages by status.", "status",
                        figures.messages)
        yield _labelled("b2bhub_deliveries", "Deliveries by state.", "state",
                        figures.deliveries)
        yield _labelled("b2bhub_instances", "Plugin instances by state.", "state",
                        figures.instances)
        states = GaugeMetricFamily("b2bhub_instance_state",
                                   "1 for the state each plugin instance is in.",
                                   labels=["instance", "state"])
        for row in figures.instance_states:
            states.add_metric([row.name, row.state], 1)
        yield states
        yield from _probes(figures.instance_states)
        yield GaugeMetricFamily("b2bhub_instances_blocked",
                                "Target instances a business rule blocks until an operator "
                                "acts.", value=len(figures.blocked))
        yield GaugeMetricFamily("b2bhub_deliveries_due",
                                "Deliveries whose time has come, waiting for a claim.",
                                value=figures.due)
        yield GaugeMetricFamily("b2bhub_oldest_due_delivery_seconds",
                                "How long the oldest due delivery has waited.",
                                value=figures.oldest_due_seconds or 0.0)
        yield _labelled("b2bhub_processes", "Connected processes by kind.", "kind",
                        figures.processes)
        last = stats.series(self.session, now, stats.LAST_MINUTE)
        point = last[-1] if last else None
        for name, text, value in [
            ("b2bhub_attempts_last_minute", "Attempts started in the last ended minute.",
             point.attempts if point else 0),
            ("b2bhub_delivered_last_minute", "Attempts delivered in the last ended minute.",
             point.delivered if point else 0),
            ("b2bhub_failures_last_minute",
             "Attempts failed or retrying in the last ended minute.",
             point.failures if point else 0),
            ("b2bhub_messages_in_last_minute", "Messages received in the last ended minute.",
             point.messages_in if point else 0),
            ("b2bhub_attempt_duration_avg_seconds",
             "Average attempt duration in the last ended minute.",
             (point.duration_avg or 0.0) if point else 0.0),
            ("b2bhub_attempt_duration_max_seconds",
             "Longest attempt in the last ended minute.",
             (point.duration_max or 0.0) if point else 0.0),
        ]:
            yield GaugeMetricFamily(name, text, value=value)


def _labelled(name: str, text: str, label: str, values: dict[str, int]):
    family = GaugeMetricFamily(name, text, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


def _probes(rows: list[stats.InstanceFigures]):
    """The last probe of each target probed at least once (b2bhub.engine.probes)."""
    online = GaugeMetricFamily("b2bhub_target_online",
                               "1 if the target's last probe found it online, 0 offline.",
                               labels=["instance"])
    checked = GaugeMetricFamily("b2bhub_target_last_probe_timestamp_seconds",
                                "When the target's last recorded probe began (Unix time).",
                                labels=["instance"])
    for row in rows:
        if row.online is not None:
            online.add_metric([row.name], 1 if row.online else 0)
        if row.probe_checked_at is not None:
            checked.add_metric([row.name], row.probe_checked_at.replace(
                tzinfo=UTC).timestamp())
    yield online
    yield checked

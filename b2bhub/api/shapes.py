"""The JSON shapes of the API's resources, one function per resource.

Times are ISO 8601 UTC with a ``Z``. Field names are snake_case, except that routes and
message filters say ``from`` and ``to`` as the SPEC does.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from b2bhub.api.inputs import encode_cursor
from b2bhub.config_schema import schema_to_json
from b2bhub.models import Delivery, HistoryLine, Message, Party, Payload, PluginInstance, Route
from b2bhub.services.config import SECRET_MASK
from b2bhub.services.pages import Page


def iso(moment: datetime | None) -> str | None:
    return moment.isoformat() + "Z" if moment is not None else None


def page_json(page: Page, shape) -> dict[str, Any]:
    """A list response: ``items`` and the ``next_cursor`` (null on the last page)."""
    return {"items": [shape(item) for item in page.items],
            "next_cursor": encode_cursor(page.next_key)}


def party_json(party: Party) -> dict[str, Any]:
    return {"name": party.name, "display_name": party.display_name, "kind": party.kind,
            "created_at": iso(party.created_at)}


def plugin_type_json(cls: type) -> dict[str, Any]:
    doc = (cls.__doc__ or "").strip().splitlines()
    return {"name": cls.type_name, "roles": sorted(cls.roles),
            "description": doc[0] if doc else "", "schema": schema_to_json(cls.config_schema)}


def instance_json(row: PluginInstance, registry) -> dict[str, Any]:
    return {"name": row.name, "type": row.type, "enabled": row.enabled,
            "config": _masked(row, registry),
            "max_concurrent_deliveries": row.max_concurrent_deliveries,
            "retry_policy": row.retry_policy, "ordered": row.ordered, "queue": row.queue,
            "probe_interval": row.probe_interval, "retention_days": row.retention_days,
            "state": row.state, "state_reason": row.state_reason,
            "created_at": iso(row.created_at), "updated_at": iso(row.updated_at)}


def _masked(row: PluginInstance, registry) -> dict[str, Any]:
    """The configuration with every secret that is set shown as the mask."""
    schema = registry.get(row.type).config_schema if row.type in registry else []
    secrets = {field.name for field in schema if field.type == "secret"}
    return {key: SECRET_MASK if key in secrets and value else value
            for key, value in (row.config or {}).items()}


def route_json(route: Route) -> dict[str, Any]:
    return {"id": route.id, "source": route.source, "from": route.from_party,
            "to": route.to_party, "target": route.target,
            "created_at": iso(route.created_at), "created_by": route.created_by}


def message_json(m: Message) -> dict[str, Any]:
    return {"id": m.id, "source": m.source, "from": m.from_party, "to": m.to_party,
            "direction": m.direction, "status": m.status, "status_text": m.status_text,
            "original_filename": m.original_filename, "external_id": m.external_id,
            "correlation_id": m.correlation_id, "sequence_key": m.sequence_key,
            "size": m.size, "sha256": m.sha256,
            "created_at": iso(m.created_at), "updated_at": iso(m.updated_at)}


def message_detail_json(m: Message, history: list[HistoryLine]) -> dict[str, Any]:
    return {**message_json(m), "deliveries": [delivery_json(d) for d in m.deliveries],
            "history": [history_json(line) for line in history],
            "payloads": [payload_json(p) for p in m.payloads]}


def delivery_json(d: Delivery) -> dict[str, Any]:
    return {"id": d.id, "message_id": d.message_id, "target": d.target, "state": d.state,
            "failure_kind": d.failure_kind, "attempt": d.attempt, "failures": d.failures,
            "due_at": iso(d.due_at), "wake_count": d.wake_count,
            "lease_until": iso(d.lease_until), "receipt_ref": d.receipt_ref,
            "receipt_deadline": iso(d.receipt_deadline), "sequence_key": d.sequence_key,
            "last_result": d.last_result, "created_at": iso(d.created_at),
            "updated_at": iso(d.updated_at), "settled_at": iso(d.settled_at)}


def history_json(line: HistoryLine) -> dict[str, Any]:
    return {"id": line.id, "type": line.type, "actor": line.actor, "text": line.text,
            "delivery_id": line.delivery_id, "data": line.data,
            "created_at": iso(line.created_at)}


def payload_json(p: Payload) -> dict[str, Any]:
    return {"stage": p.stage, "size": p.size, "digest": p.digest,
            "created_at": iso(p.created_at)}

"""Resources whose JSON needs more than their row: plugin types (their configuration
schema) and plugin instances (secrets masked). The schemas in ``b2bhub.api.schemas``
serialize what these return."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flask import url_for
from sqlalchemy import select
from sqlalchemy.orm import object_session

from b2bhub.models import Delivery, PluginInstance
from b2bhub.plugin.schema import schema_to_json
from b2bhub.services.config import SECRET_MASK


def iso(moment: datetime | None) -> str | None:
    """A time as ISO 8601 UTC with a ``Z`` (the log stream's events)."""
    return moment.isoformat() + "Z" if moment is not None else None


def plugin_type_json(cls: type) -> dict[str, Any]:
    doc = (cls.__doc__ or "").strip().splitlines()
    return {"name": cls.type_name, "roles": sorted(cls.roles),
            "description": doc[0] if doc else "", "schema": schema_to_json(cls.config_schema)}


def instance_json(row: PluginInstance, registry) -> dict[str, Any]:
    columns = ("name", "type", "enabled", "max_concurrent_deliveries", "retry_policy",
               "ordered", "queue", "probe_interval", "retention_days", "parties_from",
               "edi_errors", "duplicates", "duplicate_days", "state",
               "state_reason", "online", "probe_checked_at", "probe_text", "created_at",
               "updated_at")
    return {**{key: getattr(row, key) for key in columns}, "config": _masked(row, registry),
            "business_rules": row.business_rules or [],
            "blocked_by": blocked_by_json(row)}


def blocked_by_json(row: PluginInstance) -> dict[str, Any] | None:
    """The delivery that blocks an instance (a business rule with ``block: "instance"``),
    with where to act on it; None when the instance is not blocked."""
    delivery_id = row.blocked_by_delivery_id
    if delivery_id is None:
        return None
    message_id = object_session(row).scalar(select(Delivery.message_id).where(
        Delivery.id == delivery_id))
    return {"delivery_id": delivery_id, "message_id": message_id,
            "resubmit": url_for("api.resubmit_delivery", delivery_id=delivery_id),
            "skip": url_for("api.skip_delivery", delivery_id=delivery_id)}


def _masked(row: PluginInstance, registry) -> dict[str, Any]:
    """The configuration with every secret that is set shown as the mask."""
    schema = registry.get(row.type).config_schema if row.type in registry else []
    secrets = {field.name for field in schema if field.type == "secret"}
    return {key: SECRET_MASK if key in secrets and value else value
            for key, value in (row.config or {}).items()}

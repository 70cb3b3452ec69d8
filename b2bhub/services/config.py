"""Parties, plugin instances and routes: validation shared by the API, UI and fixtures."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from b2bhub.config_schema import ConfigError, validate_config
from b2bhub.domain import routing
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine.dispatch import bump_routes_version, route_cache
from b2bhub.models import ORGANIZATION, PARTNER, Party, PluginInstance, Route
from b2bhub.services.errors import Conflict, NotFound, ServiceError

INSTANCE_FIELDS = {"name", "type", "enabled", "config", "max_concurrent_deliveries",
                   "retry_policy", "ordered", "queue", "probe_interval", "retention_days"}


def _check_name(name: Any, what: str) -> str:
    error = routing.validate_name(name) if isinstance(name, str) else "must be a string"
    if error:
        raise ServiceError(f"{what} name {name!r}: {error}", {"name": error})
    return name


def _name_taken(session: Session, model, name: str) -> bool:
    return session.scalar(select(model.id).where(model.name == name)) is not None


# --- parties ------------------------------------------------------------------------

def create_party(session: Session, kind: str, name: str, display_name: str = "") -> Party:
    if kind not in (ORGANIZATION, PARTNER):
        raise ServiceError(f"party kind must be {ORGANIZATION} or {PARTNER}")
    _check_name(name, kind)
    if _name_taken(session, Party, name):
        raise Conflict(f"a party named '{name}' exists already")
    party = Party(name=name, kind=kind, display_name=display_name or name)
    session.add(party)
    session.flush()
    return party


def get_party(session: Session, kind: str, name: str) -> Party:
    party = session.scalar(select(Party).where(Party.name == name, Party.kind == kind))
    if party is None:
        raise NotFound(f"no {kind} named '{name}'")
    return party


# --- plugin instances ---------------------------------------------------------------

def save_instance(session: Session, registry, data: dict,
                  existing: PluginInstance | None = None) -> PluginInstance:
    """Create or update an instance from the API shape; refuses bad input whole."""
    unknown = set(data) - INSTANCE_FIELDS
    if unknown:
        raise ServiceError(f"unknown field(s): {', '.join(sorted(unknown))}")
    name = _check_name(data.get("name", existing.name if existing else None), "instance")
    type_name = data.get("type", existing.type if existing else None)
    if type_name not in registry:
        known = ", ".join(sorted(registry.types()))
        raise ServiceError(f"unknown plugin type {type_name!r} (known: {known})")
    plugin_cls = registry.get(type_name)
    if existing is None and _name_taken(session, PluginInstance, name):
        raise Conflict(f"an instance named '{name}' exists already")
    try:
        config = validate_config(plugin_cls.config_schema, data.get("config") or {})
        problems = _config_problems(plugin_cls, config)
        if problems:
            raise ConfigError(problems)
    except ConfigError as exc:
        raise ServiceError(f"invalid configuration: {exc}", {"config": exc.errors}) from exc
    row = existing or PluginInstance(name=name, type=type_name)
    row.config = config
    _apply_delivery_fields(row, data, plugin_cls)
    session.add(row)
    session.flush()
    return row


def _config_problems(plugin_cls, config: dict) -> dict[str, str]:
    """The plugin's own checks across fields (e.g. a poller's pattern and its to)."""
    check = getattr(plugin_cls, "config_problems", None)
    return check(config) if callable(check) else {}


def _apply_delivery_fields(row: PluginInstance, data: dict, plugin_cls) -> None:
    if "enabled" in data:
        row.enabled = bool(data["enabled"])
    mcd = data.get("max_concurrent_deliveries", row.max_concurrent_deliveries or 4)
    if not isinstance(mcd, int) or isinstance(mcd, bool) or mcd < 1:
        raise ServiceError("max_concurrent_deliveries must be a whole number of at least 1")
    row.max_concurrent_deliveries = mcd
    if "retry_policy" in data:
        try:
            RetryPolicy.from_dict(data["retry_policy"], plugin_cls.default_retry_policy)
        except ValueError as exc:
            raise ServiceError(f"invalid retry_policy: {exc}") from exc
        row.retry_policy = data["retry_policy"] or None
    for key in ("ordered", "queue", "probe_interval", "retention_days"):
        if key in data:
            setattr(row, key, data[key])


def get_instance(session: Session, name: str) -> PluginInstance:
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == name))
    if row is None:
        raise NotFound(f"no plugin instance named '{name}'")
    return row


# --- routes -------------------------------------------------------------------------

def create_route(session: Session, registry, source: str, from_party: str, to_party: str,
                 target: str, actor: str = "") -> Route:
    """Validate and save a route; refuses one redundant with a route already there."""
    _check_route_end(session, registry, source, "source")
    _check_route_end(session, registry, target, "target")
    for field, name in (("from", from_party), ("to", to_party)):
        if name != routing.ANY and not _name_taken(session, Party, name):
            raise ServiceError(f"{field}: no party named {name!r}", {field: "unknown party"})
    new = routing.Route(None, source, from_party, to_party, target)
    in_the_way = routing.redundant_with(new, route_cache.table(session).routes)
    if in_the_way is not None:
        raise Conflict(f"redundant with {in_the_way.describe()}",
                       {"route": in_the_way.id}, code="redundant_route")
    row = Route(source=source, from_party=from_party, to_party=to_party, target=target,
                created_by=actor)
    session.add(row)
    bump_routes_version(session)
    session.flush()
    return row


def _check_route_end(session: Session, registry, name: str, role: str) -> None:
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == name))
    if row is None:
        raise ServiceError(f"{role}: no plugin instance named {name!r}")
    if not row.enabled:
        raise ServiceError(f"{role}: instance {name!r} is disabled")
    able = row.type in registry and role in registry.get(row.type).roles
    if not able:
        raise ServiceError(f"{role}: instance {name!r} ({row.type}) cannot "
                           f"{'start' if role == 'source' else 'end'} a route")


def delete_route(session: Session, route_id: int) -> None:
    row = session.get(Route, route_id)
    if row is None:
        raise NotFound(f"no route {route_id}")
    session.delete(row)
    bump_routes_version(session)


def test_route(session: Session, source: str, from_party: str, to_party: str) -> dict:
    """The route tester: which targets a message would reach, and why."""
    table = route_cache.table(session)
    return {"targets": table.targets(source, from_party, to_party),
            "routes": table.explain(source, from_party, to_party)}

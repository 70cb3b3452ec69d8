"""Parties, plugin instances and routes: validation shared by the API, UI and fixtures."""

from __future__ import annotations

from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from b2bhub.domain import business_rules, routing
from b2bhub.domain.i18n import N_, joined
from b2bhub.domain.retention import KEEP_FOREVER
from b2bhub.domain.retry import RetryPolicy
from b2bhub.engine.dispatch import bump_routes_version, route_cache
from b2bhub.engine.envelope_checks import DUPLICATES, EDI_ERRORS, MAX_DUPLICATE_DAYS
from b2bhub.engine.envelope_parties import PARTIES_FROM, SOURCE
from b2bhub.engine.history import add_line
from b2bhub.engine.settings import PROFILES_VERSION_KEY, bump_version
from b2bhub.models import ORGANIZATION, PARTNER, Party, PluginInstance, Route
from b2bhub.models.pages import Page, keyset_page
from b2bhub.plugin.schema import ConfigError, validate_config
from b2bhub.services.errors import Conflict, NotFound, ServiceError
from b2bhub.services.identities import set_ack_settings, set_identities

#: how a stored secret is shown; sent back unchanged, it keeps the stored value
SECRET_MASK = "********"

#: a target's probe interval: 0 follows the System > Settings one; else at least the
#: probe tick (b2bhub.engine.probes.TICK_SECONDS)
MIN_PROBE_INTERVAL = 5
#: the largest value of each whole-number field of an instance: far beyond any real use,
#: and within the 32-bit integer columns that hold them (beyond those, PostgreSQL would
#: refuse the row and the caller would see a server error instead of the rule)
MAX_CONCURRENT_DELIVERIES = 10_000
MAX_PROBE_INTERVAL = 7 * 86_400  # a week, in seconds
MAX_RETENTION_DAYS = 36_500  # a hundred years
PROBE_INTERVAL_RULE = N_("probe_interval must be 0 (the System > Settings probe interval) "
                         "or from %(least)s to %(most)s seconds", least=MIN_PROBE_INTERVAL,
                         most=MAX_PROBE_INTERVAL)

INSTANCE_FIELDS = {"name", "type", "enabled", "config", "max_concurrent_deliveries",
                   "retry_policy", "ordered", "queue", "probe_interval", "retention_days",
                   "parties_from", "edi_errors", "duplicates", "duplicate_days",
                   "business_rules"}
#: a source's checks of envelopes at intake (docs/edi.md), each change a history line
CHECK_FIELDS = ("edi_errors", "duplicates", "duplicate_days")


def _check_name(name: Any, what: str) -> str:
    error = routing.validate_name(name) if isinstance(name, str) else N_("must be a string")
    if error:
        said = {ORGANIZATION: N_("organization name %(name)r: %(error)s"),
                PARTNER: N_("partner name %(name)r: %(error)s"),
                "instance": N_("instance name %(name)r: %(error)s")}[what]
        # beside the field, where the name is shown: the rule alone
        raise ServiceError(N_(said, name=name, error=error),
                           {"name": N_("must be %(rule)s", rule=routing.NAME_RULE)
                            if isinstance(name, str) else error})
    return name


def _name_taken(session: Session, model, name: str) -> bool:
    return session.scalar(select(model.id).where(model.name == name)) is not None


# --- parties ------------------------------------------------------------------------

def create_party(session: Session, kind: str, name: str, display_name: str = "",
                 edi_identities: list[str] | None = None, actor: str = "",
                 acks: dict | None = None) -> Party:
    if kind not in (ORGANIZATION, PARTNER):
        raise ServiceError(N_("party kind must be %(organization)s or %(partner)s",
                              organization=ORGANIZATION, partner=PARTNER))
    _check_name(name, kind)
    _check_display_name(display_name)
    if _name_taken(session, Party, name):
        raise Conflict(N_("a party named '%(name)s' exists already", name=name))
    party = Party(name=name, kind=kind, display_name=display_name or name)
    session.add(party)
    session.flush()
    set_identities(session, party, edi_identities, actor)
    set_ack_settings(session, party, acks or {}, actor)
    return party


def _check_display_name(display_name: object) -> None:
    if not isinstance(display_name, str) or len(display_name) > 200:
        raise ServiceError(N_("display_name must be text of at most 200 characters"),
                           {"display_name": "not text or too long"})


def get_party(session: Session, kind: str, name: str) -> Party:
    party = session.scalar(select(Party).where(Party.name == name, Party.kind == kind))
    if party is None:
        raise NotFound(no_party(kind, name))
    return party


def no_party(kind: str, name: str) -> str:
    """That no organization (or partner) has that name, as a whole sentence."""
    if kind == ORGANIZATION:
        return N_("no organization named '%(name)s'", name=name)
    if kind == PARTNER:
        return N_("no partner named '%(name)s'", name=name)
    return N_("no %(kind)s named '%(name)s'", kind=kind, name=name)


def no_profile(kind: str, name: str, protocol: str) -> str:
    """That the party has no profile of that protocol, as a whole sentence."""
    if kind == ORGANIZATION:
        return N_("organization '%(name)s' has no %(protocol)s profile", name=name,
                  protocol=protocol)
    return N_("partner '%(name)s' has no %(protocol)s profile", name=name,
              protocol=protocol)


def list_parties(session: Session, kind: str, limit: int, after: str | None = None) -> Page:
    """Organizations or partners by name."""
    return keyset_page(session, select(Party).where(Party.kind == kind), Party.name,
                       limit, after)


def update_party(session: Session, kind: str, name: str, display_name: str,
                 edi_identities: list[str] | None = None, actor: str = "",
                 acks: dict | None = None) -> Party:
    """Change a party's display name and, unless None, its EDI identities, and the
    acknowledgment settings ``acks`` holds; its name is what routes and messages refer
    to."""
    _check_display_name(display_name)
    party = get_party(session, kind, name)
    party.display_name = display_name or name
    session.flush()
    set_identities(session, party, edi_identities, actor)
    set_ack_settings(session, party, acks or {}, actor)
    return party


def delete_party(session: Session, kind: str, name: str) -> None:
    """Delete a party, refused while a route names it (the route would never match)."""
    party = get_party(session, kind, name)
    _refuse_while_routed(session, or_(Route.from_party == name, Route.to_party == name),
                         N_("organization '%(name)s' is named by %(route)s")
                         if kind == ORGANIZATION else
                         N_("partner '%(name)s' is named by %(route)s"), name=name)
    session.delete(party)
    bump_version(session, PROFILES_VERSION_KEY)  # its profiles go with it
    session.flush()


def _refuse_while_routed(session: Session, condition, what: str, **params) -> None:
    """Refuse a delete while a route depends on the thing, naming the first such route
    (``what``: the sentence, its ``%(route)s`` the route)."""
    route = session.scalar(select(Route).where(condition).order_by(Route.id).limit(1))
    if route is not None:
        raise Conflict(N_(what, route=_describe(route), **params),
                       {"route": route.id}, code="in_use")


def _describe(row: Route) -> str:
    return routing.Route(row.id, row.source, row.from_party, row.to_party, row.target,
                         row.document_type).describe()


# --- plugin instances ---------------------------------------------------------------

def save_instance(session: Session, registry, data: dict,
                  existing: PluginInstance | None = None, *,
                  strict: bool = False, actor: str = "") -> PluginInstance:
    """Create or update an instance from the API shape; refuses bad input whole.

    ``strict``: ``config`` is a JSON body's, each value of its field's JSON type (the
    API); else form-style text is coerced ("10" -> 10), as an HTML form and a fixtures
    file send it. Updating without ``config`` keeps the stored one."""
    unknown = set(data) - INSTANCE_FIELDS
    if unknown:
        raise ServiceError(N_("unknown field(s): %(fields)s",
                              fields=", ".join(sorted(unknown))))
    refusals: list[ServiceError] = []  # every mistake at once, so a form shows them all
    name = data.get("name", existing.name if existing else None)
    try:
        _check_name(name, "instance")
    except ServiceError as exc:
        refusals.append(exc)
    if existing is not None and name != existing.name:
        raise ServiceError(N_("instance '%(old)s' cannot be renamed to '%(new)s': routes "
                              "and messages refer to it by name", old=existing.name,
                              new=name), {"name": "renamed"})
    type_name = data.get("type", existing.type if existing else None)
    if existing is not None and type_name != existing.type:
        # the stored config, deliveries and running plugin all belong to the old type
        raise ServiceError(N_("instance '%(name)s' is a %(type)s; its type cannot change "
                              "(create a new instance instead)", name=name,
                              type=existing.type), {"type": "changed"})
    if not isinstance(type_name, str) or type_name not in registry:
        known = ", ".join(sorted(registry.types()))
        raise ServiceError(N_("unknown plugin type %(type)r (known: %(known)s)",
                              type=type_name, known=known),
                           {"type": "unknown"})
    plugin_cls = registry.get(type_name)
    if not refusals and existing is None and _name_taken(session, PluginInstance, name):
        refusals.append(Conflict(N_("an instance named '%(name)s' exists already",
                                    name=name),
                                 {"name": N_("taken by another instance")}))
    kept = existing is not None and "config" not in data
    given = dict(existing.config or {}) if kept else data.get("config") or {}
    if not isinstance(given, dict):
        raise ServiceError(N_("config must be an object"), {"config": "not an object"})
    if existing is not None:
        given = _keep_secrets(plugin_cls.config_schema, given, existing.config or {})
    rules = _rules_checked(data, plugin_cls)
    try:
        # the stored configuration, kept, is checked again as a form's is
        config = validate_config(plugin_cls.config_schema, given, strict=strict and not kept)
        problems = _config_problems(plugin_cls, config)
        if problems:
            raise ConfigError(problems)
    except ConfigError as exc:
        refusals.append(ServiceError(N_("invalid configuration: %(problems)s",
                                        problems=exc.text), {"config": exc.errors}))
    if isinstance(rules, ServiceError):
        refusals.append(rules)
    refusals += _delivery_field_problems(data, plugin_cls, existing)
    if refusals:
        raise together(refusals)
    row = existing or PluginInstance(name=name, type=type_name)
    row.config = config
    before = _checks_of(existing)
    _apply_delivery_fields(row, data)
    _record_checks(session, row, before, actor)
    if "business_rules" in data:
        row.business_rules = rules
    session.add(row)
    session.flush()
    return row


def _checks_of(row: PluginInstance | None) -> dict:
    """An instance's intake checks as stored (a new one's: the defaults)."""
    columns = PluginInstance.__table__.c
    return {key: getattr(row, key) if row is not None else columns[key].default.arg
            for key in CHECK_FIELDS}


def _record_checks(session: Session, row: PluginInstance, before: dict, actor: str) -> None:
    """A ``config_changed`` line naming the operator when the checks changed."""
    after = {key: getattr(row, key) if getattr(row, key) is not None else before[key]
             for key in CHECK_FIELDS}
    changed = [f"{key} {after[key]} (was {before[key]})" for key in CHECK_FIELDS
               if after[key] != before[key]]
    if changed:
        add_line(session, None, "config_changed",
                 f"{actor or 'system'}: intake checks of instance {row.name}: "
                 f"{', '.join(changed)}", actor=actor, data={"after": after, "before": before})


def _keep_secrets(schema, given: dict, stored: dict) -> dict:
    """A secret shown as :data:`SECRET_MASK` and sent back unchanged keeps its value."""
    secrets = {f.name for f in schema if f.type == "secret"}
    return {key: stored.get(key) if key in secrets and value == SECRET_MASK else value
            for key, value in given.items()}


def _check_types(data: dict) -> None:
    """Refuse wrongly typed delivery fields before they reach a column."""
    for key, kinds, words in (("enabled", (bool,), N_("true or false")),
                              ("ordered", (bool,), N_("true or false")),
                              ("probe_interval", (int,), N_("a whole number of seconds")),
                              ("retention_days", (int, type(None)),
                               N_("a whole number or null")),
                              ("queue", (str, type(None)), N_("a queue name or null")),
                              ("parties_from", (str,), "'source' or 'envelope'"),
                              ("edi_errors", (str,), "'accept' or 'refuse'"),
                              ("duplicates", (str,), "'alert' or 'refuse'"),
                              ("duplicate_days", (int,), N_("a whole number of days"))):
        value = data.get(key)
        if key in data and (not isinstance(value, kinds) or
                            (isinstance(value, bool) and bool not in kinds)):
            raise ServiceError(N_("%(key)s must be %(words)s", key=key, words=words),
                               {key: N_("must be %(words)s", words=words)})
    retention = data.get("retention_days")
    if retention is not None and not KEEP_FOREVER <= retention <= MAX_RETENTION_DAYS:
        raise ServiceError(N_("retention_days must be a whole number of days up to "
                              "%(most)s, 0 or null for the default, or -1 to keep forever",
                              most=MAX_RETENTION_DAYS),
                           {"retention_days": N_("must be from -1 (-1: keep forever) to "
                                                 "%(most)s", most=MAX_RETENTION_DAYS)})
    if data.get("parties_from", SOURCE) not in PARTIES_FROM:
        raise ServiceError(N_("parties_from must be 'source' (the source's path or "
                              "configuration) or 'envelope' (its EDI identities)"),
                           {"parties_from": "must be 'source' or 'envelope'"})
    if data.get("edi_errors", EDI_ERRORS[0]) not in EDI_ERRORS:
        raise ServiceError(N_("edi_errors must be 'accept' (delivered, the envelope "
                              "errors in its history) or 'refuse' (stored Refused)"),
                           {"edi_errors": "must be 'accept' or 'refuse'"})
    if data.get("duplicates", DUPLICATES[0]) not in DUPLICATES:
        raise ServiceError(N_("duplicates must be 'alert' (delivered, with a "
                              "duplicate_received line and alert) or 'refuse' (stored "
                              "Refused)"),
                           {"duplicates": "must be 'alert' or 'refuse'"})
    if not 0 <= data.get("duplicate_days", 0) <= MAX_DUPLICATE_DAYS:
        raise ServiceError(N_("duplicate_days must be from 0 (no duplicate check) to "
                              "%(most)s days", most=MAX_DUPLICATE_DAYS),
                           {"duplicate_days": N_("must be from 0 (no check) to %(most)s",
                                                 most=MAX_DUPLICATE_DAYS)})
    if data.get("queue") is not None and routing.validate_name(data["queue"]):
        raise ServiceError(N_("queue: %(problem)s",
                              problem=routing.validate_name(data["queue"])),
                           {"queue": "invalid name"})


def _config_problems(plugin_cls, config: dict) -> dict[str, str]:
    """The plugin's own checks across fields (e.g. a poller's pattern and its to)."""
    check = getattr(plugin_cls, "config_problems", None)
    return check(config) if callable(check) else {}


def together(refusals: list[ServiceError]) -> ServiceError:
    """One refusal of several, each reason said once: the one as it is, or all their
    messages joined and their details merged (a form puts each beside its field)."""
    if len(refusals) == 1:
        return refusals[0]
    details: dict = {}
    for refusal in refusals:
        details.update(refusal.details or {})
    return ServiceError(joined(r.message for r in refusals), details)


def _delivery_field_problems(data: dict, plugin_cls,
                             existing: PluginInstance | None) -> list[ServiceError]:
    """What is wrong with the delivery fields (each one's refusal, all at once)."""
    problems = []
    try:
        _check_types(data)
    except ServiceError as exc:
        problems.append(exc)
    mcd = data.get("max_concurrent_deliveries",
                   (existing.max_concurrent_deliveries if existing else None) or 4)
    if (not isinstance(mcd, int) or isinstance(mcd, bool)
            or not 1 <= mcd <= MAX_CONCURRENT_DELIVERIES):
        rule = N_("must be a whole number from 1 to %(most)s",
                  most=MAX_CONCURRENT_DELIVERIES)
        problems.append(ServiceError(N_("max_concurrent_deliveries %(rule)s", rule=rule),
                                     {"max_concurrent_deliveries": rule}))
    if "retry_policy" in data:
        try:
            # optional on a plugin type, as for the runner that applies the policy
            RetryPolicy.from_dict(data["retry_policy"],
                                  getattr(plugin_cls, "default_retry_policy", None))
        except ValueError as exc:
            problems.append(ServiceError(N_("invalid retry_policy: %(problem)s",
                                            problem=exc.args[0]),
                                         {"retry_policy": exc.args[0]}))
    interval = data.get("probe_interval", 0)
    if (isinstance(interval, int) and interval != 0
            and not MIN_PROBE_INTERVAL <= interval <= MAX_PROBE_INTERVAL):
        problems.append(ServiceError(PROBE_INTERVAL_RULE,
                                     {"probe_interval": PROBE_INTERVAL_RULE}))
    return problems


def _apply_delivery_fields(row: PluginInstance, data: dict) -> None:
    """Set the delivery fields :func:`_delivery_field_problems` found right."""
    if "enabled" in data:
        row.enabled = data["enabled"]
    row.max_concurrent_deliveries = data.get("max_concurrent_deliveries",
                                             row.max_concurrent_deliveries or 4)
    if "retry_policy" in data:
        row.retry_policy = data["retry_policy"] or None
    for key in ("ordered", "queue", "probe_interval", "retention_days", "parties_from",
                *CHECK_FIELDS):
        if key in data:
            setattr(row, key, data[key])


def _rules_checked(data: dict, plugin_cls) -> list[dict] | None | ServiceError:
    """The given business rules validated, as stored; or the refusal (returned, not
    raised, so it can be reported with the configuration's), naming each bad rule and
    why. Only a target has an answer to check."""
    given = data.get("business_rules")
    if given and "target" not in plugin_cls.roles:
        return ServiceError(N_("business_rules: only a target instance takes business "
                               "rules"),
                            {"business_rules": N_("only a target instance takes them")})
    try:
        return business_rules.normalize(given)
    except business_rules.RulesError as exc:
        whole = exc.errors.get("business_rules")  # not a list at all
        return ServiceError(N_("invalid business_rules: %(problem)s",
                               problem=whole or exc.args[0]),
                            {"business_rules": whole or exc.errors})


def get_instance(session: Session, name: str) -> PluginInstance:
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == name))
    if row is None:
        raise NotFound(N_("no plugin instance named '%(name)s'", name=name))
    return row


def list_instances(session: Session, limit: int, after: str | None = None) -> Page:
    """Plugin instances by name."""
    return keyset_page(session, select(PluginInstance), PluginInstance.name, limit, after)


def delete_instance(session: Session, name: str) -> None:
    """Delete an instance, refused while a route starts or ends at it."""
    row = get_instance(session, name)
    _refuse_while_routed(session, or_(Route.source == name, Route.target == name),
                         N_("instance '%(name)s' is used by %(route)s"), name=name)
    session.delete(row)
    session.flush()


# --- routes -------------------------------------------------------------------------

def create_route(session: Session, registry, source: str, from_party: str, to_party: str,
                 target: str, actor: str = "", document_type: str = routing.ANY) -> Route:
    """Validate and save a route; refuses one redundant with a route already there."""
    _check_route_fields(source=source, **{"from": from_party, "to": to_party}, target=target)
    problem = routing.validate_document_type(document_type)
    if problem:
        raise ServiceError(problem, {"document_type": "invalid"})
    _check_route_end(session, registry, source, "source")
    _check_route_end(session, registry, target, "target")
    for field, name in (("from", from_party), ("to", to_party)):
        if name != routing.ANY and not _name_taken(session, Party, name):
            raise ServiceError(N_("%(field)s: no party named %(name)r", field=field,
                                  name=name), {field: "unknown party"})
    new = routing.Route(None, source, from_party, to_party, target, document_type)
    in_the_way = routing.redundant_with(new, route_cache.table(session).routes)
    if in_the_way is not None:
        raise Conflict(N_("redundant with %(route)s", route=in_the_way.describe()),
                       {"route": in_the_way.id}, code="redundant_route")
    row = Route(source=source, from_party=from_party, to_party=to_party, target=target,
                document_type=document_type, created_by=actor)
    session.add(row)
    bump_routes_version(session)
    session.flush()
    return row


def _check_route_fields(**values: object) -> None:
    for field, value in values.items():
        if not isinstance(value, str) or not value:
            raise ServiceError(N_("%(field)s must be a name or '*'", field=field),
                               {field: "missing or not text"})


def _check_route_end(session: Session, registry, name: str, role: str) -> None:
    row = session.scalar(select(PluginInstance).where(PluginInstance.name == name))
    if row is None:
        raise ServiceError(N_("%(role)s: no plugin instance named %(name)r", role=role,
                              name=name), {role: "unknown"})
    if not row.enabled:
        raise ServiceError(N_("%(role)s: instance %(name)r is disabled", role=role,
                              name=name), {role: "disabled"})
    able = row.type in registry and role in registry.get(row.type).roles
    if not able:
        wrong = (N_("%(role)s: instance %(name)r (%(type)s) cannot start a route",
                    role=role, name=name, type=row.type) if role == "source" else
                 N_("%(role)s: instance %(name)r (%(type)s) cannot end a route",
                    role=role, name=name, type=row.type))
        raise ServiceError(wrong,
                           {role: "wrong role"})


def list_routes(session: Session, limit: int, after: int | None = None) -> Page:
    """Routes in the order they were made."""
    return keyset_page(session, select(Route), Route.id, limit, after)


def delete_route(session: Session, route_id: int) -> None:
    row = session.get(Route, route_id)
    if row is None:
        raise NotFound(N_("no route %(id)s", id=route_id))
    session.delete(row)
    bump_routes_version(session)


def replace_route(session: Session, registry, route_id: int, source: str, from_party: str,
                  to_party: str, target: str, actor: str = "",
                  document_type: str = routing.ANY) -> Route:
    """Edit a route: the old one goes and the new one is checked as if it were new (so
    it may not be redundant with any other route), in the caller's transaction."""
    delete_route(session, route_id)
    session.flush()
    return create_route(session, registry, source, from_party, to_party, target, actor,
                        document_type)


def test_route(session: Session, source: str, from_party: str, to_party: str,
               document_types: list[str] | None = None) -> dict:
    """The route tester: which targets a message would reach, and why;
    ``document_types``: those of the message's envelope (none: a message without one)."""
    _check_route_fields(source=source, **{"from": from_party, "to": to_party})
    table = route_cache.table(session)
    return {"targets": table.targets(source, from_party, to_party, document_types),
            "routes": table.explain(source, from_party, to_party, document_types)}


def run_instance_action(session: Session, registry, name: str, action: str, body: dict,
                        actor: str):
    """An operator's action on an instance (``Plugin.instance_actions``): the type runs
    it, its configuration changes are saved as a save is (checked, secrets kept), and a
    ``config_changed`` line names the operator. Returns the type's
    :class:`b2bhub.plugin.InstanceActionResult`; NotFound for an action the type does
    not offer."""
    row = get_instance(session, name)
    plugin_cls = registry.get(row.type) if row.type in registry else None
    offered = tuple(getattr(plugin_cls, "instance_actions", ()) or ())
    if action not in offered:
        raise NotFound(N_("instance '%(name)s' (%(type)s) has no action '%(action)s'; "
                          "offered: %(offered)s", name=name, type=row.type, action=action,
                          offered=", ".join(offered) or "none"))
    result = plugin_cls.run_instance_action(dict(row.config or {}), action, body)
    if result.changes:
        save_instance(session, registry, {"config": {**(row.config or {}),
                                                     **result.changes}}, row, actor=actor)
    add_line(session, None, "config_changed", f"{actor or 'system'}: instance {name}: "
             f"{result.text}", actor=actor)
    session.flush()
    return result

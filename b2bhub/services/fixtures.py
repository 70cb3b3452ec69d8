"""``b2bhub fixtures load``: the API's shapes, in dependency order, all or nothing."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

from sqlalchemy.orm import Session

from b2bhub.domain.i18n import N_
from b2bhub.models import ORGANIZATION, PARTNER, utcnow
from b2bhub.services import config as svc
from b2bhub.services import expected
from b2bhub.services.errors import ServiceError
from b2bhub.services.identities import ACK_FIELDS

SECTIONS = ("organizations", "partners", "profiles", "plugins", "routes", "expected")
#: sections reported only when the file has them (older files name four)
OPTIONAL = ("profiles", "expected")


def load_fixtures(session: Session, data: dict, actor: str = "fixtures",
                  registry=None) -> dict[str, int]:
    """Create what ``data`` describes in the caller's transaction; a ServiceError names
    the first bad item (the caller rolls back, so nothing is created)."""
    if registry is None:
        from b2bhub.runtime.hub import registry as current_registry
        registry = current_registry()
    sections = _sections(data)
    for kind, key in ((ORGANIZATION, "organizations"), (PARTNER, "partners")):
        for n, party in enumerate(sections[key], 1):
            name = _field(party, "name", key, n)
            with _naming(f"{key[:-1]} {n} ({name})"):
                svc.create_party(session, kind, name, party.get("display_name", ""),
                                 party.get("edi_identities"), actor,
                                 acks={field: party[field] for field in ACK_FIELDS
                                       if field in party})
    for n, profile in enumerate(sections["profiles"], 1):
        _load_profile(session, profile, n, registry)
    for n, instance in enumerate(sections["plugins"], 1):
        with _naming(f"plugin {n} ({instance.get('name', 'no name')})"):
            svc.save_instance(session, registry, instance, actor=actor)
    for n, route in enumerate(sections["routes"], 1):
        source, target = (_field(route, k, "routes", n) for k in ("source", "target"))
        with _naming(f"route {n}"):
            svc.create_route(session, registry, source, route.get("from", "*"),
                             route.get("to", "*"), target, actor,
                             route.get("document_type", "*"))
    for n, rule in enumerate(sections["expected"], 1):
        with _naming(f"expected {n} ({rule.get('name', 'no name')})"):
            expected.create_rule(session, rule, actor, utcnow())
    return {key: len(sections[key]) for key in SECTIONS
            if key not in OPTIONAL or sections[key]}


def _load_profile(session: Session, item: dict, n: int, registry) -> None:
    """``{"party": name, "protocol": kind, ...that kind's API fields}``; ``protocol`` may
    be left out while one profile kind is registered (files of older versions)."""
    from b2bhub.models import Party
    from b2bhub.services.profiles import profile_kinds
    name = _field(item, "party", "profiles", n)
    kinds = profile_kinds(registry)
    # older files knew the plugins' kinds alone, not the core's own (openpgp)
    older = [kind for kind in kinds if kind != "openpgp"]
    protocol = item.get("protocol", older[0] if len(older) == 1 else None)
    if protocol not in kinds:
        raise ServiceError(N_("profile %(n)s: unknown protocol %(protocol)r", n=n,
                              protocol=item.get("protocol")))
    party = session.query(Party).filter_by(name=name).one_or_none()
    if party is None:
        raise ServiceError(N_("profile %(n)s: no party named %(name)r", n=n, name=name))
    body = {k: v for k, v in item.items() if k not in ("party", "protocol")}
    try:
        kinds[protocol].save(session, party.kind, name, body)
    except ServiceError as exc:
        raise ServiceError(N_("profile %(n)s (%(name)s): %(problem)s", n=n, name=name,
                              problem=exc.message), exc.details) from None


@contextmanager
def _naming(entry: str):
    """A refusal of the entry's service call names the entry first, so that a user
    finds it in the file (``plugin 2 (inbox): base_directory: required``)."""
    try:
        yield
    except ServiceError as exc:
        exc.message = f"{entry}: {exc.message}"  # its kind (not found, conflict) stays
        exc.args = (exc.message,)
        raise


def _sections(data: Any) -> dict[str, list[dict]]:
    if not isinstance(data, dict):
        raise ServiceError(N_("a fixtures file holds one JSON object"))
    sections = {key: data.get(key) or [] for key in SECTIONS}
    for key, items in sections.items():
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise ServiceError(N_("%(key)s must be a list of objects", key=key))
    return sections


def _field(item: dict, key: str, section: str, n: int) -> Any:
    if key not in item:
        raise ServiceError(N_("%(item)s %(n)s: missing '%(key)s'", item=section[:-1], n=n,
                              key=key))
    return item[key]

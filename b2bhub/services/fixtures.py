"""``b2bhub fixtures load``: the API's shapes, in dependency order, all or nothing."""

from __future__ import annotations

from sqlalchemy.orm import Session

from b2bhub.models import ORGANIZATION, PARTNER
from b2bhub.services import config as svc


def load_fixtures(session: Session, data: dict, actor: str = "fixtures",
                  registry=None) -> dict[str, int]:
    if registry is None:
        from b2bhub.hub import registry as current_registry
        registry = current_registry()
    counts = {"organizations": 0, "partners": 0, "plugins": 0, "routes": 0}
    for kind, key in ((ORGANIZATION, "organizations"), (PARTNER, "partners")):
        for party in data.get(key, []):
            svc.create_party(session, kind, party["name"], party.get("display_name", ""))
            counts[key] += 1
    for instance in data.get("plugins", []):
        svc.save_instance(session, registry, instance)
        counts["plugins"] += 1
    for route in data.get("routes", []):
        svc.create_route(session, registry, route["source"], route.get("from", "*"),
                         route.get("to", "*"), route["target"], actor)
        counts["routes"] += 1
    return counts

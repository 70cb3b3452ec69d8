"""Routes (``/routes``) and the route tester."""

from __future__ import annotations

from flask import g

import b2bhub.api.schemas as s
from b2bhub.api.auth import requires
from b2bhub.api.blueprint import bp
from b2bhub.config.extensions import db
from b2bhub.domain import routing
from b2bhub.engine.history import add_line
from b2bhub.models import Route
from b2bhub.runtime.hub import registry
from b2bhub.services import config as svc


@bp.get("/routes")
@bp.arguments(s.SmallIdPageArgs, location="query")
@bp.response(200, s.RoutePage)
def list_routes(args: dict):
    """Routes in the order they were made."""
    return s.page_json(svc.list_routes(db.session, args["limit"], args.get("cursor")))


@bp.post("/routes", refusals=(409,),
         server_checks=("source", "from", "to", "target", "document_type"))
@bp.arguments(s.RouteCreate)
@bp.response(201, s.Route)
def create_route(body: dict):
    """``from``, ``to`` and ``document_type`` default to ``*`` (any); a route naming a
    document type (``850``, ``ORDERS``) takes only messages whose envelope holds one of
    that type (docs/edi.md). A route redundant with one already there is refused (409
    ``redundant_route``, naming it)."""
    route = svc.create_route(db.session, registry(), body["source"], body["from_party"],
                             body["to_party"], body["target"], actor=g.actor,
                             document_type=body["document_type"])
    _record(f"created {_route(route).describe()}")
    db.session.commit()
    return route


@bp.delete(f"/routes/<{s.SMALL_ID}:route_id>")
@bp.response(204)
def delete_route(route_id: int):
    route = db.session.get(Route, route_id)
    svc.delete_route(db.session, route_id)
    _record(f"deleted {_route(route).describe()}")
    db.session.commit()


def _route(row: Route) -> routing.Route:
    return routing.Route(row.id, row.source, row.from_party, row.to_party, row.target,
                         row.document_type)


def _record(text: str) -> None:
    """A route changed through the API, recorded as the UI's changes are: a
    ``config_changed`` line naming the caller (the audit export shows it)."""
    add_line(db.session, None, "config_changed", f"{g.actor}: {text}", actor=g.actor)


@bp.post("/routes/test", summary="Test which targets a message would reach")
@requires("viewer")  # it changes nothing: whoever may read routes may test them
@bp.arguments(s.RouteTestArgs)
@bp.response(200, s.RouteTestResult)
def test_route(body: dict):
    """Which targets a message from this source and parties, with an envelope holding
    ``document_types`` (none: a message without an envelope), would reach, and why."""
    return svc.test_route(db.session, body["source"], body["from_party"], body["to_party"],
                          body["document_types"])

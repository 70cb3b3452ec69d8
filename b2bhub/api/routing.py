"""Routes (``/routes``) and the route tester."""

from __future__ import annotations

from flask import g, jsonify

from b2bhub.api import bp
from b2bhub.api.auth import requires
from b2bhub.api.inputs import cursor_arg, json_object, limit_arg
from b2bhub.api.shapes import page_json, route_json
from b2bhub.domain.routing import ANY
from b2bhub.extensions import db
from b2bhub.hub import registry
from b2bhub.services import config as svc


@bp.get("/routes")
def list_routes():
    page = svc.list_routes(db.session, limit_arg(), cursor_arg(int))
    return jsonify(page_json(page, route_json))


@bp.post("/routes")
def create_route():
    body = json_object(("source", "from", "to", "target"), required=("source", "target"))
    route = svc.create_route(db.session, registry(), body["source"], body.get("from", ANY),
                             body.get("to", ANY), body["target"], actor=g.actor)
    db.session.commit()
    return jsonify(route_json(route)), 201


@bp.delete("/routes/<int:route_id>")
def delete_route(route_id: int):
    svc.delete_route(db.session, route_id)
    db.session.commit()
    return "", 204


@bp.post("/routes/test")
@requires("viewer")  # it changes nothing: whoever may read routes may test them
def test_route():
    body = json_object(("source", "from", "to"), required=("source",))
    result = svc.test_route(db.session, body["source"], body.get("from", ANY),
                            body.get("to", ANY))
    return jsonify(result)

"""Plugin types and plugin instances (``/plugins/configs``)."""

from __future__ import annotations

from flask import jsonify, url_for

from b2bhub.api import bp
from b2bhub.api.inputs import cursor_arg, json_object, limit_arg
from b2bhub.api.shapes import instance_json, page_json, plugin_type_json
from b2bhub.extensions import db
from b2bhub.hub import registry
from b2bhub.services import config as svc


@bp.get("/plugins/types")
def list_plugin_types():
    items = [plugin_type_json(cls) for cls in registry().types().values()]
    return jsonify({"items": items, "next_cursor": None})


@bp.get("/plugins/configs")
def list_instances():
    page = svc.list_instances(db.session, limit_arg(), cursor_arg(str))
    types = registry()
    return jsonify(page_json(page, lambda row: instance_json(row, types)))


@bp.post("/plugins/configs")
def create_instance():
    body = json_object(svc.INSTANCE_FIELDS, required=("name", "type"))
    row = svc.save_instance(db.session, registry(), body)
    db.session.commit()
    location = url_for(".get_instance", name=row.name)
    return jsonify(instance_json(row, registry())), 201, {"Location": location}


@bp.get("/plugins/configs/<name>")
def get_instance(name: str):
    return jsonify(instance_json(svc.get_instance(db.session, name), registry()))


@bp.put("/plugins/configs/<name>")
def update_instance(name: str):
    body = json_object(svc.INSTANCE_FIELDS)
    row = svc.save_instance(db.session, registry(), body, svc.get_instance(db.session, name))
    db.session.commit()
    return jsonify(instance_json(row, registry()))


@bp.delete("/plugins/configs/<name>")
def delete_instance(name: str):
    svc.delete_instance(db.session, name)
    db.session.commit()
    return "", 204

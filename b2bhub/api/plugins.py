"""Plugin types and plugin instances (``/plugins/configs``)."""

from __future__ import annotations

from flask import g, url_for

import b2bhub.api.schemas as s
from b2bhub.api.auth import requires
from b2bhub.api.blueprint import bp
from b2bhub.api.shapes import instance_json, plugin_type_json
from b2bhub.extensions import db
from b2bhub.hub import registry
from b2bhub.services import config as svc
from b2bhub.services.intake_tokens import token_keeper


@bp.document_hook
def document_plugin_types(doc: dict, registry) -> None:
    """An instance's ``type`` is one of the app's plugin types."""
    if registry is not None:
        doc["components"]["schemas"]["InstanceCreate"]["properties"]["type"]["enum"] = \
            sorted(registry.types())


@bp.get("/plugins/types")
@bp.response(200, s.PluginTypePage)
def list_plugin_types():
    """Every installed plugin type with the JSON Schema of its configuration."""
    return {"items": [plugin_type_json(cls) for cls in registry().types().values()],
            "next_cursor": None}


@bp.get("/plugins/configs")
@bp.arguments(s.NamePageArgs, location="query")
@bp.response(200, s.InstancePage)
def list_instances(args: dict):
    page = svc.list_instances(db.session, args["limit"], args.get("cursor"))
    types = registry()
    return {"items": [instance_json(row, types) for row in page.items],
            "next_cursor": s.encode_cursor(page.next_key)}


INSTANCE_CHECKS = ("name", "type", "config", "retry_policy", "business_rules", "queue",
                   "probe_interval")


@bp.post("/plugins/configs", refusals=(409,), server_checks=INSTANCE_CHECKS)
@bp.arguments(s.InstanceCreate)
@bp.response(201, s.Instance)
def create_instance(body: dict):
    row = svc.save_instance(db.session, registry(), body)
    db.session.commit()
    return instance_json(row, registry()), 201, {
        "Location": url_for(".get_instance", name=row.name)}


@bp.get("/plugins/configs/<name>")
@bp.response(200, s.Instance)
def get_instance(name: str):
    return instance_json(svc.get_instance(db.session, name), registry())


@bp.put("/plugins/configs/<name>", server_checks=INSTANCE_CHECKS)
@bp.arguments(s.InstanceFields, required=False)  # every field may be left out
@bp.response(200, s.Instance)
def update_instance(body: dict, name: str):
    """Change any field but ``name`` and ``type``; omitted fields keep their value."""
    row = svc.save_instance(db.session, registry(), body, svc.get_instance(db.session, name))
    db.session.commit()
    return instance_json(row, registry())


@bp.delete("/plugins/configs/<name>", refusals=(409,))
@bp.response(204)
def delete_instance(name: str):
    """Refused (409 ``in_use``) while a route starts or ends at the instance."""
    svc.delete_instance(db.session, name)
    db.session.commit()


@bp.get("/plugins/configs/<name>/tokens", summary="List an instance's intake tokens",
        refusals=(409,))
@requires("admin")
@bp.response(200, s.IntakeTokenPage)
def list_intake_tokens(name: str):
    """The named intake tokens of an instance whose type keeps them (never the tokens);
    409 for a type that keeps none."""
    keeper = token_keeper(db.session, registry(), name)
    return {"items": keeper.list_tokens(db.session, name), "next_cursor": None}


@bp.post("/plugins/configs/<name>/tokens", summary="Create an intake token",
         refusals=(409,))
@requires("admin")
@bp.arguments(s.IntakeTokenCreate)
@bp.response(201, s.IntakeTokenCreated)
def create_intake_token(body: dict, name: str):
    """A new intake token of an instance whose type keeps them, in the answer this once."""
    keeper = token_keeper(db.session, registry(), name)
    token = keeper.create_token(db.session, name, body["name"], g.actor)
    db.session.commit()
    return {"instance": name, "name": body["name"], "token": token}


@bp.delete("/plugins/configs/<name>/tokens/<token_name>", summary="Revoke an intake token",
           refusals=(409,))
@requires("admin")
@bp.response(204)
def revoke_intake_token(name: str, token_name: str):
    token_keeper(db.session, registry(), name).revoke_token(db.session, name, token_name,
                                                             g.actor)
    db.session.commit()

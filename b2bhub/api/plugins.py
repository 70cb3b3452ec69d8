"""Plugin types and plugin instances (``/plugins/configs``)."""

from __future__ import annotations

import inspect
import re
from copy import deepcopy

from flask import Blueprint, g, jsonify, url_for

import b2bhub.api.schemas as s
from b2bhub.api.auth import requires
from b2bhub.api.blueprint import SERVER_CHECKS, bp, document_operation, role_for
from b2bhub.api.inputs import json_object
from b2bhub.api.shapes import instance_json, plugin_type_json
from b2bhub.config.extensions import db
from b2bhub.plugin.schema import openapi_config_schema
from b2bhub.runtime.hub import registry
from b2bhub.services import config as svc
from b2bhub.services.config import SECRET_MASK
from b2bhub.services.intake_tokens import token_keeper


@bp.document_hook
def document_plugin_configs(doc: dict, registry) -> None:
    """An instance's ``config`` typed by its ``type``, for each of the app's plugin
    types (a third party's too): ``{Type}Config`` is what a body takes (the strict JSON
    rules the API enforces), ``{Type}ConfigShown`` what an answer shows. A body to
    create is one of ``{Type}InstanceCreate`` (by ``type``), a body to change any of
    ``{Type}InstanceChange`` (``type`` may be left out: the instance's own decides),
    an answer one of ``{Type}Instance`` or ``OtherInstance`` (a type not installed)."""
    if registry is None or not registry.types():
        return
    schemas = doc["components"]["schemas"]
    create, change, answer = (schemas.pop(name) for name in (
        "InstanceCreate", "InstanceFields", "Instance"))
    known = sorted(registry.types())
    titles: dict[str, str] = {}
    for type_name in known:
        titles[type_name] = _title(type_name, {*schemas, *titles.values()})
    for type_name, title in titles.items():
        fields = registry.get(type_name).config_schema
        body = openapi_config_schema(fields)
        secrets = any(field.type == "secret" for field in fields)
        schemas[f"{title}Config"] = {**body, "description": (
            f"the settings of a {type_name} instance; null or left out: a field's default"
            + (f"; a secret shown as {SECRET_MASK} and sent back unchanged keeps its "
               "stored value" if secrets else ""))}
        schemas[f"{title}ConfigShown"] = {
            **openapi_config_schema(fields, answer=True, mask=SECRET_MASK),
            "description": f"the settings of a {type_name} instance"}
        config, shown = (_ref(f"{title}{name}") for name in ("Config", "ConfigShown"))
        # a type with required settings cannot be created without them
        must = ["config"] if body.get("required") else []
        for base, name, settings, required in ((create, "InstanceCreate", config, must),
                                               (change, "InstanceChange", config, []),
                                               (answer, "Instance", shown, [])):
            variant = deepcopy(base)
            variant["properties"].update(type={"type": "string", "enum": [type_name]},
                                         config=settings)
            if required:
                variant["required"] = sorted({*variant.get("required", ()), *required})
            schemas[f"{title}{name}"] = variant
    other = deepcopy(answer)
    other["properties"].update(
        type={"type": "string", "not": {"enum": known}, "description": "a type not "
              "installed here (its instances stay)"},
        config={"type": "object", "description": "as stored"})
    schemas["OtherInstance"] = other
    mapping = {type_name: _ref(f"{title}InstanceCreate")["$ref"]
               for type_name, title in titles.items()}
    schemas["InstanceCreate"] = {"oneOf": [{"$ref": ref} for ref in mapping.values()],
                                 "discriminator": {"propertyName": "type",
                                                   "mapping": mapping}}
    schemas["InstanceFields"] = {"anyOf": [_ref(f"{title}InstanceChange")
                                           for title in titles.values()]}
    schemas["Instance"] = {"oneOf": [*(_ref(f"{title}Instance") for title in titles.values()),
                                     _ref("OtherInstance")]}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _title(type_name: str, taken: set[str]) -> str:
    """``file_poller`` -> ``FilePoller``: a type's name in the document's schema names,
    one that is not ``taken`` (nor a schema's name that ``taken`` holds + ``Config``)."""
    title = "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", type_name))
    title = title if title[:1].isalpha() else f"Type{title}"
    while title in taken or f"{title}Config" in taken:
        title += "X"
    return title


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
    row = svc.save_instance(db.session, registry(), body, strict=True, actor=g.actor)
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
    row = svc.save_instance(db.session, registry(), body, svc.get_instance(db.session, name),
                           strict=True, actor=g.actor)
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


# --- an operator's actions on an instance (``Plugin.instance_actions``) -----------------

def instance_action(name: str, action: str):
    """An operator's action on the instance (its type's ``instance_actions``: an
    sftp_writer's ``fetch_host_key`` and ``pin_host_key``); the configuration changes it
    makes are saved, and its history line names the caller. 404 for an action the
    instance's type does not offer."""
    row = svc.get_instance(db.session, name)
    plugin_cls = registry().get(row.type) if row.type in registry() else None
    schemas = plugin_cls.instance_action_schemas() \
        if getattr(plugin_cls, "instance_actions", ()) else {}
    body = json_object(tuple(schemas.get(action, {}).get("properties", {})))
    result = svc.run_instance_action(db.session, registry(), name, action, body, g.actor)
    db.session.commit()
    return jsonify(result.answer)


Blueprint.add_url_rule(bp, "/plugins/configs/<name>/actions/<action>", "instance_action",
                       instance_action, methods=["POST"])


@bp.document_hook
def document_instance_actions(doc: dict, registry) -> None:
    """A path per action of each installed type that offers some (the rule takes any)."""
    if registry is None:
        return
    for type_name in sorted(registry.types()):
        plugin_cls = registry.get(type_name)
        if not getattr(plugin_cls, "instance_actions", ()):
            continue  # (a type need not subclass Plugin)
        for action, body in plugin_cls.instance_action_schemas().items():
            operation = {
                "summary": f"{action.replace('_', ' ').capitalize()} (a {type_name} "
                           "instance)",
                "operationId": f"{action}_{type_name}_instance", "tags": ["plugins"],
                "description": inspect.cleandoc(instance_action.__doc__ or ""),
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": body}}},
                "responses": {200: {"description": "OK", "content": {"application/json": {
                    "schema": {"type": "object"}}}}, 400: None, 404: None, 422: None}}
            operation[SERVER_CHECKS] = list(body.get("properties", {}))
            document_operation(operation, role_for(instance_action, "POST"))
            doc["paths"][f"{bp.url_prefix}/plugins/configs/{{name}}/actions/{action}"] = {
                "post": operation, "parameters": [{
                    "in": "path", "name": "name", "required": True,
                    "schema": {"type": "string", "minLength": 1}}]}

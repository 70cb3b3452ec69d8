"""Organizations and partners: ``/organizations`` and ``/partners`` share these views."""

from __future__ import annotations

import inspect
from dataclasses import asdict

from flask import Blueprint, Response, g, jsonify, url_for

import b2bhub.api.schemas as s
from b2bhub.api.blueprint import SERVER_CHECKS, ApiError, bp, document_operation, role_for
from b2bhub.api.inputs import json_object
from b2bhub.config.extensions import db
from b2bhub.engine.history import add_line
from b2bhub.models import ORGANIZATION, PARTNER
from b2bhub.runtime import hub
from b2bhub.services import config as svc
from b2bhub.services.errors import NotFound
from b2bhub.services.profiles import (
    offered_actions,
    profile_kind,
    profile_kinds,
    run_connection_test,
    run_profile_action,
)

KINDS = {"organizations": ORGANIZATION, "partners": PARTNER}


def list_parties(args: dict, collection: str):
    """By name."""
    return s.page_json(svc.list_parties(db.session, KINDS[collection], args["limit"],
                                        args.get("cursor")))


def create_party(body: dict, collection: str):
    """Refused (409 ``conflict``) when the name is taken, and (409 ``identity_taken``)
    when one of its EDI identities is another party's."""
    party = svc.create_party(db.session, KINDS[collection], body["name"],
                             body["display_name"], body["edi_identities"], actor=g.actor,
                             acks=_acks(body))
    _record(f"created {KINDS[collection]} {party.name}")
    db.session.commit()
    return party, 201, {"Location": url_for(f".get_{KINDS[collection]}",
                                            name=party.name)}


def get_party(collection: str, name: str):
    return svc.get_party(db.session, KINDS[collection], name)


def update_party(body: dict, collection: str, name: str):
    """Change the display name and, when given, the EDI identities (refused, 409
    ``identity_taken``, when one is another party's); the name itself cannot change."""
    if body.get("name", name) != name:
        raise ApiError(422, "invalid", f"'{name}' cannot be renamed: routes and messages "
                       "refer to it by name", {"name": "cannot be renamed"})
    party = svc.update_party(db.session, KINDS[collection], name, body["display_name"],
                             body.get("edi_identities"), actor=g.actor, acks=_acks(body))
    _record(f"changed {KINDS[collection]} {name}")
    db.session.commit()
    return party


def _acks(body: dict) -> dict:
    """The acknowledgment settings the body gives (left out: unchanged)."""
    return {key: body[key] for key in ("functional_acks", "ack_hours") if key in body}


def delete_party(collection: str, name: str):
    """Refused (409 ``in_use``) while a route names the party."""
    svc.delete_party(db.session, KINDS[collection], name)
    _record(f"deleted {KINDS[collection]} {name}")
    db.session.commit()


# One path per collection, the same views behind both (``collection`` as a default).
VIEWS = (
    ("", "GET", "list_{many}", "List {many}",
     bp.arguments(s.NamePageArgs, location="query")(bp.response(200, s.PartyPage)(
         list_parties)), ()),
    ("", "POST", "create_{one}", "Create an {one}",
     bp.arguments(s.PartyCreate)(bp.response(201, s.Party)(create_party)), (409,)),
    ("/<name>", "GET", "get_{one}", "Get an {one}",
     bp.response(200, s.Party)(get_party), ()),
    ("/<name>", "PUT", "update_{one}", "Change an {one}'s display name and EDI identities",
     bp.arguments(s.PartyUpdate)(bp.response(200, s.Party)(update_party)), (409,)),
    ("/<name>", "DELETE", "delete_{one}", "Delete an {one}",
     bp.response(204)(delete_party), (409,)),
)

for _many, _one in KINDS.items():
    for _tail, _method, _endpoint, _summary, _view, _refusals in VIEWS:
        bp.add_url_rule(f"/{_many}{_tail}", _endpoint.format(one=_one, many=_many), _view,
                        methods=[_method], defaults={"collection": _many},
                        server_checks={"PUT": ("name", "edi_identities"),
                                       "POST": ("edi_identities",)}.get(_method, ()),
                        summary=_summary.format(one=_one, many=_many).replace(
                            "an partner", "a partner"), refusals=_refusals)


# --- party profiles of the kinds plugins add (SPEC 2, SPEC 3) --------------------------
# The kinds are the app's registry's, known only once plugins are registered: the URL rule
# takes any kind (an unknown one is a 404 naming the known ones) and the document gets a
# path per kind and collection when it is served (``document_profiles``).

def get_profile(collection: str, name: str, kind: str):
    """Secrets are never shown."""
    found = profile_kind(hub.registry(), kind)
    return jsonify(found.get(db.session, KINDS[collection], name))


def put_profile(collection: str, name: str, kind: str):
    """Create the profile, or change the fields given; a private key or password is
    never shown again."""
    found = profile_kind(hub.registry(), kind)
    body = json_object(found.fields())
    try:
        found.get(db.session, KINDS[collection], name)
        created = False
    except NotFound:
        created = True
    shown = found.save(db.session, KINDS[collection], name, body)
    described = found.describe(shown)
    _record(f"{'created' if created else 'changed'} the {found.label or kind} profile of "
            f"{KINDS[collection]} {name}" + (f" ({described})" if described else ""))
    db.session.commit()
    return jsonify(shown)


def _record(text: str) -> None:
    """A party or a profile created, changed or deleted through the API is in the
    history as one saved on its page is: a ``config_changed`` line naming the caller
    (the audit export shows it)."""
    add_line(db.session, None, "config_changed", f"{g.actor}: {text}", actor=g.actor)


def delete_profile(collection: str, name: str, kind: str):
    """Idempotent, as a client removing a profile expects: a party that has no profile of
    the kind (never had one, or it is deleted already) answers 204 too; an unknown party
    is a 404."""
    found = profile_kind(hub.registry(), kind)
    party = svc.get_party(db.session, KINDS[collection], name)
    try:
        found.get(db.session, KINDS[collection], party.name)
    except NotFound:
        return Response(status=204)
    found.delete(db.session, KINDS[collection], party.name)
    _record(f"deleted the {found.label or kind} profile of {KINDS[collection]} {party.name}")
    db.session.commit()
    return Response(status=204)


def profile_action(collection: str, name: str, kind: str, action: str):
    """An operator's action on the profile (the kind's ``actions``: SFTP's
    ``fetch_host_key``, ``pin_host_key``, ``unpin_host_key``); its history line names
    the caller. 404 for an action the kind does not offer on this kind of party, or a
    party without a profile of the kind yet (a PUT saves one first)."""
    found = profile_kind(hub.registry(), kind)
    schemas = found.action_schemas() if getattr(found, "actions", ()) else {}
    body = json_object(tuple(schemas.get(action, {}).get("properties", {})))
    answer = run_profile_action(db.session, found, KINDS[collection], name, action, body,
                                g.actor)
    db.session.commit()
    return jsonify(answer)


def profile_presets(kind: str):
    """The named starting points of a kind's profiles (a vendor's known switches, each
    with its source); PUT takes one as ``preset``. 404 for a kind without presets."""
    found = profile_kind(hub.registry(), kind)
    if not found.has_presets:
        raise NotFound(f"the {found.label or kind} profiles have no presets")
    return jsonify(found.presets())


Blueprint.add_url_rule(bp, "/profile-kinds/<kind>/presets", "profile_presets",
                       profile_presets, methods=["GET"])
PROFILE_VIEWS = {"GET": get_profile, "PUT": put_profile, "DELETE": delete_profile}
for _many in KINDS:
    for _method, _view in PROFILE_VIEWS.items():
        # Flask's own add_url_rule: flask-smorest would document the rule as it is
        Blueprint.add_url_rule(bp, f"/{_many}/<name>/profiles/<kind>",
                               f"{_method.lower()}_{_many}_profile", _view,
                               methods=[_method], defaults={"collection": _many})
    Blueprint.add_url_rule(bp, f"/{_many}/<name>/profiles/<kind>/actions/<action>",
                           f"{_many}_profile_action", profile_action, methods=["POST"],
                           defaults={"collection": _many})


@bp.document_hook
def document_profiles(doc: dict, registry) -> None:
    """A path per profile kind and collection, with the kind's own schemas."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for kind, found in profile_kinds(registry).items():
        title = "".join(part.capitalize() for part in kind.split("_"))
        shapes = found.json_schemas()
        schemas[f"{title}Profile"] = shapes["answer"]
        schemas[f"{title}ProfileIn"] = shapes["body"]
        answer = {"content": {"application/json": {"schema": {
            "$ref": f"#/components/schemas/{title}Profile"}}}}
        for many, one in KINDS.items():
            an = "an" if one[0] in "aeiou" else "a"
            label = f"{found.label or kind} profile"
            operations = {
                "get": {"summary": f"Get {an} {one}'s {label}",
                        "responses": {200: {"description": "OK", **answer}, 404: {
                            "description": f"no such {one}, or no {label} yet: a new "
                                           f"{one} has none until PUT makes it",
                            "content": {"application/json": {"schema": {
                                "$ref": "#/components/schemas/Error"}}}}}},
                "put": {"summary": f"Create or change {an} {one}'s {label}",
                        "requestBody": {"required": True, "content": {"application/json": {
                            "schema": {"$ref": f"#/components/schemas/{title}ProfileIn"}}}},
                        "responses": {200: {"description": "OK", **answer}, 400: None,
                                      404: None, 409: None, 422: None}},
                "delete": {"summary": f"Delete {an} {one}'s {label}",
                           "responses": {204: {"description": "Deleted, or the party had none"},
                                         404: None}},
            }
            for method, operation in operations.items():
                view = PROFILE_VIEWS[method.upper()]
                operation.update(
                    operationId=f"{method}_{one}_{kind}_profile", tags=["parties"],
                    description=inspect.cleandoc(view.__doc__ or "") or operation["summary"])
                document_operation(operation, role_for(view, method.upper()))
            if found.has_presets and many == "partners":
                _document_presets(doc, kind, found, title)
            if shapes.get("server_checks"):
                operations["put"][SERVER_CHECKS] = list(shapes["server_checks"])
            name_parameter = [{"in": "path", "name": "name", "required": True,
                               "schema": {"type": "string", "minLength": 1}}]
            doc["paths"][f"{bp.url_prefix}/{many}/{{name}}/profiles/{kind}"] = {
                **operations, "parameters": name_parameter}
            offered = offered_actions(found, one)
            actions = found.action_schemas() if offered else {}
            for action, body in actions.items():
                operation = {
                    "summary": f"{action.replace('_', ' ').capitalize()} ({an} {one}'s "
                               f"{label})",
                    "operationId": f"{action}_{one}_{kind}_profile", "tags": ["parties"],
                    "description": inspect.cleandoc(profile_action.__doc__ or ""),
                    "requestBody": {"required": True, "content": {"application/json": {
                        "schema": body}}},
                    "responses": {200: {"description": "OK", "content": {
                        "application/json": {"schema": {"type": "object"}}}},
                        400: None, 404: None, 422: None}}
                operation[SERVER_CHECKS] = list(body.get("properties", {}))
                document_operation(operation, role_for(profile_action, "POST"))
                doc["paths"][f"{bp.url_prefix}/{many}/{{name}}/profiles/{kind}/actions/"
                             f"{action}"] = {"post": operation, "parameters": name_parameter}


def _document_presets(doc: dict, kind: str, found, title: str) -> None:
    doc["components"]["schemas"][f"{title}Preset"] = found.preset_schema()
    operation = {"summary": f"List the presets of {found.label or kind} profiles",
                 "operationId": f"list_{kind}_presets", "tags": ["parties"],
                 "description": inspect.cleandoc(profile_presets.__doc__ or ""),
                 "responses": {200: {"description": "OK", "content": {"application/json": {
                     "schema": {"type": "array", "items": {
                         "$ref": f"#/components/schemas/{title}Preset"}}}}}}}
    document_operation(operation, role_for(profile_presets, "GET"))
    doc["paths"][f"{bp.url_prefix}/profile-kinds/{kind}/presets"] = {"get": operation}


@bp.post("/partners/<name>/profiles/<kind>/test")
@bp.arguments(s.ConnectionTestArgs)
@bp.response(200, s.ConnectionTest)
def test_profile(body: dict, name: str, kind: str):
    """Test the connection to a partner per its profile of ``kind`` (``as2``): a small
    test message, marked as one and never routed, then each step with ``ok``,
    ``failed``, ``skipped``, ``pending`` or ``not_run`` (after the first failure) and
    what was found. The test message's history names the caller. 404 for a kind without
    a connection test."""
    return asdict(run_connection_test(db.session, profile_kind(hub.registry(), kind), name,
                                      g.actor, body))

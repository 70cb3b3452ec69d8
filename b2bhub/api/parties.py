"""Organizations and partners: ``/organizations`` and ``/partners`` share these views."""

from __future__ import annotations

from flask import jsonify, url_for

from b2bhub import hub
from b2bhub.api import bp
from b2bhub.api import schemas as s
from b2bhub.api.blueprint import ApiError
from b2bhub.api.inputs import json_object
from b2bhub.extensions import db
from b2bhub.models import ORGANIZATION, PARTNER
from b2bhub.services import config as svc
from b2bhub.services.profiles import profile_kind

KINDS = {"organizations": ORGANIZATION, "partners": PARTNER}


def list_parties(args: dict, collection: str):
    """By name."""
    return s.page_json(svc.list_parties(db.session, KINDS[collection], args["limit"],
                                        args.get("cursor")))


def create_party(body: dict, collection: str):
    """Refused (409 ``conflict``) when the name is taken."""
    party = svc.create_party(db.session, KINDS[collection], body["name"],
                             body["display_name"])
    db.session.commit()
    return party, 201, {"Location": url_for(f".get_{KINDS[collection]}",
                                            name=party.name)}


def get_party(collection: str, name: str):
    return svc.get_party(db.session, KINDS[collection], name)


def update_party(body: dict, collection: str, name: str):
    """Change the display name; the name itself cannot change."""
    if body.get("name", name) != name:
        raise ApiError(400, "invalid", f"'{name}' cannot be renamed: routes and messages "
                       "refer to it by name", {"name": "cannot be renamed"})
    party = svc.update_party(db.session, KINDS[collection], name, body["display_name"])
    db.session.commit()
    return party


def delete_party(collection: str, name: str):
    """Refused (409 ``in_use``) while a route names the party."""
    svc.delete_party(db.session, KINDS[collection], name)
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
    ("/<name>", "PUT", "update_{one}", "Change an {one}'s display name",
     bp.arguments(s.PartyUpdate)(bp.response(200, s.Party)(update_party)), ()),
    ("/<name>", "DELETE", "delete_{one}", "Delete an {one}",
     bp.response(204)(delete_party), (409,)),
)

for _many, _one in KINDS.items():
    for _tail, _method, _endpoint, _summary, _view, _refusals in VIEWS:
        bp.add_url_rule(f"/{_many}{_tail}", _endpoint.format(one=_one, many=_many), _view,
                        methods=[_method], defaults={"collection": _many},
                        summary=_summary.format(one=_one, many=_many).replace(
                            "an partner", "a partner"), refusals=_refusals)


# --- party profiles of the kinds plugins add (SPEC 2, SPEC 3) --------------------------

PROFILE = "/<any(organizations, partners):collection>/<name>/profiles/<kind>"


@bp.get(PROFILE)
def get_profile(collection: str, name: str, kind: str):
    """A party's profile of a kind a plugin adds (``as2``); secrets are never shown."""
    found = profile_kind(hub.registry(), kind)
    return jsonify(found.get(db.session, KINDS[collection], name))


@bp.put(PROFILE)
def put_profile(collection: str, name: str, kind: str):
    """Create or replace the choices given; a private key or password is never shown."""
    found = profile_kind(hub.registry(), kind)
    body = json_object(found.fields())
    shown = found.save(db.session, KINDS[collection], name, body)
    db.session.commit()
    return jsonify(shown)


@bp.delete(PROFILE)
@bp.response(204)
def delete_profile(collection: str, name: str, kind: str):
    profile_kind(hub.registry(), kind).delete(db.session, KINDS[collection], name)
    db.session.commit()

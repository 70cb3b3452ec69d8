"""Organizations and partners: ``/organizations`` and ``/partners`` share these views."""

from __future__ import annotations

from flask import jsonify, url_for

from b2bhub.api import bp
from b2bhub.api import schemas as s
from b2bhub.api.blueprint import ApiError
from b2bhub.api.inputs import json_object
from b2bhub.extensions import db
from b2bhub.models import ORGANIZATION, PARTNER, utcnow
from b2bhub.services import config as svc
from plugins.as2 import profiles

KINDS = {"organizations": ORGANIZATION, "partners": PARTNER}
COLLECTION = "/<any(organizations, partners):collection>"


@bp.get(COLLECTION)
@bp.arguments(s.NamePageArgs, location="query")
@bp.response(200, s.PartyPage)
def list_parties(args: dict, collection: str):
    """Organizations (ours) or partners, by name."""
    return s.page_json(svc.list_parties(db.session, KINDS[collection], args["limit"],
                                        args.get("cursor")))


@bp.post(COLLECTION)
@bp.arguments(s.PartyCreate)
@bp.response(201, s.Party)
def create_party(body: dict, collection: str):
    party = svc.create_party(db.session, KINDS[collection], body["name"],
                             body["display_name"])
    db.session.commit()
    return party, 201, {"Location": url_for(".get_party", collection=collection,
                                            name=party.name)}


@bp.get(COLLECTION + "/<name>")
@bp.response(200, s.Party)
def get_party(collection: str, name: str):
    return svc.get_party(db.session, KINDS[collection], name)


@bp.put(COLLECTION + "/<name>")
@bp.arguments(s.PartyUpdate)
@bp.response(200, s.Party)
def update_party(body: dict, collection: str, name: str):
    """Change the display name; the name itself cannot change."""
    if body.get("name", name) != name:
        raise ApiError(400, "invalid", f"'{name}' cannot be renamed: routes and messages "
                       "refer to it by name", {"name": "cannot be renamed"})
    party = svc.update_party(db.session, KINDS[collection], name, body["display_name"])
    db.session.commit()
    return party


@bp.delete(COLLECTION + "/<name>")
@bp.response(204)
def delete_party(collection: str, name: str):
    """Refused (409 ``in_use``) while a route names the party."""
    svc.delete_party(db.session, KINDS[collection], name)
    db.session.commit()


# --- AS2 profiles (SPEC 2) -------------------------------------------------------------

PROFILE = COLLECTION + "/<name>/profiles/as2"


@bp.get(PROFILE)
def get_as2_profile(collection: str, name: str):
    profile = profiles.get_profile(db.session, KINDS[collection], name)
    return jsonify(profiles.profile_json(profile, utcnow()))


@bp.put(PROFILE)
def put_as2_profile(collection: str, name: str):
    """Create or replace the choices given; a private key or password is never shown."""
    body = json_object(tuple(profiles.FIELDS))
    profile = profiles.save_profile(db.session, KINDS[collection], name, body)
    db.session.commit()
    return jsonify(profiles.profile_json(profile, utcnow()))


@bp.delete(PROFILE)
def delete_as2_profile(collection: str, name: str):
    profiles.delete_profile(db.session, KINDS[collection], name)
    db.session.commit()
    return "", 204

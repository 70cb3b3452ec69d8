"""Organizations and partners: ``/organizations`` and ``/partners`` share these views."""

from __future__ import annotations

from flask import jsonify, url_for

from b2bhub.api import bp
from b2bhub.api.inputs import bad_request, cursor_arg, json_object, limit_arg
from b2bhub.api.shapes import page_json, party_json
from b2bhub.as2 import profiles
from b2bhub.extensions import db
from b2bhub.models import ORGANIZATION, PARTNER, utcnow
from b2bhub.services import config as svc

KINDS = {"organizations": ORGANIZATION, "partners": PARTNER}
COLLECTION = "/<any(organizations, partners):collection>"
FIELDS = ("name", "display_name")


@bp.get(COLLECTION)
def list_parties(collection: str):
    page = svc.list_parties(db.session, KINDS[collection], limit_arg(), cursor_arg(str))
    return jsonify(page_json(page, party_json))


@bp.post(COLLECTION)
def create_party(collection: str):
    body = json_object(FIELDS, required=("name",))
    party = svc.create_party(db.session, KINDS[collection], body["name"],
                             body.get("display_name", ""))
    db.session.commit()
    location = url_for(".get_party", collection=collection, name=party.name)
    return jsonify(party_json(party)), 201, {"Location": location}


@bp.get(COLLECTION + "/<name>")
def get_party(collection: str, name: str):
    return jsonify(party_json(svc.get_party(db.session, KINDS[collection], name)))


@bp.put(COLLECTION + "/<name>")
def update_party(collection: str, name: str):
    body = json_object(FIELDS, required=("display_name",))
    if body.get("name", name) != name:
        raise bad_request(f"'{name}' cannot be renamed: routes and messages refer to it "
                          "by name", "name")
    party = svc.update_party(db.session, KINDS[collection], name, body["display_name"])
    db.session.commit()
    return jsonify(party_json(party))


@bp.delete(COLLECTION + "/<name>")
def delete_party(collection: str, name: str):
    svc.delete_party(db.session, KINDS[collection], name)
    db.session.commit()
    return "", 204


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

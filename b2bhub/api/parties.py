"""Organizations and partners: ``/organizations`` and ``/partners`` share these views."""

from __future__ import annotations

from dataclasses import asdict

from flask import g, jsonify, url_for

from b2bhub import hub
from b2bhub.api import bp
from b2bhub.api import schemas as s
from b2bhub.api.blueprint import ApiError
from b2bhub.api.inputs import json_object
from b2bhub.extensions import db
from b2bhub.models import ORGANIZATION, PARTNER
from b2bhub.services import config as svc
from b2bhub.services.profiles import profile_kind, run_connection_test

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


# --- party profiles of the kinds plugins add (SPEC 2, SPEC 3) --------------------------

PROFILE = COLLECTION + "/<name>/profiles/<kind>"


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
def delete_profile(collection: str, name: str, kind: str):
    profile_kind(hub.registry(), kind).delete(db.session, KINDS[collection], name)
    db.session.commit()
    return "", 204


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

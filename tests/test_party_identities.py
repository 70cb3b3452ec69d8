"""Parties' EDI identities (docs/edi.md): the rule, one party's at most, the history line
naming the operator, and the API, the UI and fixture files."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from b2bhub.domain.edi import parse_identities, parse_identity
from b2bhub.models import HistoryLine, PartyIdentity
from b2bhub.services import config as svc
from b2bhub.services.errors import Conflict, ServiceError
from b2bhub.services.identities import party_of
from tests.test_api import error_of
from tests.test_ui import login  # noqa: F401


@pytest.mark.parametrize("text, pair", [
    ("ZZ:ACME", ("ZZ", "ACME")), ("01:123456789", ("01", "123456789")),
    ("14:4012345000009", ("14", "4012345000009")), (" zz:My Company ", ("zz", "My Company")),
    ("ABCD:" + "x" * 35, ("ABCD", "x" * 35))])
def test_identities_that_envelopes_name(text, pair):
    assert parse_identity(text) == pair


@pytest.mark.parametrize("text", ["ACME", "ZZ:", ":ACME", "ABCDE:ACME", "Z-Z:ACME",
                                  "ZZ:" + "x" * 36, "ZZ:A*B", "ZZ:A~B", "ZZ:A'B", "ZZ:A+B",
                                  "ZZ:A:B", "ZZ:A\nB", "ZZ: ACME", 7, None])
def test_what_is_no_identity_is_refused_saying_the_rule(text):
    with pytest.raises(ValueError, match="qualifier:id"):
        parse_identity(text)


def test_identities_given_twice_count_once():
    assert parse_identities(["ZZ:ACME", "ZZ:ACME", "01:1"]) == [("ZZ", "ACME"), ("01", "1")]


def test_a_party_s_identities_are_kept_changed_and_recorded(hub, session):
    hub.parties(organizations=("mycompany",), partners=("acme",))
    svc.update_party(session, "partner", "acme", "ACME", ["ZZ:ACME", "01:123"], actor="ada")
    session.commit()
    assert svc.get_party(session, "partner", "acme").edi_identities == ["ZZ:ACME", "01:123"]
    assert party_of(session, "ZZ:ACME") == "acme" and party_of(session, "ZZ:NOBODY") is None

    svc.update_party(session, "partner", "acme", "ACME", ["01:123", "ZZ:ACME2"], actor="bob")
    svc.update_party(session, "partner", "acme", "ACME", None, actor="eve")  # unchanged
    svc.update_party(session, "partner", "acme", "ACME", ["01:123", "ZZ:ACME2"],
                     actor="eve")  # the same: no line
    session.commit()
    assert svc.get_party(session, "partner", "acme").edi_identities == ["01:123", "ZZ:ACME2"]
    lines = session.execute(select(HistoryLine.actor, HistoryLine.text).where(
        HistoryLine.type == "config_changed").order_by(HistoryLine.id)).all()
    assert [tuple(line) for line in lines] == [
        ("ada", "ada: EDI identities of partner acme: ZZ:ACME, 01:123 (were none)"),
        ("bob", "bob: EDI identities of partner acme: 01:123, ZZ:ACME2 "
                "(were ZZ:ACME, 01:123)")]


def test_an_identity_is_one_party_s_at_most(hub, session):
    hub.parties(organizations=("mycompany",), partners=("acme", "globex"))
    svc.update_party(session, "organization", "mycompany", "", ["ZZ:MYCOMPANY"])
    session.commit()
    with pytest.raises(Conflict) as refused:
        svc.update_party(session, "partner", "acme", "", ["ZZ:ACME", "ZZ:MYCOMPANY"])
    assert refused.value.code == "identity_taken"
    assert refused.value.message == ("EDI identity ZZ:MYCOMPANY is already organization "
                                     "mycompany's")
    session.rollback()
    with pytest.raises(Conflict):
        svc.create_party(session, "partner", "initech", "", ["ZZ:MYCOMPANY"])
    session.rollback()
    # one party may move an identity to another by giving it up first
    svc.update_party(session, "organization", "mycompany", "", [])
    svc.update_party(session, "partner", "acme", "", ["ZZ:MYCOMPANY"])
    session.commit()
    assert party_of(session, "ZZ:MYCOMPANY") == "acme"


def test_a_deleted_party_s_identities_go_with_it(hub, session):
    hub.parties(organizations=("mycompany",), partners=("acme",))
    svc.update_party(session, "partner", "acme", "", ["ZZ:ACME"])
    svc.delete_party(session, "partner", "acme")
    session.commit()
    assert session.scalars(select(PartyIdentity)).all() == []


def test_a_bad_identity_is_refused_beside_its_field(hub, session):
    hub.parties()
    with pytest.raises(ServiceError) as refused:
        svc.update_party(session, "partner", "acme", "", ["ZZ:ACME", "ZZ:A*B"])
    assert set(refused.value.details) == {"edi_identities"}
    assert "'ZZ:A*B'" in refused.value.message
    with pytest.raises(ServiceError):
        svc.update_party(session, "partner", "acme", "", "ZZ:ACME")  # not a list
    session.rollback()


# --- the API, the UI and fixture files --------------------------------------------------

def test_the_api_shows_sets_and_refuses_identities(hub, api):
    made = api.post("/api/v1/organizations", json={"name": "mycompany",
                                                   "edi_identities": ["ZZ:MYCOMPANY"]})
    assert made.status_code == 201, made.get_json()
    assert made.get_json()["edi_identities"] == ["ZZ:MYCOMPANY"]
    assert api.post("/api/v1/partners", json={"name": "acme"}).get_json()[
        "edi_identities"] == []
    changed = api.put("/api/v1/partners/acme", json={
        "display_name": "ACME", "edi_identities": ["ZZ:ACME", "01:123456789"]})
    assert changed.status_code == 200, changed.get_json()
    assert api.get("/api/v1/partners/acme").get_json()["edi_identities"] == [
        "ZZ:ACME", "01:123456789"]
    kept = api.put("/api/v1/partners/acme", json={"display_name": "ACME Corp"})
    assert kept.get_json()["edi_identities"] == ["ZZ:ACME", "01:123456789"]

    error = error_of(api.put("/api/v1/partners/acme", json={
        "display_name": "ACME", "edi_identities": ["ZZ:MYCOMPANY"]}), 409, "identity_taken")
    assert error["message"] == "EDI identity ZZ:MYCOMPANY is already organization " \
                               "mycompany's"
    error_of(api.put("/api/v1/partners/acme", json={  # the hub's rule for an identity: 422
        "display_name": "ACME", "edi_identities": ["ZZ:A+B"]}), 422, "invalid")
    error_of(api.post("/api/v1/partners", json={
        "name": "globex", "edi_identities": ["ZZ:ACME"]}), 409, "identity_taken")
    assert api.get("/api/v1/partners/acme").get_json()["edi_identities"] == [
        "ZZ:ACME", "01:123456789"]
    assert api.get("/api/v1/partners/globex").status_code == 404
    listed = api.get("/api/v1/partners").get_json()["items"]
    assert [p["edi_identities"] for p in listed] == [["ZZ:ACME", "01:123456789"]]


def test_the_ui_edits_identities_one_per_line(hub, login, session):  # noqa: F811
    hub.parties(organizations=("mycompany",), partners=("acme",))
    svc.update_party(session, "organization", "mycompany", "", ["ZZ:MYCOMPANY"])
    session.commit()
    client = login("admin", "ada")
    assert client.post("/ui/parties/partner/acme", data={
        "name": "acme", "display_name": "ACME",
        "edi_identities": "ZZ:ACME\r\n\r\n 01:123456789 \r\n"}).status_code == 302
    assert svc.get_party(session, "partner", "acme").edi_identities == [
        "ZZ:ACME", "01:123456789"]
    form = client.get("/ui/parties/partner/acme").text
    assert "EDI identities" in form and "ZZ:ACME\n01:123456789</textarea>" in form
    assert "EDI identities: ZZ:ACME, 01:123456789" in client.get("/ui/parties/acme").text

    refused = client.post("/ui/parties/partner/acme", data={
        "name": "acme", "display_name": "ACME", "edi_identities": "ZZ:ACME\nZZ:MYCOMPANY"})
    assert refused.status_code == 400
    assert "ZZ:MYCOMPANY is already organization mycompany&#39;s" in refused.text
    assert "ZZ:ACME\nZZ:MYCOMPANY</textarea>" in refused.text  # kept as typed
    session.expire_all()
    assert svc.get_party(session, "partner", "acme").edi_identities == [
        "ZZ:ACME", "01:123456789"]
    assert session.scalar(select(HistoryLine.text).where(
        HistoryLine.actor == "ada", HistoryLine.text.contains("EDI identities"))) == (
        "ada: EDI identities of partner acme: ZZ:ACME, 01:123456789 (were none)")


def test_a_fixture_file_may_give_parties_identities(app, session, tmp_path):
    from b2bhub.cli import main

    path = tmp_path / "fixtures.json"
    path.write_text(json.dumps({
        "organizations": [{"name": "mycompany", "edi_identities": ["ZZ:MYCOMPANY"]}],
        "partners": [{"name": "acme", "edi_identities": ["ZZ:ACME", "01:123"]}],
        "plugins": [], "routes": []}))
    result = app.test_cli_runner().invoke(main, ["fixtures", "load", str(path)])
    assert result.exit_code == 0, result.output
    session.expire_all()
    assert party_of(session, "01:123") == "acme"
    assert party_of(session, "ZZ:MYCOMPANY") == "mycompany"


# --- acknowledgment settings ---------------------------------------------------------

def test_a_partner_s_acknowledgment_settings_in_the_api_with_their_history(hub, api,
                                                                           session):
    made = api.post("/api/v1/partners", json={"name": "acme", "functional_acks": "997",
                                              "ack_hours": 24})
    assert made.status_code == 201, made.get_json()
    assert (made.get_json()["functional_acks"], made.get_json()["ack_hours"]) == ("997", 24)
    plain = api.post("/api/v1/partners", json={"name": "globex"}).get_json()
    assert (plain["functional_acks"], plain["ack_hours"]) == ("none", None)

    kept = api.put("/api/v1/partners/acme", json={"display_name": "ACME"}).get_json()
    assert (kept["functional_acks"], kept["ack_hours"]) == ("997", 24)
    changed = api.put("/api/v1/partners/acme", json={"display_name": "ACME",
                                                     "functional_acks": "999",
                                                     "ack_hours": None}).get_json()
    assert (changed["functional_acks"], changed["ack_hours"]) == ("999", None)
    for bad in ({"functional_acks": "998"}, {"ack_hours": 0}, {"ack_hours": 721},
                {"ack_hours": "soon"}):
        error = error_of(api.put("/api/v1/partners/acme", json={"display_name": "ACME",
                                                                **bad}), 400, "invalid")
        assert set(bad) <= set(error["details"].get("fields", error["details"])), error
    again = api.get("/api/v1/partners/acme").get_json()
    assert (again["functional_acks"], again["ack_hours"]) == ("999", None)
    lines = session.scalars(select(HistoryLine.text).where(
        HistoryLine.text.contains("acknowledgments")).order_by(HistoryLine.id)).all()
    assert lines == [
        "tests: EDI acknowledgments of partner acme: sends 997 / CONTRL, expects within 24 h "
        "(were sends none, expects none)",
        "tests: EDI acknowledgments of partner acme: sends 999 / CONTRL, expects none "
        "(were sends 997 / CONTRL, expects within 24 h)"]


def test_the_ui_sets_a_partner_s_acknowledgments(hub, login, session):  # noqa: F811
    hub.parties(organizations=("mycompany",), partners=("acme",))
    client = login("admin", "ada")
    assert "Functional acknowledgments we send" not in client.get(
        "/ui/parties/organization/mycompany").text
    assert client.post("/ui/parties/partner/acme", data={
        "name": "acme", "display_name": "ACME", "edi_identities": "",
        "functional_acks": "997", "ack_hours": " 48 "}).status_code == 302
    party = svc.get_party(session, "partner", "acme")
    assert (party.functional_acks, party.ack_hours) == ("997", 48)
    assert "theirs expected: within 48 hours" in client.get("/ui/parties/acme").text
    refused = client.post("/ui/parties/partner/acme", data={
        "name": "acme", "display_name": "ACME", "edi_identities": "",
        "functional_acks": "997", "ack_hours": "two days"})
    assert refused.status_code == 400 and "whole number of hours" in refused.text
    session.expire_all()
    assert svc.get_party(session, "partner", "acme").ack_hours == 48
    assert session.scalar(select(HistoryLine.actor).where(
        HistoryLine.text.contains("acknowledgments"))) == "ada"
    assert client.post("/ui/parties/organization/mycompany", data={
        "name": "mycompany", "display_name": "Us", "edi_identities": ""}).status_code == 302

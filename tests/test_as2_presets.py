"""Vendor presets of a partner's AS2 profile (issue 42, item 3): each switch a preset
sets is a real choice with its source, a preset chosen through the API or the page sets
its switches under the request's own choices and is a history line naming them, and a
partner started from the django-pyas2 preset takes its signed receipts without MIC on
the wire (the pyas2lib partner of test_as2 with its ``no_mic`` quirk)."""

# ruff: noqa: F811  (the fixtures of test_as2, imported, are the tests' parameters)
from __future__ import annotations

from sqlalchemy import select

from b2bhub.models import HistoryLine
from plugins.as2 import presets, profiles
from tests.test_as2 import as2, certs, partner  # noqa: F401  (fixtures)
from tests.test_as2_interop import _sent, quirks  # noqa: F401  (fixture)
from tests.test_ui import login  # noqa: F401  (fixture)

PROFILE = "/api/v1/partners/acme/profiles/as2"
VENDORS = {"sterling", "biztalk", "cleo", "mendelson", "openas2", "django-pyas2", "axway",
           "sap"}


def test_every_preset_is_listed_with_real_switches_and_their_sources(as2, api):
    listed = api.get("/api/v1/profile-kinds/as2/presets")
    assert listed.status_code == 200
    by_name = {p["name"]: p for p in listed.get_json()}
    assert set(by_name) == VENDORS
    for preset in by_name.values():
        assert set(preset["sources"]) == set(preset["switches"]), preset["name"]
        for switch, value in preset["switches"].items():
            assert profiles.CHOICES[switch][1](value) is None, (preset["name"], switch)
        for source in [*preset["sources"].values(), *preset["notes"]]:
            assert source["url"].startswith("https://") and source["says"]
        if not preset["switches"]:  # nothing invented: it says why it sets nothing
            assert any(presets.NO_DEVIATION in note["text"] for note in preset["notes"])
    assert by_name["django-pyas2"]["switches"] == {"accept_mdn_without_mic": True}
    assert by_name["sterling"]["switches"] == {"canonicalize_as_binary": True}
    assert by_name["biztalk"]["switches"] == {"encryption_alg": "tripledes_192_cbc"}
    assert api.get("/api/v1/profile-kinds/sftp/presets").status_code == 404
    document = api.get("/api/v1/openapi.json").get_json()
    body = document["components"]["schemas"]["As2ProfileIn"]["properties"]["preset"]
    assert set(body["enum"]) == VENDORS
    assert "/api/v1/profile-kinds/as2/presets" in document["paths"]


def _history(as2) -> list[str]:
    as2.session.expire_all()
    return [line.text for line in as2.session.scalars(select(HistoryLine).where(
        HistoryLine.type == "config_changed", HistoryLine.actor == "tests")
        .order_by(HistoryLine.id))]


def test_a_preset_sets_its_switches_under_the_requests_choices_and_is_a_history_line(
        as2, api):
    got = api.put(PROFILE, json={"preset": "sterling"})
    assert got.status_code == 200, got.get_json()
    assert got.get_json()["preset"] == "sterling"
    assert got.get_json()["canonicalize_as_binary"] is True
    assert api.get(PROFILE).get_json()["preset"] == "sterling"
    assert _history(as2)[-1] == ("tests: changed the AS2 profile of partner acme (AS2 ID "
                                 "ACME; preset sterling applied: canonicalize_as_binary=true)")
    # the body's own choices win over the preset's
    got = api.put(PROFILE, json={"preset": "biztalk", "encryption_alg": "aes_128_cbc"})
    shown = got.get_json()
    assert (shown["preset"], shown["encryption_alg"]) == ("biztalk", "aes_128_cbc")
    assert shown["canonicalize_as_binary"] is True  # a preset adds, it does not reset
    assert _history(as2)[-1].endswith("preset biztalk applied: encryption_alg="
                                      "tripledes_192_cbc (replaced by the request))")
    # a save without a preset names none and keeps the name; null forgets the name only
    api.put(PROFILE, json={"subject": "Orders"})
    assert "preset" not in _history(as2)[-1]
    assert api.get(PROFILE).get_json()["preset"] == "biztalk"
    shown = api.put(PROFILE, json={"preset": None}).get_json()
    assert shown["preset"] is None and shown["canonicalize_as_binary"] is True
    # an unknown preset: refused with the known names, nothing changed
    bad = api.put(PROFILE, json={"preset": "seeburger", "subject": "lost?"})
    assert bad.status_code == 400  # the document's enum says so too
    error = bad.get_json()["error"]
    assert "preset" in error["details"]
    assert all(name in error["message"] for name in VENDORS)
    assert api.get(PROFILE).get_json()["subject"] == "Orders"
    own = api.put("/api/v1/organizations/mycompany/profiles/as2", json={"preset": "cleo"})
    assert own.status_code == 422, own.get_json()  # a preset names a partner's product


def test_the_page_starts_a_partner_from_a_preset_and_shows_it(as2, login):
    client = login("admin")
    page = client.get("/ui/parties/partner/acme/as2").text
    assert "Vendor preset" in page and "pyas2-lib/issues/62" in page  # notes, sources
    form = profiles.profile_json(profiles.get_profile(as2.session, "partner", "acme"),
                                 profiles.utcnow())
    data = {k: v for k, v in form.items() if k in (
        "as2_id", "url", "digest_alg", "encryption_alg", "key_encryption", "mdn_mode",
        "mdn_digest_alg", "content_type", "subject")}
    data.update(receipt_timeout="3600", sign="y", encrypt="y", mdn_signed="y",
                tls_system_trust="y", preset="django-pyas2")  # the box itself left off
    answer = client.post("/ui/parties/partner/acme/as2", data=data)
    assert answer.status_code == 302, answer.text
    page = client.get("/ui/parties/partner/acme/as2").text
    assert "Started from preset django-pyas2" in page
    assert profiles.get_profile(as2.session, "partner", "acme").settings[
        "accept_mdn_without_mic"] is True
    as2.session.expire_all()
    [line] = as2.session.scalars(select(HistoryLine).where(
        HistoryLine.type == "config_changed", HistoryLine.actor == "admin1"))
    assert "preset django-pyas2 applied: accept_mdn_without_mic=true" in line.text


def test_a_partner_started_from_the_django_pyas2_preset_takes_receipts_without_mic(
        as2, api, quirks):
    quirks(mdn_quirk="no_mic")
    as2.choose(sign=True, encrypt=True, mdn_mode="sync", mdn_signed=True)
    message, _got = _sent(as2)
    refused = as2.delivery(message.id)
    assert refused.state == "failed"
    assert "accept_mdn_without_mic" in refused.last_result
    assert "the preset django-pyas2 sets it" in refused.last_result
    assert api.put(PROFILE, json={"preset": "django-pyas2"}).status_code == 200
    message, _got = _sent(as2)
    delivery = as2.delivery(message.id)
    assert delivery.state == "delivered", delivery.last_result
    assert "warning: signed MDN without Received-Content-MIC" in delivery.last_result

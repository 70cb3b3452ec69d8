"""Certificate lifecycle of AS2 profiles (issue 17, scope 3): several certificates per
profile with their windows and roles, a rollover with an overlap (either certificate
during it, only the new one after), expired certificates refused by default with the
reason and accepted with ``accept_expired_certificates`` (with a warning line), and the
``certificate_expiring`` alert raised when such a certificate is saved.

The partner here is pyas2lib itself in this process, building messages with the
certificate the test chooses; "later" is the AS2 code's clock moved on."""

# ruff: noqa: F401, F811

from __future__ import annotations

import datetime as dt

import pytest
import requests
from asn1crypto import cms
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from pyas2lib import Message, Organization, Partner
from sqlalchemy import select

from b2bhub.models import Alert, utcnow
from plugins.as2 import lib, profiles
from tests import test_ui
from tests.test_as2 import DATA, as2, certs, partner
from tests.test_as2_keywrap import peer

NOW = utcnow()
login, fresh_user_per_request = test_ui.login, test_ui.fresh_user_per_request


def make_cert(name: str, start: dt.datetime, end: dt.datetime) -> tuple[str, str]:
    """(certificate PEM, key PEM) valid from ``start`` to ``end`` (naive UTC)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start.replace(tzinfo=dt.UTC))
            .not_valid_after(end.replace(tzinfo=dt.UTC))
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM).decode(),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()).decode())


@pytest.fixture(scope="module")
def rollover():
    """Old certificates ending in 10 days, new ones valid from 5 days ago for a year
    (both valid now); and one that expired a year ago."""
    old_end, new_start = NOW + dt.timedelta(days=10), NOW - dt.timedelta(days=5)
    return {
        "acme_old": make_cert("acme-2025", NOW - dt.timedelta(days=365), old_end),
        "acme_new": make_cert("acme-2026", new_start, NOW + dt.timedelta(days=365)),
        "hub_old": make_cert("hub-2025", NOW - dt.timedelta(days=365), old_end),
        "hub_new": make_cert("hub-2026", new_start, NOW + dt.timedelta(days=365)),
        "acme_expired": make_cert("acme-2020", NOW - dt.timedelta(days=800),
                                  NOW - dt.timedelta(days=400)),
    }


def later(monkeypatch, days: int) -> None:
    """The AS2 code's clock ``days`` on."""
    monkeypatch.setattr(lib, "utcnow", lambda: utcnow() + dt.timedelta(days=days))


def post_from_acme(as2, sign_with: tuple[str, str], encrypt_to: str,
                   message_id: str, ids: tuple[str, str] = ("ACME", "HUB")
                   ) -> requests.Response:
    """A message built by pyas2lib as the partner: signed with ``sign_with``, encrypted
    to ``encrypt_to``, asking for a signed sync MDN; ``ids``: its AS2-From and -To."""
    cert, key = sign_with
    message = Message(Organization(as2_name=ids[0], sign_key=(key + cert).encode()),
                      Partner(as2_name=ids[1], verify_cert=encrypt_to.encode(),
                              encrypt_cert=encrypt_to.encode(), validate_certs=False,
                              sign=True, encrypt=True, digest_alg="sha256",
                              mdn_mode="SYNC", mdn_digest_alg="sha256"))
    message.build(DATA, message_id=message_id)
    return requests.post(as2.url, data=message.content, headers=dict(message.headers),
                         timeout=30)


def setup_rollover(as2, rollover, accept_expired: bool = False) -> None:
    profiles.save_profile(as2.session, "organization", "mycompany", {"certificates": [
        {"pem": rollover["hub_old"][0], "private_key_pem": rollover["hub_old"][1]},
        {"pem": rollover["hub_new"][0], "private_key_pem": rollover["hub_new"][1]}]})
    profiles.save_profile(as2.session, "partner", "acme", {
        "certificate": {"pem": rollover["acme_old"][0]},
        "add_certificate": {"pem": rollover["acme_new"][0], "role": "both"},
        "sign": True, "encrypt": True, "accept_expired_certificates": accept_expired})
    as2.session.commit()


def outcome(as2, answer) -> tuple[str, list[str]]:
    """(the MDN's disposition text, the history lines of the message it answered)."""
    assert answer.status_code == 200
    message = as2.messages()[-1]
    return answer.content.decode("latin-1"), as2.lines(message.id)


def test_rollover_with_overlap_either_certificate_then_only_the_new(as2, rollover,
                                                                   monkeypatch):
    setup_rollover(as2, rollover)
    # during the overlap: signed with either of the partner's, encrypted to either of ours
    for i, (signer, ours) in enumerate([("acme_old", "hub_old"), ("acme_new", "hub_new"),
                                        ("acme_old", "hub_new"), ("acme_new", "hub_old")]):
        answer = post_from_acme(as2, rollover[signer], rollover[ours][0], f"overlap-{i}")
        text, lines = outcome(as2, answer)
        assert "processed" in text and "processed/error" not in text.lower(), lines
        assert not any(line.startswith("warning") for line in lines)
    assert len(as2.messages()) == 4
    # after the old ones ended: the new ones only, the old refused with the reason
    later(monkeypatch, 20)
    answer = post_from_acme(as2, rollover["acme_new"], rollover["hub_new"][0], "after-ok")
    text, lines = outcome(as2, answer)
    assert "processed/error" not in text.lower(), lines
    answer = post_from_acme(as2, rollover["acme_old"], rollover["hub_new"][0], "after-sig")
    text, lines = outcome(as2, answer)
    assert "authentication-failed" in text.lower(), text
    answer = post_from_acme(as2, rollover["acme_new"], rollover["hub_old"][0], "after-enc")
    text, lines = outcome(as2, answer)
    assert "decryption-failed" in text.lower(), text


def test_outbound_uses_the_newest_valid_certificate(as2, rollover, peer, monkeypatch):
    url, bodies = peer
    setup_rollover(as2, rollover)
    as2.choose(url=url, mdn_mode="none")
    serials = {name: x509.load_pem_x509_certificate(rollover[name][0].encode()).serial_number
               for name in ("acme_old", "acme_new")}
    as2.outbound()
    as2.drain()
    recipient = cms.ContentInfo.load(bodies[-1])["content"]["recipient_infos"][0].chosen
    assert recipient["rid"].chosen["serial_number"].native == serials["acme_new"]


def test_an_expired_certificate_is_refused_by_default_with_the_reason(as2, rollover):
    profiles.save_profile(as2.session, "partner", "acme", {
        "certificate": {"pem": rollover["acme_expired"][0]}, "sign": True,
        "encrypt": True})
    as2.session.commit()
    alerts = as2.session.scalars(select(Alert).where(
        Alert.kind == "certificate_expiring")).all()
    assert any("acme-2020" in a.text and "expired" in a.text for a in alerts), \
        "saving an expired certificate raises the alert at once"
    answer = post_from_acme(as2, rollover["acme_expired"], as2_hub_cert(as2), "expired-1")
    text, lines = outcome(as2, answer)
    assert "authentication-failed" in text.lower(), text
    reason = " ".join(lines)
    assert "signing certificate of acme expired" in reason and "acme-2020" in reason
    assert "accept_expired_certificates is off" in reason


def test_an_expired_certificate_is_accepted_with_the_option_and_a_warning(as2, rollover):
    profiles.save_profile(as2.session, "partner", "acme", {
        "certificate": {"pem": rollover["acme_expired"][0]}, "sign": True,
        "encrypt": True, "accept_expired_certificates": True})
    as2.session.commit()
    answer = post_from_acme(as2, rollover["acme_expired"], as2_hub_cert(as2), "expired-2")
    text, lines = outcome(as2, answer)
    assert "processed/error" not in text.lower(), lines
    [message] = as2.messages()
    assert as2.stages(message.id)["unpacked"] == DATA
    warnings = as2.lines(message.id, "warning")
    assert warnings and "expired" in warnings[0] and "accept_expired_certificates is on" \
        in warnings[0]


def test_sending_to_an_expired_certificate_fails_with_the_reason(as2, rollover, peer):
    url, bodies = peer
    profiles.save_profile(as2.session, "partner", "acme", {
        "certificate": {"pem": rollover["acme_expired"][0]}, "url": url, "encrypt": True,
        "mdn_mode": "none"})
    as2.session.commit()
    message = as2.outbound()
    as2.drain()
    delivery = as2.delivery(message.id)
    assert delivery.state == "failed" and not bodies
    assert "encryption certificate of acme expired" in delivery.last_result


def test_profile_api_lists_every_certificate_with_role_and_expiry_flag(as2, rollover):
    setup_rollover(as2, rollover)
    shown = profiles.profile_json(profiles.get_profile(as2.session, "partner", "acme"),
                                  utcnow())
    assert [(c["subject"], c["role"], c["expiring"]) for c in shown["certificates"]] == [
        ("CN=acme-2025", "both", True), ("CN=acme-2026", "both", False)]
    with pytest.raises(profiles.ServiceError, match="role must be one of"):
        profiles.save_profile(as2.session, "partner", "acme", {
            "add_certificate": {"pem": rollover["acme_new"][0], "role": "tls"}})


def as2_hub_cert(as2) -> str:
    return profiles.by_party(as2.session, "mycompany").cert_pem


def test_parties_page_and_dashboard_flag_certificates_ending_within_30_days(as2, rollover,
                                                                          login):
    setup_rollover(as2, rollover)
    client = login("viewer")
    page = client.get("/ui/parties").text
    row = page[page.index('data-party="acme"'):]
    row = row[:row.index("</tr>")]
    assert "certificate CN=acme-2025 ends" in row and "acme-2026" not in row
    board = client.get("/ui/").text
    card = board[board.index('id="certificates-ending"'):]
    card = card[:card.index("</div></div>") if "</div></div>" in card else 400]
    assert "certificates ending within 30 days" in card
    assert "acme: CN=acme-2025" in card and "mycompany: CN=hub-2025" in card

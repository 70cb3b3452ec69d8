"""AS2 profiles in the web UI: certificates uploaded as files (PEM with its key, PKCS#12
with its password, a partner's certificate), their validity shown, bad uploads refused
beside the field with nothing saved and nothing typed lost, roles, history lines."""

from __future__ import annotations

import io
import re

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12
from sqlalchemy import select

from b2bhub.models import Certificate, HistoryLine, ProtocolProfile
from plugins.as2.plugin import As2Receiver, As2Sender
from tests import test_ui
from tests.as2kit import make_pair

# the UI tests' fixtures: a logged-in client per role, a fresh ``g`` per request
login, fresh_user_per_request = test_ui.login, test_ui.fresh_user_per_request

ORG = "/ui/parties/organization/mycompany/as2"
PARTNER = "/ui/parties/partner/acme/as2"


@pytest.fixture(autouse=True)
def as2_types(registry):
    """The AS2 plugin types add the ``as2`` profile kind these pages show."""
    registry.register(As2Receiver)
    registry.register(As2Sender)


@pytest.fixture(scope="module")
def pairs():
    return {"hub": make_pair("hub.example"), "acme": make_pair("acme.example", days=10),
            "p12": make_pair("p12.example", days=200)}


@pytest.fixture
def parties(hub):
    hub.parties(organizations=("mycompany",), partners=("acme",))
    return hub


def pkcs12_file(pair, password: bytes) -> bytes:
    cert = x509.load_pem_x509_certificate(pair[0].encode())
    key = serialization.load_pem_private_key(pair[1].encode(), None)
    return pkcs12.serialize_key_and_certificates(
        b"ours", key, cert, None, serialization.BestAvailableEncryption(password))


def upload(data: bytes, name: str):
    return (io.BytesIO(data), name)


def org_form(**extra) -> dict:
    return {"as2_id": "HUB", "mdn_url": "", "sign": "y", "digest_alg": "sha256",
            "encrypt": "y", "encryption_alg": "aes_256_cbc", "mdn_mode": "sync",
            "mdn_signed": "y", "mdn_digest_alg": "sha256", "receipt_timeout": "86400",
            "chunked": "y", "content_type": "application/edi-consent",
            "subject": "AS2 Message", **extra}


def partner_form(**extra) -> dict:
    return org_form(**{"as2_id": "ACME", "url": "https://acme.example/as2", "mdn_url": None,
                       **extra})


def post(client, url, data):
    return client.post(url, data={k: v for k, v in data.items() if v is not None},
                       content_type="multipart/form-data")


def config_lines(session) -> list[HistoryLine]:
    return session.scalars(select(HistoryLine).where(
        HistoryLine.type == "config_changed").order_by(HistoryLine.id)).all()


def test_our_certificate_and_key_as_pem_files_then_as_pkcs12(parties, login, session,
                                                              pairs):
    client = login("admin", "ada")
    assert "No AS2 profile yet" in client.get(ORG).text
    done = post(client, ORG, org_form(
        certificate_file=upload(pairs["hub"][0].encode(), "hub.crt"),
        key_file=upload(pairs["hub"][1].encode(), "hub.key"), mdn_mode="async"))
    assert done.status_code == 302, done.text
    page = client.get(ORG).text
    assert "CN=hub.example" in page and "ours, with its private key" in page
    assert re.search(r'<td class="num">36[45]</td>\s*<td><span class="status s-delivered">'
                     r'valid</span>', page)
    assert "PRIVATE KEY" not in page
    [line] = config_lines(session)
    assert line.actor == "ada"
    assert line.text.startswith("ada: created the AS2 profile of organization mycompany "
                                "(AS2 ID HUB) with the certificate CN=hub.example valid "
                                "until ")
    assert "HUB" in client.get("/ui/parties").text

    replaced = post(client, ORG, org_form(
        certificate_file=upload(pkcs12_file(pairs["p12"], b"s3cret pass"), "ours.p12"),
        password="s3cret pass", mdn_mode="async"))
    assert replaced.status_code == 302, replaced.text
    page = client.get(ORG).text
    assert "CN=p12.example" in page and "CN=hub.example" not in page
    assert re.search(r'<td class="num">(199|200)</td>', page)
    assert "s3cret" not in page
    [cert] = session.scalars(select(Certificate)).all()
    assert cert.subject == "CN=p12.example" and "PRIVATE KEY" in cert.private_key_pem
    lines = config_lines(session)
    assert "changed the AS2 profile of organization mycompany" in lines[-1].text
    assert not any("s3cret" in line.text for line in lines)
    assert session.scalar(select(ProtocolProfile.settings))["mdn_mode"] == "async"


def test_a_partner_certificate_expiring_within_30_days_is_highlighted(parties, login,
                                                                       session, pairs):
    client = login("admin")
    der = x509.load_pem_x509_certificate(pairs["acme"][0].encode()).public_bytes(
        serialization.Encoding.DER)
    done = post(client, PARTNER, partner_form(certificate_file=upload(der, "acme.cer")))
    assert done.status_code == 302, done.text
    page = client.get(PARTNER).text
    row = re.search(r'<tr class="expiring">.*?</tr>', page, re.S).group(0)
    assert "CN=acme.example" in row and "expires within 30 days" in row
    assert re.search(r'<td class="num">(9|10)</td>', row)
    assert "https://acme.example/as2" in page


def test_not_a_certificate_is_refused_beside_the_field_and_keeps_what_was_typed(
        parties, login, session):
    client = login("admin")
    refused = post(client, PARTNER, partner_form(
        as2_id="ACME-X2", mdn_mode="async", receipt_timeout="3600",
        certificate_file=upload(b"just some text\n", "notes.txt")))
    assert refused.status_code == 400
    assert re.search(r'id="certificate_file".*?<span class="error">not a certificate: '
                     r'expected a PEM or DER certificate or a PKCS#12 file', refused.text, re.S)
    assert 'value="ACME-X2"' in refused.text
    assert 'value="https://acme.example/as2"' in refused.text
    assert 'value="3600"' in refused.text
    assert re.search(r'<option selected value="async">', refused.text)
    assert "Browsers never fill in chosen files or passwords again" in refused.text
    assert session.scalar(select(ProtocolProfile)) is None
    assert config_lines(session) == []

    no_cert = post(client, PARTNER, partner_form())
    assert re.search(r'id="certificate_file".*?<span class="error">an AS2 profile needs a '
                     r'certificate', no_cert.text, re.S)
    slow = post(client, PARTNER, partner_form(receipt_timeout="a day"))
    assert re.search(r'id="receipt_timeout".*?<span class="error">must be a whole number',
                     slow.text, re.S)
    assert session.scalar(select(ProtocolProfile)) is None


def test_a_wrong_pkcs12_password_is_refused_and_changes_nothing(parties, login, session,
                                                                 pairs):
    client = login("admin")
    assert post(client, ORG, org_form(
        certificate_file=upload((pairs["hub"][0] + pairs["hub"][1]).encode(), "hub.pem"))
    ).status_code == 302
    refused = post(client, ORG, org_form(
        as2_id="HUB2", certificate_file=upload(pkcs12_file(pairs["p12"], b"right"), "x.p12"),
        password="wrong"))
    assert refused.status_code == 400
    assert re.search(r'id="certificate_file".*?<span class="error">PKCS#12 could not be '
                     r'opened \(wrong password or not PKCS#12\)', refused.text, re.S)
    assert 'value="HUB2"' in refused.text and 'value="wrong"' not in refused.text
    session.expire_all()
    profile = session.scalar(select(ProtocolProfile))
    assert profile.address == "HUB"
    assert [c.subject for c in profile.certificates] == ["CN=hub.example"]
    assert len(config_lines(session)) == 1

    unkeyed = post(client, ORG, org_form(certificate_file=upload(pairs["p12"][0].encode(),
                                                                 "p12.crt")))
    assert re.search(r'id="certificate_file".*?<span class="error">our own certificate must '
                     r'come with its private key', unkeyed.text, re.S)


def test_a_viewer_sees_the_profile_but_cannot_change_it(parties, login, session, pairs):
    admin = login("admin", "ada")
    assert post(admin, PARTNER, partner_form(
        certificate_file=upload(pairs["acme"][0].encode(), "acme.pem"))).status_code == 302
    viewer = login("viewer")
    page = viewer.get(PARTNER)
    assert page.status_code == 200 and "CN=acme.example" in page.text
    assert "<form" not in page.text.split("<main", 1)[1]
    assert 'type="file"' not in page.text and "Delete AS2 profile" not in page.text
    assert "Add AS2 profile" not in viewer.get("/ui/parties").text
    assert post(viewer, PARTNER, partner_form(as2_id="EVIL")).status_code == 403
    assert viewer.post(PARTNER + "/delete").status_code == 403
    session.expire_all()
    assert session.scalar(select(ProtocolProfile.address)) == "ACME"
    assert session.scalar(select(HistoryLine).where(HistoryLine.actor == "viewer1")) is None


def test_deleting_a_profile_is_a_history_line(parties, login, session, pairs):
    client = login("admin", "ada")
    post(client, PARTNER, partner_form(
        certificate_file=upload(pairs["acme"][0].encode(), "acme.pem")))
    gone = client.post(PARTNER + "/delete", data={"confirm": "yes"}, follow_redirects=True)
    assert "No AS2 profile yet" in gone.text
    assert "Deleted the AS2 profile of partner acme" in gone.text
    assert session.scalar(select(ProtocolProfile)) is None
    assert config_lines(session)[-1].text == "ada: deleted the AS2 profile of partner acme"


def test_our_identity_and_the_receipt_option_are_edited_in_the_form(parties, login, session,
                                                                    pairs):
    from plugins.as2 import profiles
    client = login("admin", "ada")
    done = post(client, ORG, org_form(
        certificate_file=upload(pairs["hub"][0].encode(), "hub.crt"),
        key_file=upload(pairs["hub"][1].encode(), "hub.key"),
        message_id_domain="as2.mycompany.example", disposition_notification_to="",
        mdn_text="Thank you, from My Company.", mdn_failed_text=""))
    assert done.status_code == 302, done.text
    org = profiles.by_party(session, "mycompany")
    assert org.get("message_id_domain") == "as2.mycompany.example"
    assert org.get("mdn_text") == "Thank you, from My Company."
    assert org.get("disposition_notification_to") is None  # empty: the default
    page = client.get(ORG).text
    assert "as2.mycompany.example" in page and "Thank you, from My Company." in page
    bad = post(client, ORG, org_form(message_id_domain="not a domain"))
    assert bad.status_code == 400 and "must be a domain name" in bad.text
    assert profiles.by_party(session, "mycompany").get("message_id_domain") \
        == "as2.mycompany.example"  # nothing saved
    done = post(client, PARTNER, partner_form(
        certificate_file=upload(pairs["acme"][0].encode(), "acme.crt"),
        accept_mdn_without_mic="y"))
    assert done.status_code == 302, done.text
    assert profiles.by_party(session, "acme").get("accept_mdn_without_mic") is True

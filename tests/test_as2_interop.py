"""AS2 as other products meet it: the defaults that interoperate (Content-Length, a 411
answered), our own identity on the wire, receipts that mean what they say, and the bytes
of a document as they are. The partner is the pyas2lib process of ``test_as2`` with its
quirks switched on per test.
"""

# ruff: noqa: F811  (the fixtures of test_as2, imported, are the tests' parameters)
from __future__ import annotations

import base64
import email
import hashlib
import re
from email import policy

import pytest
import requests

from plugins.as2 import lib, profiles
from tests.test_as2 import (  # noqa: F401  (fixtures)
    DATA,
    PATHS,
    as2,
    certs,
    partner,
    post,
    wait_for,
)

FOREIGN = (b"pyas2", b"pyAS2", b"localhost", b"OpenAS2", b"mendelson", b"django",
           b"Open Source AS2")


@pytest.fixture
def quirks(as2):
    """Partner quirks switched on by a test, switched off after it."""
    used: set[str] = set()

    def switch(**config):
        used.update(config)
        as2.partner.configure(**config)

    yield switch
    as2.partner.configure(**{k: False for k in used})


def _sent(as2, body: bytes = DATA):
    seen = len(as2.partner.received())
    message = as2.outbound(body)
    as2.drain()
    got = as2.partner.received()[seen:]
    return message, got


# --- 1. defaults -----------------------------------------------------------------------

@PATHS
def test_the_default_sends_content_length_to_a_peer_reading_by_content_length_only(
        as2, quirks):
    assert profiles.CHOICES["chunked"][0] is False
    quirks(content_length_only=True)
    for sign, encrypt, mdn in ((True, True, "sync"), (False, False, "none"),
                               (True, False, "async")):
        as2.choose(sign=sign, encrypt=encrypt, mdn_mode=mdn, mdn_signed=True)
        message, [got] = _sent(as2)
        assert got["status"] == "processed" and not got["chunked"], got
        assert base64.b64decode(got["content"]) == DATA
        assert wait_for(lambda m=message: as2.delivery(m.id).state == "delivered"), \
            as2.delivery(message.id).last_result


@PATHS
def test_a_peer_answering_411_to_chunked_gets_the_message_again_with_content_length(
        as2, quirks):
    quirks(refuse_chunked=True)
    as2.choose(sign=True, encrypt=True, mdn_mode="sync", mdn_signed=True)
    message, [got] = _sent(as2)  # the default: never chunked, no 411
    assert not got["chunked"] and as2.delivery(message.id).state == "delivered"
    as2.choose(chunked=True)  # chunked on request: 411, then once with Content-Length
    message, got = _sent(as2)
    assert [g["chunked"] for g in got] == [False] and got[0]["status"] == "processed"
    delivery = as2.delivery(message.id)
    assert delivery.state == "delivered", delivery.last_result
    assert "MIC verified" in delivery.last_result
    assert "411 to chunked: sent again with Content-Length" in delivery.last_result


# --- 2. identity -----------------------------------------------------------------------

def _assert_ours(wire: bytes) -> None:
    # the Server header included: the hub names itself whichever server it runs under
    # (gunicorn's own name is replaced: tests/test_web_workers.py)
    for word in FOREIGN:
        at = wire.lower().find(word.lower())
        assert at < 0, (word, wire[max(0, at - 300):at + 100])


@PATHS
def test_nothing_we_send_names_another_product_or_localhost(as2):
    # messages and the MDNs we return (sync, signed and not) or post (async)
    as2.choose(sign=True, encrypt=False, mdn_mode="sync", mdn_signed=True)
    message, [got] = _sent(as2)
    wire = base64.b64decode(got["wire"])
    _assert_ours(wire)
    head = lib.read_headers(wire.partition(b"\r\n\r\n")[0])
    assert head["user-agent"] == lib.PRODUCT and lib.PRODUCT.startswith("b2bhub/")
    assert re.fullmatch(r"<[^@<>]+@[^@<>]+>", head["message-id"])
    assert head["disposition-notification-to"] == f"as2@{lib.default_domain()}"
    # the peer gets AS2 1.2 and exactly the RFC 6017 features we implement: CEM (on
    # both paths: PATHS sends in memory and streamed)
    assert head["as2-version"] == "1.2" and head["ediint-features"] == "CEM"
    assert wire.lower().count(b"ediint-features:") == 1
    for mdn_signed in (True, False):
        result = as2.partner.send(as2.url, sign=True, mdn_mode="sync", mdn_signed=mdn_signed)
        assert result["mdn_status"] == "processed", result
        mdn = base64.b64decode(result["mdn_wire"])
        _assert_ours(mdn)
        assert b"Reporting-UA: " in mdn and lib.PRODUCT.encode() in mdn
        assert lib.MDN_TEXT.encode() in mdn
        assert lib.PRODUCT in lib.read_headers(mdn.partition(b"\r\n\r\n")[0])["server"]
    before = len(as2.partner.mdns())
    result = as2.partner.send(as2.url, sign=True, mdn_mode="async", mdn_signed=True)
    assert result["http_status"] == 200
    from b2bhub.models import utcnow
    from plugins.as2.mdn_out import send_due_mdns
    assert send_due_mdns(as2.session, as2.hub.store, utcnow()) == 1
    [posted] = wait_for(lambda: as2.partner.mdns()[before:])
    assert posted["status"] == "processed"
    _assert_ours(base64.b64decode(posted["wire"]))
    # a negative MDN for a message we could not read names no other product either
    refused = post(as2, b"not cms at all")
    assert refused.status_code == 200 and b"processed/error" in refused.content.lower()
    _assert_ours(b"".join(f"{k}: {v}\r\n".encode() for k, v in refused.headers.items())
                 + refused.content)
    assert lib.MDN_FAILED_TEXT.encode() in refused.content


def test_the_organization_profile_names_domain_receipt_address_and_mdn_words(as2):
    profiles.save_profile(as2.session, "organization", "mycompany", {
        "message_id_domain": "as2.mycompany.example",
        "disposition_notification_to": "edi-team@mycompany.example",
        "mdn_text": "Received by My Company's hub, thank you.",
        "mdn_failed_text": "My Company's hub could not take this message."})
    as2.session.commit()
    as2.choose(sign=True, encrypt=True, mdn_mode="sync", mdn_signed=True)
    message, [got] = _sent(as2)
    assert got["message_id"].endswith("@as2.mycompany.example")
    wire = base64.b64decode(got["wire"])
    head = lib.read_headers(wire.partition(b"\r\n\r\n")[0])
    assert head["disposition-notification-to"] == "edi-team@mycompany.example"
    result = as2.partner.send(as2.url, sign=True, encrypt=True, mdn_mode="sync",
                              mdn_signed=True)
    mdn = base64.b64decode(result["mdn_wire"])
    assert b"Received by My Company's hub, thank you." in mdn
    assert re.search(rb"Message-ID: <[^>]+@as2\.mycompany\.example>", mdn)


def test_identity_choices_are_checked(as2):
    for body in ({"message_id_domain": "not a domain"},
                 {"disposition_notification_to": "a@b\r\nBcc: x"},
                 {"accept_mdn_without_mic": "yes"}):
        with pytest.raises(profiles.ServiceError):
            profiles.save_profile(as2.session, "organization", "mycompany", body)
        as2.session.rollback()


def test_the_default_domain_is_never_localhost_when_a_better_name_is_known(monkeypatch):
    import socket
    monkeypatch.setattr(socket, "getfqdn", lambda *a: "localhost")
    monkeypatch.setattr(socket, "gethostname", lambda: "edi-gw")
    assert lib.default_domain() == "edi-gw"
    org = profiles.As2Profile("o", "organization", "HUB",
                              {"mdn_url": "https://as2.example.com/as2/in"}, None, None, None)
    assert lib.default_domain(org) == "as2.example.com"
    org = profiles.As2Profile("o", "organization", "HUB",
                              {"mdn_url": "http://127.0.0.1:8080/as2/in"}, None, None, None)
    assert lib.default_domain(org) == "edi-gw"
    monkeypatch.setattr(socket, "gethostname", lambda: "localhost")
    assert "localhost" not in lib.default_domain()


# --- 4. receipts -----------------------------------------------------------------------

def _receipt(as2, quirks, quirk: str, **choices):
    quirks(mdn_quirk=quirk)
    as2.choose(sign=True, encrypt=True, mdn_mode="sync", mdn_signed=True, **choices)
    message, [got] = _sent(as2)
    assert got["status"] == "processed", got
    return as2.delivery(message.id)


def test_a_negative_disposition_is_the_partners_refusal(as2, quirks):
    delivery = _receipt(as2, quirks, "negative")
    assert delivery.state == "failed"
    assert "negative MDN from the partner: processed/Error: decryption-failed" \
        in delivery.last_result


def test_an_mdn_whose_signature_fails_our_check_is_not_called_negative(as2, quirks):
    delivery = _receipt(as2, quirks, "bad_signature")
    assert delivery.state == "failed"
    assert "MDN signature failed our verification" in delivery.last_result
    assert "negative" not in delivery.last_result


def test_a_mic_that_differs_is_a_mic_mismatch(as2, quirks):
    delivery = _receipt(as2, quirks, "wrong_mic")
    assert delivery.state == "failed"
    assert "MIC mismatch" in delivery.last_result and "negative" not in delivery.last_result


def test_a_signed_mdn_without_mic_fails_by_default_and_is_never_mic_verified(as2, quirks):
    delivery = _receipt(as2, quirks, "no_mic")
    assert delivery.state == "failed"
    assert "signed MDN without Received-Content-MIC" in delivery.last_result
    assert "MIC verified" not in delivery.last_result
    delivery = _receipt(as2, quirks, "no_mic", accept_mdn_without_mic=True)
    assert delivery.state == "delivered"
    assert "warning: signed MDN without Received-Content-MIC" in delivery.last_result
    assert "MIC verified" not in delivery.last_result
    # asynchronous: the same judgement
    quirks(mdn_quirk="no_mic")
    as2.choose(mdn_mode="async", accept_mdn_without_mic=False)
    message, _got = _sent(as2)
    assert wait_for(lambda: as2.delivery(message.id).state == "failed")
    assert "signed MDN without Received-Content-MIC" in as2.delivery(message.id).last_result


def _entity_mic(entity: email.message.Message, alg: str) -> str:
    head = "".join(f"{k}: {v}\r\n" for k, v in entity.items()
                   if k.lower().startswith("content-") and k.lower() != "content-length")
    body = entity.get_payload(decode=True)
    return base64.b64encode(hashlib.new(alg, head.encode() + b"\r\n" + body).digest()).decode()


@PATHS
def test_our_signed_receipt_of_an_unsigned_message_carries_its_mic(as2):
    as2.choose(sign=False, encrypt=False)
    result = as2.partner.send(as2.url, sign=False, encrypt=False, mdn_mode="sync",
                              mdn_signed=True)
    assert result["mdn_status"] == "processed" and result["mdn_signed"], result
    mdn = base64.b64decode(result["mdn_wire"])
    found = re.search(rb"Received-content-MIC: ([^,\r\n]+), sha256", mdn, re.I)
    assert found, mdn
    [message] = as2.messages()
    raw = as2.stages(message.id)["raw"]
    entity = email.message_from_bytes(raw, policy=policy.compat32)
    assert found.group(1).decode() == _entity_mic(entity, "sha256")
    # and the other way: an unsigned message of ours asking a signed receipt has a MIC
    # the receipt must confirm (a wrong one is a MIC mismatch, not "MIC verified")
    as2.choose(sign=False, encrypt=True, mdn_mode="sync", mdn_signed=True)
    message, [got] = _sent(as2)
    from sqlalchemy import select

    from plugins.as2.models import As2Outbound
    row = as2.session.scalar(select(As2Outbound).where(As2Outbound.message_id == message.id))
    assert row.mic and row.digest_alg == "sha256"


# --- 5. bytes as they are --------------------------------------------------------------

BINARY = bytes(range(256)) * 40 + b"\r\n\n\r\x00\x1a"
DOCUMENTS = [
    ("application/edi-consent", (b"UNA:+.? 'UNB+UNOC:3+ACME+HUB'\n" * 330)[:10240]),
    ("application/edi-x12", b"ISA*00*~\r\nGS*PO*ACME~\r\nST*850*0001~\r\n" * 100),
    ("application/xml", b"<?xml version='1.0'?>\n<order>\n  <line n='1'/>\r\n</order>\n"),
    ("application/octet-stream", BINARY),
]


@PATHS
@pytest.mark.parametrize("sign,encrypt,compress", [(True, True, False), (False, False, False),
                                                   (True, False, True)])
def test_the_partner_receives_each_document_byte_for_byte(as2, sign, encrypt, compress):
    for content_type, body in DOCUMENTS:
        as2.choose(sign=sign, encrypt=encrypt, compress=compress, mdn_mode="sync",
                   mdn_signed=True, content_type=content_type,
                   accept_mdn_without_mic=not sign)
        message, [got] = _sent(as2, body)
        assert got["status"] == "processed", (content_type, got)
        assert base64.b64decode(got["content"]) == body, content_type
        delivery = as2.delivery(message.id)
        assert delivery.state == "delivered", (content_type, delivery.last_result)
        if sign:
            assert "MIC verified" in delivery.last_result
        sent = as2.stages(message.id)["sent"]
        if not (sign or encrypt or compress):  # the document is the body itself
            assert sent.endswith(b"\r\n\r\n" + body)
            assert b"content-transfer-encoding: binary" in sent.lower()


# --- 6 (part). an MDN no message of ours matches -------------------------------------

def test_an_unmatched_mdn_is_kept_as_an_unattributable_receipt_and_cleaned_with_the_rest(
        as2):
    from datetime import timedelta

    from sqlalchemy import select

    from b2bhub.engine.cleanup import plugin_references, run_cleanup
    from b2bhub.models import Alert, Message, Payload, utcnow
    from b2bhub.payloads.store import PayloadMissing
    from plugins.as2.mdn_in import UNMATCHED_ALERT

    body = (b"--b1\r\nContent-Type: text/plain\r\n\r\nreceipt\r\n--b1\r\n"
            b"Content-Type: message/disposition-notification\r\n\r\n"
            b"Reporting-UA: acme\r\nOriginal-Recipient: rfc822; HUB\r\n"
            b"Final-Recipient: rfc822; HUB\r\nOriginal-Message-ID: <never-sent@hub.example>\r\n"
            b"Disposition: automatic-action/MDN-sent-automatically; processed\r\n\r\n"
            b"--b1--\r\n")
    answer = requests.post(as2.url, data=body, timeout=30, headers={
        "Content-Type": 'multipart/report; report-type=disposition-notification; '
                        'boundary="b1"',
        "AS2-From": "ACME", "AS2-To": "HUB", "AS2-Version": "1.2",
        "Message-ID": "<mdn-1@acme.example>"})
    assert answer.status_code == 200, answer.text  # not refused: nothing to post again
    assert "never-sent@hub.example" in answer.text
    [message] = as2.messages()
    assert message.status == "refused" and message.from_party == "ACME"
    assert "unattributable MDN" in message.status_text
    assert "never-sent@hub.example" in message.status_text
    raw = as2.stages(message.id)["raw"]
    assert raw.endswith(body)
    [alert] = as2.session.scalars(select(Alert).where(Alert.kind == UNMATCHED_ALERT))
    assert alert.message_id == message.id and "never-sent@hub.example" in alert.text
    # retention removes it, and its stored MDN, with the rest
    digest = as2.session.scalar(select(Payload.digest).where(
        Payload.message_id == message.id, Payload.stage == "raw"))
    message_id = message.id
    report = run_cleanup(as2.session, as2.hub.store, utcnow() + timedelta(days=400),
                         "tests", references=plugin_references(as2.hub.registry),
                         orphan_grace=0)  # the file was just written
    assert report.messages >= 1 and report.files >= 1
    as2.session.expire_all()
    assert as2.session.scalar(select(Message.id).where(Message.id == message_id)) is None
    with pytest.raises(PayloadMissing):
        as2.hub.store.open(digest)

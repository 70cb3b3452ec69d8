"""Key wrapping of AS2 envelopes both ways (issue 17, scope 6): the hub receives content
keys wrapped with PKCS#1 v1.5 and RSAES-OAEP with SHA-1, SHA-256 and SHA-512 from a
client made of ``openssl cms``, and sends with the partner profile's ``key_encryption``
to a peer that decrypts with ``openssl cms -decrypt`` (and, for SHA-1, to the pyas2lib
partner process).

The hub, its partner process and its profiles are test_as2's fixtures, imported here
(hence the file-wide F811: pytest passes them to the tests under the same names)."""

# ruff: noqa: F401, F811

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import threading

import pytest
import requests
from sqlalchemy import select
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from b2bhub.models import utcnow
from b2bhub.plugin import ServiceError
from plugins.as2 import profiles
from plugins.as2.models import As2Outbound
from tests.loopback import serve_in_thread
from tests.test_as2 import (
    DATA,
    PATHS,
    as2,
    certs,
    openssl,
    partner,
)

WRAPS = {"rsa_pkcs1v15": (), "rsaes_oaep_sha1": ("sha1",), "rsaes_oaep_sha256": ("sha256",),
         "rsaes_oaep_sha512": ("sha512",)}


def _files(certs, tmp_path) -> dict:
    files = {}
    for name, text in (("acme.pem", certs["acme"][0]), ("acme.key", certs["acme"][1]),
                       ("hub.pem", certs["hub"][0])):
        files[name] = tmp_path / name
        files[name].write_text(text)
    return files


def _printed(der: bytes, tmp_path) -> str:
    """``openssl cms -cmsout -print`` of an envelope: what openssl reads in it."""
    (tmp_path / "printed.der").write_bytes(der)
    return openssl("cms", "-cmsout", "-print", "-inform", "DER", "-in",
                   str(tmp_path / "printed.der")).decode()


@PATHS
@pytest.mark.parametrize("wrap", WRAPS)
def test_openssl_client_with_each_key_wrapping_is_decrypted_and_verified(as2, certs,
                                                                         tmp_path, wrap):
    as2.choose(sign=True, encrypt=True)
    files = _files(certs, tmp_path)
    entity = tmp_path / "entity"
    entity.write_bytes(b"Content-Type: application/edi-x12\r\n\r\n" + DATA)
    signed = openssl("cms", "-sign", "-in", str(entity), "-signer", str(files["acme.pem"]),
                     "-inkey", str(files["acme.key"]), "-md", "sha256", "-binary",
                     "-outform", "SMIME")
    (tmp_path / "signed").write_bytes(signed.replace(b"\n", b"\r\n")
                                      .replace(b"\r\r\n", b"\r\n"))
    keyopts = []
    for digest in WRAPS[wrap]:
        keyopts = ["-keyopt", "rsa_padding_mode:oaep", "-keyopt", f"rsa_oaep_md:{digest}",
                   "-keyopt", f"rsa_mgf1_md:{digest}"]
    encrypted = openssl("cms", "-encrypt", "-in", str(tmp_path / "signed"), "-binary",
                        "-aes256", "-outform", "DER", "-recip", str(files["hub.pem"]),
                        *keyopts)
    printed = _printed(encrypted, tmp_path)
    assert ("rsaesOaep" in printed) is bool(WRAPS[wrap])
    if WRAPS[wrap] and WRAPS[wrap][0] != "sha1":
        assert WRAPS[wrap][0] in printed
    answer = requests.post(as2.url, data=encrypted, timeout=30, headers={
        "AS2-From": "ACME", "AS2-To": "HUB", "AS2-Version": "1.2",
        "Message-ID": f"<keywrap-{wrap}@acme.example>",
        "Content-Type": 'application/pkcs7-mime; smime-type=enveloped-data; name="smime.p7m"',
        "Disposition-Notification-To": "edi@acme.example",
        "Disposition-Notification-Options": "signed-receipt-protocol=required, "
        "pkcs7-signature; signed-receipt-micalg=required, sha256"})
    assert answer.status_code == 200
    mdn = tmp_path / "mdn"
    mdn.write_bytes(f"Content-Type: {answer.headers['Content-Type']}\r\n\r\n".encode()
                    + answer.content)
    report = openssl("cms", "-verify", "-in", str(mdn), "-inform", "SMIME", "-noverify",
                     "-certfile", str(files["hub.pem"]))
    assert b"processed" in report and b"processed/" not in report, report
    [message] = as2.messages()
    assert as2.stages(message.id)["unpacked"] == DATA


@PATHS
def test_an_oaep_key_for_another_certificate_is_refused_with_the_reason(as2, certs,
                                                                        tmp_path):
    as2.choose(sign=False, encrypt=True)
    other = tmp_path / "other.pem"
    other.write_text(certs["other"][0])
    (tmp_path / "entity").write_bytes(b"Content-Type: application/edi-x12\r\n\r\n" + DATA)
    encrypted = openssl("cms", "-encrypt", "-in", str(tmp_path / "entity"), "-binary",
                        "-aes256", "-outform", "DER", "-recip", str(other),
                        "-keyopt", "rsa_padding_mode:oaep", "-keyopt", "rsa_oaep_md:sha512")
    answer = requests.post(as2.url, data=encrypted, timeout=30, headers={
        "AS2-From": "ACME", "AS2-To": "HUB", "AS2-Version": "1.2",
        "Message-ID": "<keywrap-other@acme.example>",
        "Content-Type": 'application/pkcs7-mime; smime-type=enveloped-data; name="smime.p7m"',
        "Disposition-Notification-To": "edi@acme.example"})
    assert answer.status_code == 200
    assert b"decryption-failed" in answer.content
    [message] = as2.messages()
    assert any("does not decrypt with our key" in line for line in as2.lines(message.id)), \
        as2.lines(message.id)


@pytest.fixture
def peer():
    """A loopback HTTP peer that keeps each body it is posted and answers 200."""
    bodies: list[bytes] = []

    @Request.application
    def app(request):
        bodies.append(request.get_data())
        return Response("ok")

    server = make_server("127.0.0.1", 0, app, threaded=True)
    serve_in_thread(server)
    yield f"http://127.0.0.1:{server.server_port}/as2", bodies
    server.shutdown()
    server.server_close()


@PATHS
@pytest.mark.parametrize("wrap", WRAPS)
def test_the_hub_wraps_the_key_as_the_profile_says_and_openssl_decrypts(as2, certs, peer,
                                                                        tmp_path, wrap):
    url, bodies = peer
    as2.choose(url=url, sign=True, encrypt=True, mdn_mode="none", key_encryption=wrap)
    message = as2.outbound()
    as2.drain()
    assert as2.delivery(message.id).state == "delivered", as2.delivery(message.id).last_result
    [body] = bodies
    printed = _printed(body, tmp_path)
    if WRAPS[wrap]:
        assert "rsaesOaep" in printed
        # SHA-1 is the parameters' default, which DER leaves out
        named = {d for d in ("sha256", "sha512") if d in printed.lower()}
        assert named == ({WRAPS[wrap][0]} - {"sha1"})
    else:
        assert "rsaEncryption" in printed and "rsaesOaep" not in printed
    files = _files(certs, tmp_path)
    (tmp_path / "body.der").write_bytes(body)
    clear = openssl("cms", "-decrypt", "-inform", "DER", "-in", str(tmp_path / "body.der"),
                    "-recip", str(files["acme.pem"]), "-inkey", str(files["acme.key"]),
                    "-binary")
    assert DATA in clear and b"multipart/signed" in clear
    # the signature inside verifies with openssl over the signed part, whose hash is
    # the MIC the hub keeps to compare with the receipt's
    signed = verified_by_openssl(clear, tmp_path)
    assert signed.endswith(b"\r\n\r\n" + DATA)
    row = as2.session.scalar(select(As2Outbound).where(As2Outbound.message_id == message.id))
    assert row.mic == base64.b64encode(hashlib.sha256(signed).digest()).decode()


def split_signed(entity: bytes) -> tuple[bytes, bytes]:
    """(the signed part, the signature's DER) of a multipart/signed entity."""
    boundary = re.search(rb'boundary="([^"]+)"', entity).group(1)
    mark = b"--" + boundary
    _preamble, rest = entity.split(mark + b"\r\n", 1)
    part, rest = rest.split(b"\r\n" + mark + b"\r\n", 1)
    signature, _end = rest.split(b"\r\n" + mark + b"--", 1)
    return part, base64.b64decode(signature.partition(b"\r\n\r\n")[2])


def verified_by_openssl(entity: bytes, tmp_path) -> bytes:
    """The signed part of a multipart/signed entity of the hub's, once ``openssl cms
    -verify`` verified its detached signature over the part's bytes with the hub's
    certificate (``hub.pem`` of :func:`_files`) and no other. (openssl's S/MIME reader
    rewrites the bare line feeds of a binary part, so the parts are split here.)"""
    signed, signature = split_signed(entity)
    (tmp_path / "part").write_bytes(signed)
    (tmp_path / "sig.der").write_bytes(signature)
    done = subprocess.run(["openssl", "cms", "-verify", "-binary", "-inform", "DER", "-in",
                           "sig.der", "-content", "part", "-nointern", "-certfile", "hub.pem",
                           "-noverify", "-out", "/dev/null"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0 and "Verification successful" in done.stderr, done.stderr
    return signed


def test_oaep_sha1_is_read_by_a_pyas2lib_partner(as2):
    as2.choose(sign=True, encrypt=True, mdn_mode="sync", key_encryption="rsaes_oaep_sha1")
    seen = len(as2.partner.received())
    message = as2.outbound()
    as2.drain()
    [got] = as2.partner.received()[seen:]
    assert got["status"] == "processed", got
    assert base64.b64decode(got["content"]) == DATA and got["encrypted"]
    assert as2.delivery(message.id).state == "delivered"


def test_key_encryption_is_a_profile_choice_checked_on_save(as2):
    assert profiles.profile_json(profiles.get_profile(as2.session, "partner", "acme"),
                                 utcnow())["key_encryption"] == "rsa_pkcs1v15"
    with pytest.raises(ServiceError) as refused:
        as2.choose(key_encryption="rsaes_oaep_md5")
    assert "key_encryption must be one of rsa_pkcs1v15, rsaes_oaep_sha1" in str(refused.value)
    as2.session.rollback()
    as2.choose(key_encryption="rsaes_oaep_sha512")
    assert profiles.by_party(as2.session, "acme").get("key_encryption") == "rsaes_oaep_sha512"

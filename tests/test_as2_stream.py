"""Large AS2 messages streamed through temporary files (plugins.as2.stream): the path
messages above the instances' ``stream_threshold`` take. The pyas2lib partner matrix
runs on it too (tests/test_as2.py, ``as2`` parametrized ``streamed``); here what is
particular to it: the default threshold choosing the path, what ``openssl cms`` reads
in what we send, refusals and limits as on the in-memory path, and no temp file left.
"""

# ruff: noqa: F401, F811  (test_as2's fixtures, imported, are the tests' parameters)

from __future__ import annotations

import base64
import hashlib
import io
import zlib
from pathlib import Path

import pytest
import requests
from asn1crypto import cms
from sqlalchemy import select

from b2bhub.models import PluginInstance
from b2bhub.services import config as svc
from plugins.as2 import stream
from plugins.as2.models import As2Outbound
from tests.test_as2 import (
    DATA,
    PATHS,
    STREAMED,
    as2,
    certs,
    openssl,
    openssl_client,
    partner,
    post,
    post_envelope,
)
from tests.test_as2_keywrap import _files, peer, verified_by_openssl

STREAM = pytest.mark.parametrize("as2", [STREAMED], indirect=True)


def _leftovers(as2) -> list[Path]:
    return sorted((Path(as2.hub.store.root) / "tmp").glob("as2-*"))


def _configure(as2, name: str, type_: str, config: dict) -> None:
    existing = as2.session.scalar(select(PluginInstance).where(PluginInstance.name == name))
    svc.save_instance(as2.session, as2.hub.registry, {"name": name, "type": type_,
                                                      "enabled": True, "config": config},
                      existing=existing)
    as2.session.commit()


def test_the_default_threshold_streams_large_messages_and_keeps_small_ones_in_memory(as2):
    """8 MiB by default: a message of 9 MiB each way takes the streaming path, one of
    a few bytes pyas2lib's; both arrive byte for byte."""
    assert stream.DEFAULT_THRESHOLD == 8 << 20
    _configure(as2, "as2in", "as2_receiver", {"max_size": 20 << 20})
    as2.choose(sign=True, encrypt=True, mdn_mode="sync", mdn_signed=True)
    large = (DATA * ((9 << 20) // len(DATA) + 1))[:9 << 20]
    for body, path in ((DATA, []), (large, ["receive"])):
        as2.streams.clear()
        result = as2.partner.send(as2.url, data=body, sign=True, encrypt=True,
                                  mdn_mode="sync", mdn_signed=True)
        assert result["mdn_status"] == "processed", result
        assert as2.streams == path
        message = as2.messages()[-1]
        assert as2.stages(message.id)["unpacked"] == body
        as2.streams.clear()
        seen = len(as2.partner.received())
        sent = as2.outbound(body)
        as2.drain()
        [got] = as2.partner.received()[seen:]
        assert got["status"] == "processed" and base64.b64decode(got["content"]) == body
        assert as2.streams == [name.replace("receive", "build") for name in path]
        delivery = as2.delivery(sent.id)
        assert delivery.state == "delivered" and "MIC verified" in delivery.last_result
    assert _leftovers(as2) == []


def _uncompressed(der: bytes) -> bytes:
    """The content of a CMS CompressedData (zlib), read by asn1crypto, not by us."""
    info = cms.ContentInfo.load(der)
    assert info["content_type"].native == "compressed_data"
    inner = info["content"]["encap_content_info"]["content"].native
    return zlib.decompress(inner)


@STREAM
@pytest.mark.parametrize("wrap,cipher", [("rsa_pkcs1v15", "aes_256_cbc"),
                                         ("rsaes_oaep_sha256", "aes_128_cbc"),
                                         ("rsaes_oaep_sha512", "tripledes_192_cbc")])
def test_what_we_stream_openssl_decrypts_and_verifies(as2, certs, peer, tmp_path, wrap,
                                                      cipher):
    """Signed, encrypted and compressed, built on files: ``openssl cms -decrypt``
    opens the envelope, ``openssl cms -verify`` checks the signature over the signed
    part, the MIC kept is the hash of exactly that part, and the compressed data in
    it holds the document."""
    url, bodies = peer
    as2.choose(url=url, sign=True, encrypt=True, compress=True, mdn_mode="none",
               key_encryption=wrap, digest_alg="sha384", encryption_alg=cipher)
    message = as2.outbound()
    as2.drain()
    assert as2.delivery(message.id).state == "delivered", as2.delivery(message.id).last_result
    assert as2.streams == ["build"]
    [body] = bodies
    files = _files(certs, tmp_path)
    (tmp_path / "body.der").write_bytes(body)
    printed = openssl("cms", "-cmsout", "-print", "-inform", "DER", "-in",
                      str(tmp_path / "body.der")).decode()
    assert {"aes_256_cbc": "aes-256-cbc", "aes_128_cbc": "aes-128-cbc",
            "tripledes_192_cbc": "des-ede3-cbc"}[cipher] in printed
    clear = openssl("cms", "-decrypt", "-inform", "DER", "-in", str(tmp_path / "body.der"),
                    "-recip", str(files["acme.pem"]), "-inkey", str(files["acme.key"]),
                    "-binary")
    signed = verified_by_openssl(clear, tmp_path)
    row = as2.session.scalar(select(As2Outbound).where(As2Outbound.message_id == message.id))
    assert row.digest_alg == "sha384"
    assert row.mic == base64.b64encode(hashlib.sha384(signed).digest()).decode()
    head, _sep, der = signed.partition(b"\r\n\r\n")
    assert b"compressed-data" in head
    document = _uncompressed(der)
    assert document.endswith(b"\r\n\r\n" + DATA)
    assert b"content-transfer-encoding: binary" in document.lower()
    # what the sent stage keeps is what went on the wire
    assert as2.stages(message.id)["sent"].endswith(b"\r\n\r\n" + body)
    assert _leftovers(as2) == []


@STREAM
def test_openssl_signing_bare_line_feeds_verifies_on_the_streamed_path(as2, certs, tmp_path):
    """``openssl cms -binary`` signs bare line feeds as they are, its S/MIME output
    posted as it is: verified over the bytes as received, the MIC over those."""
    as2.choose(sign=True, encrypt=True)
    content = DATA.replace(b"~", b"~\n")
    answer, files, entity = openssl_client(as2, certs, tmp_path, content, crlf=False)
    assert answer.status_code == 200 and b"processed/" not in answer.content, answer.content
    assert as2.streams == ["receive"]
    [message] = as2.messages()
    assert message.status != "refused" and as2.stages(message.id)["unpacked"] == content
    digest = base64.b64encode(openssl("dgst", "-sha256", "-binary", str(entity))).decode()
    assert f"Received-content-MIC: {digest}, sha256".lower() in answer.text.lower()


@STREAM
def test_a_tampered_streamed_message_is_refused_as_pyas2lib_refuses_it(as2, certs, tmp_path):
    as2.choose(sign=True, encrypt=False)
    (tmp_path / "entity").write_bytes(b"Content-Type: application/edi-x12\r\n\r\n" + DATA)
    files = _files(certs, tmp_path)
    signed = openssl("cms", "-sign", "-in", str(tmp_path / "entity"), "-signer",
                     str(files["acme.pem"]), "-inkey", str(files["acme.key"]), "-md",
                     "sha256", "-binary", "-outform", "SMIME")
    head, _sep, body = signed.replace(b"\r\n", b"\n").partition(b"\n\n")
    body = body.replace(b"ST*850", b"ST*851")  # the document changed after signing
    content_type = [line for line in head.decode().split("\n")
                    if line.lower().startswith("content-type:")][0].split(":", 1)[1]
    answer = post(as2, body, **{"Content-Type": content_type.strip()})
    assert answer.status_code == 200, answer.text
    assert b"authentication-failed" in answer.content
    [message] = as2.messages()
    assert message.status == "refused"
    [line] = as2.lines(message.id, "refused")
    assert "processed/Error: authentication-failed: Failed to verify message signature" \
        in line, line
    assert _leftovers(as2) == []


@STREAM
def test_a_chunked_body_over_max_size_is_refused_without_reading_on(as2):
    """No Content-Length: the body is spooled until it passes ``max_size``, then 413;
    the spool is removed."""
    def body():
        for _ in range(64):
            yield b"x" * (64 << 10)  # 4 MiB in all, the limit is 1 MiB
    answer = requests.post(as2.url, data=body(), timeout=30, headers={
        "AS2-From": "ACME", "AS2-To": "HUB", "Message-ID": "<big-1@acme.example>",
        "Content-Type": "application/edi-x12"})
    assert answer.status_code == 413, answer.text
    assert "over the size limit of 1048576 bytes" in answer.text
    [message] = as2.messages()
    assert message.status == "refused"
    assert _leftovers(as2) == []


@STREAM
@pytest.mark.parametrize("cipher", ["aes128", "des3"])
def test_an_envelope_in_indefinite_length_ber_is_read(as2, certs, tmp_path, cipher):
    """``openssl cms -encrypt -stream`` writes BER: indefinite lengths and the content
    as a constructed string of pieces; read as it comes."""
    as2.choose(sign=False, encrypt=True)
    files = _files(certs, tmp_path)
    content = DATA * 3000  # several pieces
    (tmp_path / "entity").write_bytes(b"Content-Type: application/edi-x12\r\n\r\n" + content)
    encrypted = openssl("cms", "-encrypt", "-stream", "-in", str(tmp_path / "entity"),
                        "-binary", f"-{cipher}", "-outform", "DER", str(files["hub.pem"]))
    assert encrypted[1] == 0x80  # indefinite length
    answer = post_envelope(as2, encrypted, "ber-1@acme.example")
    assert answer.status_code == 200 and b"processed/" not in answer.content, answer.content
    assert as2.streams == ["receive"]
    [message] = as2.messages()
    assert as2.stages(message.id)["unpacked"] == content


@PATHS
def test_compressed_outside_the_signature_is_read_on_both_paths(as2, certs, tmp_path):
    """Signed, then compressed, then encrypted (the order RFC 5402 also allows; pyas2lib
    compresses first): the signature verifies inside the compressed data, and the MIC is
    the signed entity's."""
    from pyas2lib.cms import compress_message
    as2.choose(sign=True, encrypt=True, compress=True)
    files = _files(certs, tmp_path)
    (tmp_path / "entity").write_bytes(b"Content-Type: application/edi-x12\r\n\r\n" + DATA)
    signed = openssl("cms", "-sign", "-in", str(tmp_path / "entity"), "-signer",
                     str(files["acme.pem"]), "-inkey", str(files["acme.key"]), "-md",
                     "sha256", "-binary", "-outform", "SMIME")
    signed = signed.replace(b"\n", b"\r\n").replace(b"\r\r\n", b"\r\n")
    compressed = (b'Content-Type: application/pkcs7-mime; smime-type=compressed-data; '
                  b'name="smime.p7z"\r\nContent-Transfer-Encoding: binary\r\n\r\n'
                  + compress_message(signed))
    (tmp_path / "compressed").write_bytes(compressed)
    encrypted = openssl("cms", "-encrypt", "-in", str(tmp_path / "compressed"), "-binary",
                        "-aes256", "-outform", "DER", str(files["hub.pem"]))
    answer = post_envelope(as2, encrypted, "zip-outside-1@acme.example")
    assert answer.status_code == 200 and b"processed/" not in answer.content, answer.content
    assert as2.streams == (["receive"] if as2.streamed else [])
    [message] = as2.messages()
    assert as2.stages(message.id)["unpacked"] == DATA
    digest = base64.b64encode(openssl("dgst", "-sha256", "-binary",
                                      str(tmp_path / "entity"))).decode()
    assert f"Received-content-MIC: {digest}, sha256".lower() in answer.text.lower()


@STREAM
@pytest.mark.parametrize("digest", ["sha1", "sha224", "sha256", "sha384", "sha512"])
def test_each_digest_both_ways_on_the_streamed_path(as2, digest):
    """The profile's digest for what we sign, and the partner's for what it signs
    (PKCS#1 v1.5 and PSS): verified by the pyas2lib partner, by us, and each MIC
    confirmed by the other side's signed receipt."""
    as2.choose(sign=True, encrypt=True, digest_alg=digest, mdn_mode="sync", mdn_signed=True)
    seen = len(as2.partner.received())
    message = as2.outbound()
    as2.drain()
    [got] = as2.partner.received()[seen:]
    assert got["status"] == "processed" and base64.b64decode(got["content"]) == DATA, got
    delivery = as2.delivery(message.id)
    assert delivery.state == "delivered" and "MIC verified" in delivery.last_result
    for sign_alg in ("rsassa_pkcs1v15", "rsassa_pss"):
        result = as2.partner.send(as2.url, sign=True, encrypt=True, mdn_mode="sync",
                                  mdn_signed=True, digest_alg=digest, sign_alg=sign_alg)
        assert result["mdn_status"] == "processed", (sign_alg, result)  # MIC confirmed
        assert as2.stages(as2.messages()[-1].id)["unpacked"] == DATA
    assert as2.streams == ["build", "receive", "receive"]


@STREAM
def test_a_pss_signature_with_its_parameters_verifies(as2, certs, tmp_path):
    """``openssl cms -sign -keyopt rsa_padding_mode:pss`` names the hash, MGF1 and salt
    length in the signature's parameters (pyas2lib writes none)."""
    as2.choose(sign=True, encrypt=True)
    files = _files(certs, tmp_path)
    (tmp_path / "entity").write_bytes(b"Content-Type: application/edi-x12\r\n\r\n" + DATA)
    signed = openssl("cms", "-sign", "-in", str(tmp_path / "entity"), "-signer",
                     str(files["acme.pem"]), "-inkey", str(files["acme.key"]), "-md",
                     "sha512", "-keyopt", "rsa_padding_mode:pss", "-binary", "-outform",
                     "SMIME")
    (tmp_path / "signed").write_bytes(signed.replace(b"\n", b"\r\n").replace(b"\r\r\n",
                                                                             b"\r\n"))
    encrypted = openssl("cms", "-encrypt", "-in", str(tmp_path / "signed"), "-binary",
                        "-aes256", "-outform", "DER", str(files["hub.pem"]))
    answer = post_envelope(as2, encrypted, "pss-1@acme.example")
    assert answer.status_code == 200 and b"processed/" not in answer.content, answer.content
    digest = base64.b64encode(openssl("dgst", "-sha512", "-binary",
                                      str(tmp_path / "entity"))).decode()
    assert f"Received-content-MIC: {digest}, sha512".lower() in answer.text.lower()


# --- the streaming code on its own, with pieces cut anywhere -----------------------------

def _keys(certs):
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    return {name: (load_pem_private_key(certs[name][1].encode(), None),
                   x509.load_pem_x509_certificate(certs[name][0].encode()))
            for name in ("hub", "acme")}


@pytest.mark.parametrize("layers", [(False, False, False), (True, False, False),
                                    (False, True, False), (False, False, True),
                                    (True, True, True)])
def test_chunk_boundaries_fall_anywhere(certs, tmp_path, monkeypatch, layers):
    """With 7-byte pieces every boundary of the framing falls inside a piece somewhere
    (DER headers, constructed strings, cipher blocks, zlib, base64, MIME boundaries):
    built here and read by pyas2lib, and built by pyas2lib and read here, the same."""
    from email.parser import BytesHeaderParser
    from email.policy import compat32

    from pyas2lib import Message, Organization
    from pyas2lib import Partner as PyPartner

    from plugins.as2 import lib
    sign, encrypt, compress = layers
    keys = _keys(certs)
    monkeypatch.setattr(stream, "CHUNK", 7)
    content = (DATA.replace(b"\r\n", b"\n") + bytes(range(256))) * 8
    hub_org = Organization(as2_name="HUB", sign_key=(certs["hub"][1] + certs["hub"][0]).encode(),
                           domain="hub.example")
    acme = (certs["acme"][1] + certs["acme"][0]).encode()
    acme_org = Organization(as2_name="ACME", sign_key=acme, decrypt_key=acme)
    choices = dict(sign=sign, encrypt=encrypt, compress=compress, mdn_mode="SYNC",
                   mdn_digest_alg="sha256", validate_certs=False)
    with stream.Workspace(tmp_path) as ws:
        to_acme = PyPartner(as2_name="ACME", encrypt_cert=certs["acme"][0].encode(), **choices)
        built = stream.build(ws, io.BytesIO(content), sender=hub_org, receiver=to_acme,
                             filename="x.bin", content_type="application/octet-stream",
                             subject="s", message_id=None, disposition_notification_to="a@b",
                             key_encryption="rsaes_oaep_sha1" if encrypt else None,
                             sign_with=keys["hub"], encrypt_for=keys["acme"][1])
        raw = lib.wire(built.headers.items(), built.body.read_bytes())
        theirs = Message()
        status, _exc, _mdn = theirs.parse(raw, find_org_cb=lambda _i: acme_org,
                                          find_partner_cb=lambda _i: PyPartner(
                                              as2_name="HUB", validate_certs=False,
                                              verify_cert=certs["hub"][0].encode()))
        assert status == "processed" and theirs.content == content
        assert (theirs.signed, theirs.encrypted, theirs.compressed) == layers
        assert theirs.mic == built.mic or not sign
        # and the other way: pyas2lib builds (its MIME tree flattened), the stream reads
        sent = Message(acme_org, PyPartner(as2_name="HUB", encrypt_cert=certs["hub"][0].encode(),
                                           **choices))
        sent.build(content, content_type="application/octet-stream")
        block = lib.header_block(sent.headers.items())
        path = ws.new("raw")
        path.write_bytes(block + b"\r\n" + sent.content)
        got = stream.receive(ws, path, len(block) + 2,
                             BytesHeaderParser(policy=compat32).parsebytes(block),
                             PyPartner(as2_name="ACME", sign=sign, encrypt=encrypt),
                             decrypt_keys=lambda: [keys["hub"]],
                             verify_certs=lambda: [keys["acme"][1]], receipt_alg=None,
                             content_head=lib.content_head)
        assert got.status == "processed", got.exc
        assert b"".join(got.payload.body_chunks()) == content
        assert (got.signed, got.encrypted, got.compressed) == layers
        assert got.mic == sent.mic or not sign


def test_a_base64_body_and_line_ends_are_decoded_across_pieces(tmp_path, monkeypatch):
    monkeypatch.setattr(stream, "CHUNK", 5)
    content = bytes(range(256)) * 3
    encoded = base64.encodebytes(content).replace(b"\n", b"\r\n")
    path = tmp_path / "entity"
    path.write_bytes(b"Content-Type: application/octet-stream\r\n"
                     b"Content-Transfer-Encoding: base64\r\n\r\n" + encoded)
    assert b"".join(stream.read_entity(path).body_chunks()) == content
    text = b"a\r\nb\nc\r\n\n\rd\n"
    expected = text.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    for cut in range(1, len(text)):
        pieces = [text[i:i + cut] for i in range(0, len(text), cut)]
        assert b"".join(stream._crlf(pieces)) == expected, cut

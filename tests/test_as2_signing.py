"""The hub's signatures (MDNs and sent messages): made by OpenSSL where it can, by
pyas2lib otherwise, and the same CMS structure either way."""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import subprocess

import pytest
from asn1crypto import cms
from oscrypto import asymmetric
from pyas2lib import Message, Organization, Partner
from pyas2lib.cms import verify_message
from pyas2lib.exceptions import IntegrityError

from plugins.as2 import lib
from tests.as2kit import make_pair

DATA = b"Content-Type: text/plain\r\n\r\nISA*00*~GS*PO~ST*850*0001~\r\n"


@pytest.fixture(scope="module")
def pair():
    return make_pair("signer.test")


@pytest.fixture
def org(pair):
    cert, key = pair
    return Organization(as2_name="HUB", sign_key=(key + cert).encode(),
                        decrypt_key=(key + cert).encode())


@pytest.mark.parametrize("sign_alg", ["rsassa_pkcs1v15", "rsassa_pss"])
@pytest.mark.parametrize("digest", ["md5", "sha1", "sha224", "sha256", "sha384", "sha512"])
def test_every_signature_verifies_and_openssl_makes_the_ones_it_can(
        org, pair, monkeypatch, digest, sign_alg):
    by_pyas2lib = []
    real = lib._real_sign_message
    monkeypatch.setattr(lib, "_real_sign_message",
                        lambda *a, **k: by_pyas2lib.append(a) or real(*a, **k))
    with lib.signing():
        signature = lib.sign_message(DATA, digest, org.sign_key, sign_alg)
    fast = sign_alg == "rsassa_pkcs1v15" and digest in ("sha224", "sha256", "sha384",
                                                        "sha512")
    assert bool(by_pyas2lib) is not fast
    assert verify_message(DATA, signature, asymmetric.load_certificate(pair[0].encode()))
    with pytest.raises(IntegrityError):
        verify_message(DATA + b" ", signature, asymmetric.load_certificate(pair[0].encode()))


def _outcome(check, *args) -> tuple[str, str]:
    try:
        return "verified", check(*args)
    except Exception as exc:  # the error a caller sees: its type and text
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("sign_alg", ["rsassa_pkcs1v15", "rsassa_pss"])
@pytest.mark.parametrize("digest", ["md5", "sha1", "sha256", "sha512"])
def test_the_receivers_signature_check_finds_what_pyas2lib_finds(org, pair, monkeypatch,
                                                                 digest, sign_alg):
    """The receiver's own check of a partner's signature (lib._verify_one, which reads
    only the message digest of the signed attributes) verifies what pyas2lib verifies
    and refuses what it refuses, with the same error: other data, another certificate,
    a signature altered, a message digest altered."""
    signature = lib.sign_message(DATA, digest, org.sign_key, sign_alg)  # pyas2lib's
    cert = asymmetric.load_certificate(pair[0].encode())
    other = asymmetric.load_certificate(make_pair("other.test")[0].encode())
    wanted = hashlib.new(digest, DATA).digest()
    altered_digest = signature.replace(wanted, bytes([wanted[0] ^ 1]) + wanted[1:])
    assert altered_digest != signature
    cases = [(DATA, signature, cert), (DATA + b" ", signature, cert),
             (DATA, signature, other), (DATA, signature, [other, cert]),
             (DATA, signature[:-1] + bytes([signature[-1] ^ 1]), cert),
             (DATA, altered_digest, cert)]
    by_pyas2lib = []
    real = lib._real_verify_message
    monkeypatch.setattr(lib, "_real_verify_message",
                        lambda *a: by_pyas2lib.append(a) or real(*a))
    found = []
    for data, sig, certs in cases:
        # pyas2lib's, certificate by certificate: the first that verifies, else the last
        theirs = [_outcome(verify_message, data, sig, one)
                  for one in (certs if isinstance(certs, list) else [certs])]
        with lib.signing():
            ours = _outcome(lib.verify_message, data, sig, certs)
        expected = next((o for o in theirs if o[0] == "verified"), theirs[-1])
        assert ours == expected, (data, certs)
        found.append(ours[0])
    assert by_pyas2lib == []  # every check above was the receiver's own
    assert found == ["verified", "IntegrityError", "IntegrityError", "verified",
                     "IntegrityError", "IntegrityError"]


def test_openssl_signs_with_the_attributes_and_certificate_pyas2lib_puts_there(org, pair):
    def shape(signature: bytes):
        signed = cms.ContentInfo.load(signature)["content"]
        [info] = signed["signer_infos"]
        return (signed["encap_content_info"]["content"].native,  # detached: none
                [c.chosen["tbs_certificate"]["serial_number"].native
                 for c in signed["certificates"]],
                info["digest_algorithm"]["algorithm"].native,
                sorted(a["type"].dotted for a in info["signed_attrs"]))

    with lib.signing():
        ours = shape(lib.sign_message(DATA, "sha256", org.sign_key))
    theirs = shape(lib._real_sign_message(DATA, "sha256", org.sign_key))
    assert ours == theirs
    assert ours[0] is None and len(ours[1]) == 1 and ours[2] == "sha256"
    assert set(ours[3]) >= {"1.2.840.113549.1.9.3", "1.2.840.113549.1.9.4",
                            "1.2.840.113549.1.9.5", "1.2.840.113549.1.9.15"}


def test_openssl_verifies_the_detached_signature_over_the_exact_bytes(org, pair, tmp_path):
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed on PATH for this check")
    with lib.signing():
        (tmp_path / "sig.der").write_bytes(lib.sign_message(DATA, "sha384", org.sign_key))
    (tmp_path / "data").write_bytes(DATA)
    (tmp_path / "cert.pem").write_text(pair[0])
    done = subprocess.run(
        ["openssl", "cms", "-verify", "-binary", "-inform", "DER", "-in", "sig.der",
         "-content", "data", "-CAfile", "cert.pem", "-purpose", "any", "-out", "/dev/null"],
        cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "Verification successful" in done.stderr


def test_a_key_openssl_cannot_take_is_signed_by_pyas2lib(org, monkeypatch):
    monkeypatch.setattr(lib, "load_der_private_key", lambda *_a: (_ for _ in ()).throw(
        ValueError("unsupported")))
    lib._signers.clear()
    by_pyas2lib = []
    real = lib._real_sign_message
    monkeypatch.setattr(lib, "_real_sign_message",
                        lambda *a, **k: by_pyas2lib.append(a) or real(*a, **k))
    with lib.signing():
        assert lib.sign_message(DATA, "sha256", org.sign_key)
    assert len(by_pyas2lib) == 1
    lib._signers.clear()


def test_pyas2lib_used_on_its_own_signs_as_it_always_did(org, monkeypatch):
    """Outside the hub's receiving and sending (a bench's bare pyas2lib, say), in the
    same process, signatures stay pyas2lib's."""
    by_pyas2lib = []
    real = lib._real_sign_message
    monkeypatch.setattr(lib, "_real_sign_message",
                        lambda *a, **k: by_pyas2lib.append(a) or real(*a, **k))
    lib.sign_message(DATA, "sha256", org.sign_key)
    assert len(by_pyas2lib) == 1


def _normalized(headers: dict, content: bytes) -> tuple[dict, bytes]:
    """An MDN with what differs between two builds of it (its boundaries, Message-ID,
    Date and the signature's bytes, which hold the signing time) replaced by names."""
    text = content.decode("ascii")
    for index, boundary in enumerate(re.findall(r'boundary="([^"]+)"', text
                                                + headers["Content-Type"])):
        text = text.replace(boundary, f"BOUNDARY{index}")
    text = re.sub(r"(base64\r\n\r\n)[A-Za-z0-9+/=\r\n]+?(\r\n--)", r"\1SIGNATURE\2", text)
    headers = {k: v for k, v in headers.items() if k not in ("Message-ID", "Date")}
    headers["Content-Type"] = re.sub(r'boundary="[^"]+"', 'boundary="B"',
                                     headers["Content-Type"])
    return headers, text.encode("ascii")


@pytest.mark.parametrize("mdn_digest", ["sha1", "sha256", "sha512", None])
@pytest.mark.parametrize("status", ["processed", "failed"])
def test_a_signed_mdn_is_laid_out_byte_for_byte_as_pyas2lib_renders_it(org, pair,
                                                                        mdn_digest, status):
    """The hub's MDN (put together as bytes where OpenSSL signs it: lib.Mdn) is what
    pyas2lib's own build of the same MDN renders, but for its boundaries, Message-ID,
    Date and signature; the partner verifies it (SHA-1 is signed by pyas2lib itself;
    None: an unsigned MDN, which pyas2lib renders)."""
    partner_cert, partner_key = make_pair("partner.test")
    sender = Organization(as2_name="ACME", sign_key=(partner_key + partner_cert).encode())
    hub = Partner(as2_name="HUB", verify_cert=pair[0].encode(), validate_certs=False,
                  sign=True, mdn_mode="SYNC", mdn_digest_alg=mdn_digest)
    outgoing = Message(sender, hub)
    outgoing.build(DATA, filename="po.edi")
    raw = lib.wire(outgoing.headers.items(), outgoing.content)
    them = Partner(as2_name="ACME", verify_cert=(partner_cert if status == "processed"
                                                 else make_pair("other")[0]).encode(),
                   validate_certs=False)
    with lib.parsing():
        got, _exc, mdn = Message().parse(raw, find_org_cb=lambda _i: org,
                                         find_partner_cb=lambda _i: them)
    assert got == ("processed" if status == "processed" else "processed/Error")
    assert (mdn._wire is not None) is (mdn_digest in ("sha256", "sha512"))
    # pyas2lib's own build (the email package's tree, rendered): outside lib.parsing()
    # with pyas2lib's debug log on, which the bytes path leaves to pyas2lib
    level = lib._as2.logger.level
    lib._as2.logger.setLevel(logging.DEBUG)
    try:
        with lib.parsing():
            again, _exc, theirs = Message().parse(raw, find_org_cb=lambda _i: org,
                                                  find_partner_cb=lambda _i: them)
    finally:
        lib._as2.logger.setLevel(level)
    assert again == got and theirs._wire is None
    ours = lib.mdn_content(mdn)
    assert _normalized(mdn.headers, ours) == _normalized(theirs.headers, theirs.content)
    assert ours.count(b"application/pkcs7-signature") == (mdn_digest is not None)
    assert mdn.headers_str == "".join(f"{k}: {v}\r\n" for k, v in mdn.headers.items()
                                      ).encode()
    # the partner reads it: signature (with the hub's certificate) and MIC verified
    partner_side = Partner(as2_name="HUB", verify_cert=pair[0].encode(),
                           validate_certs=False, mdn_digest_alg=mdn_digest)
    outgoing.receiver = partner_side
    status_read, detail = lib.Mdn().parse(lib.wire(mdn.headers.items(), ours),
                                          lambda _id, _to: outgoing)
    assert status_read == got, detail


def test_the_mdns_inner_boundary_is_in_none_of_its_texts(monkeypatch):
    """As the email generator sees to: a boundary found in a part is made again."""
    import email.generator
    made = iter(["processed", "===============42=="])
    monkeypatch.setattr(email.generator.Generator, "_make_boundary",
                        classmethod(lambda cls, text=None: next(made)))
    assert lib._boundary(["Disposition: automatic-action/MDN-sent-automatically; "
                          "processed"]) == "===============42=="

"""The hub's signatures (MDNs and sent messages): made by OpenSSL where it can, by
pyas2lib otherwise, and the same CMS structure either way."""

from __future__ import annotations

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


@pytest.mark.parametrize("mdn_digest", ["sha1", "sha256", "sha512", None])
def test_a_signed_mdn_is_laid_out_byte_for_byte_as_pyas2lib_renders_it(org, pair,
                                                                        mdn_digest):
    """The MDN body is put together from the bytes signed and the signature instead of
    rendering the MIME tree again: the same bytes as pyas2lib's ``Mdn.content`` (SHA-1
    is signed by pyas2lib itself; None: an unsigned MDN, which pyas2lib renders)."""
    partner_cert, partner_key = make_pair("partner.test")
    sender = Organization(as2_name="ACME", sign_key=(partner_key + partner_cert).encode())
    hub = Partner(as2_name="HUB", verify_cert=pair[0].encode(), validate_certs=False,
                  sign=True, mdn_mode="SYNC", mdn_digest_alg=mdn_digest)
    outgoing = Message(sender, hub)
    outgoing.build(DATA, filename="po.edi")
    raw = lib.wire(outgoing.headers.items(), outgoing.content)
    them = Partner(as2_name="ACME", verify_cert=partner_cert.encode(), validate_certs=False)
    with lib.parsing():
        status, _exc, mdn = Message().parse(raw, find_org_cb=lambda _i: org,
                                            find_partner_cb=lambda _i: them)
    assert status == "processed"
    assert lib.mdn_content(mdn) == mdn.content
    assert mdn.content.count(b"application/pkcs7-signature") == (mdn_digest is not None)

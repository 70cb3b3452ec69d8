"""pyas2lib objects built from b2bhub's AS2 profiles, and the wire form of messages."""

from __future__ import annotations

import base64
import binascii
import email
import email.generator
import hashlib
import ipaddress
import logging
import re
import socket
import threading
from contextlib import contextmanager
from email import encoders as _encoders
from email import policy
from email import utils as email_utils
from importlib import metadata
from urllib.parse import urlsplit

import pyas2lib.as2 as _as2
import pyas2lib.cms as _cms
import pyas2lib.utils as _utils
from asn1crypto import cms as _asn1_cms
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import Encoding, load_der_private_key, pkcs7
from oscrypto import asymmetric as _asymmetric
from pyas2lib import Mdn as _PyMdn
from pyas2lib import Message, Organization, Partner
from pyas2lib.exceptions import (
    AS2Exception,
    DecryptionError,
    InsufficientSecurityError,
    IntegrityError,
)

from b2bhub.plugin import PRODUCT as _product
from b2bhub.plugin import utcnow
from plugins.as2 import keywrap, profiles
from plugins.as2 import mime as _mime
from plugins.as2.profiles import As2Profile
from plugins.as2.stream import EDIINT_FEATURES

# --- certificates chosen by their validity window (profiles: "Certificate lifecycle") --
# The choice depends on the clock, so the pyas2lib objects kept with a profile are kept
# per choice: a rollover's new certificate is taken up on its day without any save.
# An organization's certificate offered by CEM signs only for the partners that accepted
# it (profiles.choose_certs, its ``gates``): the signing choice is per partner, and so is
# the Organization object, kept per choice (every partner shares one while none is gated).
# Warnings (a certificate used outside its window because the profile accepts it) are
# collected per thread for the caller to write as history lines (:func:`take_warnings`).
_warned = threading.local()


def _choose(profile: As2Profile, role: str, partner: str | None = None):
    """The profile's CertChoice for ``role`` now (our signing one for ``partner``, a
    party name), or the CertificateRefused."""
    try:
        return profiles.choose_certs(profile.certs, role, utcnow(),
                                     bool(profile.get("accept_expired_certificates")),
                                     profile.party, partner, profile.gates)
    except profiles.CertificateRefused as refused:
        return refused


def _ids(choice) -> tuple:
    return tuple(c.id for c in choice.use) if isinstance(choice, profiles.CertChoice) \
        else ("refused", str(choice))


def _note(*choices) -> None:
    for choice in choices:
        if isinstance(choice, profiles.CertChoice) and choice.warning:
            warnings = getattr(_warned, "lines", None)
            if warnings is not None and choice.warning not in warnings:
                warnings.append(choice.warning)


@contextmanager
def collecting_warnings():
    """Within the block, the certificate warnings of the profiles used on this thread
    are collected; :func:`take_warnings` returns them."""
    previous = getattr(_warned, "lines", None)
    _warned.lines = []
    try:
        yield _warned.lines
    finally:
        _warned.lines = previous


def refusal(profile: As2Profile, *roles: str, partner: str | None = None) -> str | None:
    """Why a profile's certificates cannot be used for ``roles`` now (with ``partner``),
    or None."""
    for role in roles:
        choice = _choose(profile, role, partner)
        if isinstance(choice, profiles.CertificateRefused):
            return str(choice)
    return None


def warnings_of(profile: As2Profile, *roles: str, partner: str | None = None) -> list[str]:
    """The warnings of using the profile's certificates for ``roles`` now (with
    ``partner``)."""
    return [c.warning for c in map(lambda r: _choose(profile, r, partner), roles)
            if isinstance(c, profiles.CertChoice) and c.warning]


class _Refused:
    """What stands for a key or certificate that is refused: the reason."""

    def __init__(self, reason: str):
        self.reason = reason
# --- the hub's identity on the wire (README "AS2 identity") ------------------------------
PRODUCT = _product  # the core's name on the wire (b2bhub/<version>)
#: the human-readable part of our MDNs, unless the organization's profile says otherwise
MDN_TEXT = ("The AS2 message was received by b2bhub and processed successfully. This is "
            "an automatic receipt; the technical details are in the following part.")
MDN_FAILED_TEXT = ("The AS2 message was received by b2bhub but could not be processed. "
                   "This is an automatic receipt; the reason is in the following part.")


def _is_poor(host: str | None) -> bool:
    """A name that says nothing about where a Message-ID came from."""
    if not host:
        return True
    host = host.strip(".").lower()
    if host in ("localhost", "localhost.localdomain", "localdomain", "") \
            or host.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True  # an address is not a domain


def default_domain(profile: As2Profile | None = None) -> str:
    """The domain of our Message-IDs: the organization's ``message_id_domain``; else the
    host name of its ``mdn_url``; else the host's fully qualified name; else its plain
    host name: the first of these that is not ``localhost`` or an address."""
    candidates = []
    if profile is not None:
        candidates.append(profile.settings.get("message_id_domain"))
        url = profile.settings.get("mdn_url")
        candidates.append(urlsplit(url).hostname if url else None)
    for value in candidates:
        if value and not _is_poor(value):
            return value
    for value in (socket.getfqdn(), socket.gethostname()):
        if not _is_poor(value):
            return value
    return "b2bhub.invalid"  # nothing better known: still not another host's name


def disposition_notification_to(profile: As2Profile) -> str:
    return profile.settings.get("disposition_notification_to") \
        or f"as2@{default_domain(profile)}"


def organization(profile: As2Profile, domain: str | None = None,
                 partner: str | None = None) -> Organization:
    """Our side toward ``partner`` (a party name; None: none in view), its key loaded
    once per profile version (loading a key costs more than parsing a small message);
    pyas2lib only reads these objects. Kept with the profile too, which the receiver's
    profile cache keeps, per certificate choice: partners with the same choice share
    one. Signs with the newest valid signing certificate for that partner (one offered
    by CEM once it accepted it), decrypts with every valid encryption one."""
    sign = _choose(profile, "signing", partner)
    decrypt = _choose(profile, "encryption")
    _note(sign, decrypt)
    key = ("organization", domain, _ids(sign), _ids(decrypt))
    org = profile.loaded.get(key)
    if org is None:
        org = profile.loaded[key] = _organization(profile, domain, sign, decrypt)
    return org


def _pem(cert) -> bytes | None:
    return (cert.key_pem + cert.pem).encode() if cert.key_pem else None


def _organization(profile: As2Profile, domain: str | None, sign, decrypt) -> Organization:
    domain = domain or default_domain(profile)
    key = (profile.party, profile.updated_at, profile.as2_id, profile.get("mdn_url"),
           domain, _ids(sign), _ids(decrypt))
    with _lock:
        org = _orgs.get(key)
    if org is None:
        signer = sign.use[0] if isinstance(sign, profiles.CertChoice) and sign.use else None
        if signer is None:  # refused: sending is refused before (sender), but an MDN
            # asked for signed is still signed, with the newest key (the refusal of the
            # message it answers names the certificate)
            signer = next((c for c in sorted(profile.certs, key=lambda c: c.id,
                                             reverse=True)
                           if c.serves("signing") and c.key_pem), None)
        if signer is None and not profile.certs and profile.key_pem:  # no lookup rows
            signer = profiles.CertInfo(0, profile.cert_pem, profile.key_pem, "both", "",
                                       None, None)
        org = HubOrganization(as2_name=profile.as2_id,
                              sign_key=_pem(signer) if signer else None, decrypt_key=None,
                              mdn_url=profile.get("mdn_url"), domain=domain,
                              mdn_confirm_text=profile.get("mdn_text") or MDN_TEXT)
        org.mdn_failed_text = profile.get("mdn_failed_text") or MDN_FAILED_TEXT
        if isinstance(decrypt, profiles.CertChoice):
            pems = [_pem(c) for c in decrypt.use if c.key_pem] or (
                [_pem(signer)] if signer and not profile.certs else [])
            org.decrypt_key = [Organization.load_key(pem, None) for pem in pems]
        else:
            org.decrypt_key = _Refused(str(decrypt))
        with _lock:
            if len(_orgs) > 256:
                _orgs.clear()
            _orgs[key] = org
    return org


_orgs: dict[tuple, Organization] = {}
_lock = threading.Lock()


class HubOrganization(Organization):
    """pyas2lib's Organization with the text of our negative MDNs."""

    mdn_failed_text: str = MDN_FAILED_TEXT


class LoadedPartner(Partner):
    """A pyas2lib Partner whose certificates are loaded on first use and kept (pyas2lib
    loads them again at every message it verifies or encrypts). Verification tries
    every valid signing certificate (a list, which :func:`verify_message` takes); a
    refused role raises pyas2lib's error with the reason."""

    def load_verify_cert(self):
        refused = self.__dict__.get("_verify_refused")
        if refused:
            raise IntegrityError(refused)
        cert = self.__dict__.get("_verify_loaded")
        if cert is None:
            pems = self.__dict__.get("_verify_pems") or [self.verify_cert]
            cert = self.__dict__["_verify_loaded"] = [
                _asymmetric.load_certificate(pem) for pem in pems]
        return cert

    def load_encrypt_cert(self):
        refused = self.__dict__.get("_encrypt_refused")
        if refused:
            raise InsufficientSecurityError(refused)
        cert = self.__dict__.get("_encrypt_loaded")
        if cert is None:
            cert = self.__dict__["_encrypt_loaded"] = super().load_encrypt_cert()
        return cert


def partner(profile: As2Profile, binary: bool | None = None) -> Partner:
    """The partner's side, kept with the profile (pyas2lib only reads it)."""
    verify, encrypt = _choose(profile, "signing"), _choose(profile, "encryption")
    _note(verify, encrypt)
    key = ("partner", binary, _ids(verify), _ids(encrypt))
    found = profile.loaded.get(key)
    if found is None:
        found = profile.loaded[key] = _partner(profile, binary, verify, encrypt)
    return found


def _partner(profile: As2Profile, binary: bool | None, verify, encrypt) -> Partner:
    def first(choice):
        if isinstance(choice, profiles.CertChoice) and choice.use:
            return choice.use[0].pem.encode()
        return profile.cert_pem.encode() if profile.cert_pem else None

    mode = profile.get("mdn_mode")
    made = LoadedPartner(
        as2_name=profile.as2_id, verify_cert=first(verify), encrypt_cert=first(encrypt),
        validate_certs=False,
        compress=profile.get("compress"), sign=profile.get("sign"),
        digest_alg=profile.get("digest_alg"), encrypt=profile.get("encrypt"),
        enc_alg=profile.get("encryption_alg"),
        mdn_mode={"sync": "SYNC", "async": "ASYNC"}.get(mode),
        mdn_digest_alg=profile.get("mdn_digest_alg") if profile.get("mdn_signed") else None,
        canonicalize_as_binary=(profile.get("canonicalize_as_binary")
                                if binary is None else binary),
        mdn_confirm_text=None)  # the organization's text (pyas2lib prefers the partner's)
    if isinstance(verify, profiles.CertChoice):
        made.__dict__["_verify_pems"] = [c.pem.encode() for c in verify.use]
    else:
        made.__dict__["_verify_refused"] = str(verify)
    if not isinstance(encrypt, profiles.CertChoice):
        made.__dict__["_encrypt_refused"] = str(encrypt)
    return made


_real_verify_message = _as2.verify_message


def verify_message(data_to_verify, signature, verify_cert):
    """:func:`pyas2lib.cms.verify_message` with each of several certificates (the list
    :class:`LoadedPartner` gives): the first that verifies wins."""
    if not isinstance(verify_cert, list):
        return _verify_one(data_to_verify, signature, verify_cert)
    error = IntegrityError("no certificate to verify the signature with")
    for cert in verify_cert:
        try:
            return _verify_one(data_to_verify, signature, cert)
        except IntegrityError as exc:
            error = exc
    raise error


_MESSAGE_DIGEST = "1.2.840.113549.1.9.4"  # the signed attribute (RFC 5652 11.2)


def _verify_one(data_to_verify, signature, verify_cert):
    """:func:`pyas2lib.cms.verify_message` with one certificate. On a thread within
    :func:`signing` (the receiver's parse) the same checks, in the same order and with
    the same errors, reading of the signed attributes only the message digest: pyas2lib
    decodes every attribute twice (signing time, S/MIME capabilities). Timed around the
    call in 300 parses of a 10 KB signed + encrypted message (one process): pyas2lib's
    0.49-0.55 ms of a 3.1-3.3 ms parse, this one 0.35 ms of 3.0 ms."""
    if not getattr(_signing, "on", False):
        return _real_verify_message(data_to_verify, signature, verify_cert)
    content = _asn1_cms.ContentInfo.load(signature)
    if content["content_type"].native != "signed_data":
        raise IntegrityError("Signed data not found in ASN.1 ")
    digest_alg = None
    for signer in content["content"]["signer_infos"]:
        digest_alg = _cms.normalize_digest_alg(signer["digest_algorithm"]["algorithm"].native)
        if digest_alg not in _cms.DIGEST_ALGORITHMS:
            raise Exception("Unsupported Digest Algorithm")
        sig_alg = signer["signature_algorithm"].signature_algo
        sig = signer["signature"].native
        signed_data = data_to_verify
        if signer["signed_attrs"]:
            digests = None  # the last such attribute, as pyas2lib reads them
            for attr in signer["signed_attrs"]:
                try:
                    if attr["type"].dotted == _MESSAGE_DIGEST:
                        digests = attr["values"].native
                except (ValueError, KeyError):
                    continue
            if digests is None:
                raise KeyError("message_digest")
            if b"".join(digests) != hashlib.new(digest_alg, data_to_verify).digest():
                raise IntegrityError(
                    "Failed to verify message signature: Message Digest does not match.")
            signed_data = signer["signed_attrs"].untag().dump()
        try:
            if sig_alg == "rsassa_pkcs1v15":
                _asymmetric.rsa_pkcs1v15_verify(verify_cert, sig, signed_data, digest_alg)
            elif sig_alg == "rsassa_pss":
                _asymmetric.rsa_pss_verify(verify_cert, sig, signed_data, digest_alg)
            else:
                raise AS2Exception("Unsupported Signature Algorithm")
        except Exception as e:
            raise IntegrityError(f"Failed to verify message signature: {e}") from e
    return digest_alg


# --- no debug copies while parsing ------------------------------------------------------
# pyas2lib 1.4.4 builds its debug log lines with f-strings that flatten the whole MIME tree
# (the encrypted body, the signed body, the MDN twice) whether debug logging is on or not:
# four serialisations per received message that nothing reads, as costly as the parse of
# a small message. Within Message.parse (and the Mdn.build it calls) every call of the
# module's own ``mime_to_bytes`` is such a debug line (MICs and signatures go through
# ``pyas2lib.utils.canonicalize``, which keeps its own reference). So while the receiver
# parses, on its thread only, that name returns b"" unless pyas2lib's debug log is on.
# Building messages (the sender) is never affected: there the same name does real work.
_PATCHED_VERSION = "1.4.4"
_real_mime_to_bytes = _as2.mime_to_bytes
_quiet = threading.local()


def _mime_to_bytes(msg, *args, **kwargs):
    if getattr(_quiet, "on", False):
        return b""
    return _real_mime_to_bytes(msg, *args, **kwargs)


if metadata.version("pyas2lib") == _PATCHED_VERSION:
    _as2.mime_to_bytes = _mime_to_bytes


# --- MIME rendered with each header parsed once ----------------------------------------
# pyas2lib renders MIME (the canonical form a signature and a MIC cover, on receipt and
# for our MDN; the messages the sender builds) with ``policy.HTTP``, which the email
# generator sets on every entity while it renders: each of its ``get()`` calls then
# parses the header anew through the header registry, some hundred parses of the same
# few headers per received message (a tenth of its receipt, in cProfile). Header
# objects are immutable and a pure function of (name, value), so a policy like HTTP
# that keeps the last ones made renders the very same bytes with each parsed once.
# Measured in one process, the hub's receive path (Flask test client, PostgreSQL) with
# this and with pyas2lib's own alternating message by message, 150 messages each, two
# runs, load 3.4-3.6: 1.14 and 1.51 ms less CPU per 10 KB message (8.01 against 9.15,
# 11.32 against 12.83 ms).
class _KeptHeaders(policy.EmailPolicy):
    """``policy.HTTP`` with the header objects it makes kept by (name, value)."""

    def header_fetch_parse(self, name, value):
        if hasattr(value, "name"):
            return value
        made = _kept_headers.get((name, value))
        if made is None:
            made = super().header_fetch_parse(name, value)
            if len(_kept_headers) > 1024:
                _kept_headers.clear()
            _kept_headers[(name, value)] = made
        return made


_kept_headers: dict[tuple[str, str], object] = {}
_HTTP = _KeptHeaders().clone(**{k: getattr(policy.HTTP, k) for k in (
    "linesep", "max_line_length", "utf8", "cte_type", "raise_on_defect", "mangle_from_",
    "refold_source", "message_factory")})
_pyas2_mime_to_bytes = _utils.mime_to_bytes


def mime_to_bytes(msg, email_policy=policy.HTTP):
    """pyas2lib's ``mime_to_bytes``, with :data:`_HTTP` for ``policy.HTTP`` (above) on a
    thread within :func:`parsing` or :func:`signing` (the hub's receipts and builds):
    pyas2lib used on its own is left as it is."""
    if email_policy is policy.HTTP and (getattr(_quiet, "parsing", False)
                                        or getattr(_signing, "on", False)):
        email_policy = _HTTP
    return _pyas2_mime_to_bytes(msg, email_policy)


if metadata.version("pyas2lib") == _PATCHED_VERSION:
    _utils.mime_to_bytes = mime_to_bytes  # what canonicalize() calls
    _real_mime_to_bytes = mime_to_bytes  # the builds' (and the debug lines', when on)


# --- signatures made by OpenSSL -------------------------------------------------------
# pyas2lib builds the CMS SignedData of a signature in pure Python (asn1crypto): 2.3 to
# 3 ms a signature here, the largest single part of answering a small message with a
# signed MDN. cryptography's PKCS#7 builder (OpenSSL) makes the same structure in 0.3 ms:
# a detached signature over exactly the bytes given (``Binary``: pyas2lib has
# canonicalised them already), with the signed attributes pyas2lib puts there (content
# type, signing time, message digest, S/MIME capabilities) and the signer's certificate.
# It is used for what it supports, RSA keys with PKCS#1 v1.5 and SHA-2 digests; anything
# else (SHA-1, MD5, PSS) is signed by pyas2lib as before. Both of pyas2lib's signers, the
# MDN's and the sent message's, look the function up by this module-level name; it signs
# through OpenSSL only on a thread within :func:`signing` (the receiver's parse and the
# sender's build), so pyas2lib used on its own in the same process is left as it is.
_real_sign_message = _as2.sign_message
_signing = threading.local()
_FAST_DIGESTS = {"sha224": hashes.SHA224, "sha256": hashes.SHA256, "sha384": hashes.SHA384,
                 "sha512": hashes.SHA512}
#: id of a pyas2lib sign key -> (that key, cryptography's key and certificate or None)
_signers: dict[int, tuple] = {}


def sign_message(data_to_sign, digest_alg, sign_key, sign_alg="rsassa_pkcs1v15",
                 use_signed_attributes=True):
    """:func:`pyas2lib.cms.sign_message`, through OpenSSL where it can (see above)."""
    digest = _FAST_DIGESTS.get(_cms.normalize_digest_alg(digest_alg))
    hub = getattr(_signing, "on", False)
    signer = _signer(sign_key) if digest and sign_alg == "rsassa_pkcs1v15" \
        and use_signed_attributes and hub else None
    if signer is None:
        signature = _real_sign_message(data_to_sign, digest_alg, sign_key, sign_alg,
                                       use_signed_attributes)
    else:
        key, cert = signer
        signature = (pkcs7.PKCS7SignatureBuilder().set_data(data_to_sign)
                     .add_signer(cert, key, digest())
                     .sign(Encoding.DER, [pkcs7.PKCS7Options.DetachedSignature,
                                          pkcs7.PKCS7Options.Binary]))
    if hub:
        _signing.made = (data_to_sign, signature)  # for mdn_content
    return signature


def _signer(sign_key):
    """cryptography's RSA key and certificate for pyas2lib's (oscrypto's) ``sign_key``,
    converted once per key object (None when it is not an RSA key)."""
    found = _signers.get(id(sign_key))
    if found is not None and found[0] is sign_key:
        return found[1]
    try:
        key = load_der_private_key(sign_key[0].asn1.dump(), None)
        signer = ((key, x509.load_der_x509_certificate(sign_key[1].asn1.dump()))
                  if isinstance(key, rsa.RSAPrivateKey) else None)
    except Exception:  # anything cryptography cannot take is pyas2lib's to sign
        signer = None
    with _lock:
        if len(_signers) > 256:
            _signers.clear()
        _signers[id(sign_key)] = (sign_key, signer)  # the key kept: its id stays its own
    return signer


if metadata.version("pyas2lib") == _PATCHED_VERSION:
    _as2.sign_message = sign_message


@contextmanager
def signing(key_encryption: str | None = None):
    """Around pyas2lib building what the hub signs: signatures through OpenSSL; the
    content key of what it encrypts wrapped with ``key_encryption`` (a profile's
    choice, see :mod:`.keywrap`)."""
    previous = getattr(_signing, "on", False), getattr(_signing, "wrap", None)
    _signing.on, _signing.wrap = True, keywrap.KEY_ENCRYPTIONS.get(key_encryption or "")
    try:
        yield
    finally:
        _signing.on, _signing.wrap = previous


# --- key wrapping through OpenSSL (:mod:`.keywrap`) -------------------------------------
# On a thread within :func:`signing` (the receiver's parse, the sender's build) pyas2lib's
# envelope functions, looked up by their module-level names, are these: decryption
# unwraps PKCS#1 v1.5 and RSAES-OAEP with SHA-1/2 and tries each of our keys; encryption
# wraps with RSAES-OAEP when the partner's profile asks for it. Elsewhere they are
# pyas2lib's own.
_real_decrypt_message = _as2.decrypt_message
_real_encrypt_message = _as2.encrypt_message


def decrypt_message(encrypted_data, decryption_key):
    """:func:`pyas2lib.cms.decrypt_message`; ``decryption_key`` is pyas2lib's (key,
    certificate) pair, or a list of them (:class:`LoadedOrganization`)."""
    if not getattr(_signing, "on", False):
        return _real_decrypt_message(encrypted_data, decryption_key)
    if isinstance(decryption_key, _Refused):
        raise DecryptionError(decryption_key.reason)
    pairs = decryption_key if isinstance(decryption_key, list) else [decryption_key]
    keys = [found for found in map(_signer, pairs) if found is not None]
    return keywrap.decrypt(encrypted_data, keys)


def encrypt_message(data_to_encrypt, enc_alg, encryption_cert, key_enc_alg="rsaes_pkcs1v15"):
    digest = getattr(_signing, "wrap", None) if getattr(_signing, "on", False) else None
    if digest is None:
        return _real_encrypt_message(data_to_encrypt, enc_alg, encryption_cert, key_enc_alg)
    cert = x509.load_der_x509_certificate(encryption_cert.asn1.dump())
    return keywrap.encrypt(data_to_encrypt, enc_alg, cert, digest)


if metadata.version("pyas2lib") == _PATCHED_VERSION:
    _as2.verify_message = verify_message
    _as2.decrypt_message = decrypt_message
    _as2.encrypt_message = encrypt_message


def mdn_content(mdn) -> bytes:
    """The body of an MDN (``Mdn.content``). A signed MDN pyas2lib built within
    :func:`parsing` on this thread is put together from the bytes signed and the
    signature made, as pyas2lib's own serialisation lays them out (the email package
    takes 1.3 to 1.9 ms here to render the MIME tree again, as costly as the signature
    was); any other MDN is pyas2lib's to render."""
    made, _signing.made = getattr(_signing, "made", None), None
    if getattr(mdn, "_wire", None) is not None:  # built as bytes (Mdn._build_signed)
        return mdn._wire[1]
    payload = mdn.payload
    if made is not None and payload is not None \
            and payload.get_content_type() == "multipart/signed":
        parts = payload.get_payload()
        signature = parts[1] if isinstance(parts, list) and len(parts) == 2 else None
        body = signature.get_payload() if signature is not None else None
        if isinstance(body, str) and base64.b64decode(body) == made[1]:
            return _multipart_signed(payload.get_boundary(), made[0],
                                     header_block(signature.items()), body)
    return mdn.content


def _multipart_signed(boundary: str, signed: bytes, head: bytes, signature: str) -> bytes:
    """The body of a multipart/signed MDN as pyas2lib's serialisation lays it out: the
    bytes signed, then the signature part (its header block ``head``, its base64 lines
    ``signature`` with CRLF line ends)."""
    dash = f"--{boundary}".encode("ascii")
    lines = signature.replace("\r\n", "\n").replace("\n", "\r\n").encode("ascii")
    return b"".join((dash, b"\r\n", signed, b"\r\n", dash, b"\r\n", head, b"\r\n", lines,
                     b"\r\n", dash, b"--\r\n"))


#: the signature part's headers, as pyas2lib sets them on a signed MDN
_SIGNATURE_HEAD = (b'Content-Type: application/pkcs7-signature; name="smime.p7s"; '
                   b'smime-type="signed-data"\r\n'
                   b'Content-Disposition: attachment; filename="smime.p7s"\r\n'
                   b"Content-Transfer-Encoding: base64\r\n")


@contextmanager
def parsing():
    """Around ``Message.parse`` (only): no debug copies of the MIME tree, unless
    pyas2lib's debug log is on; the MDN it builds signed through OpenSSL."""
    _signing.made = None
    _quiet.parsing = True  # signed multipart contents read right (_Entity)
    try:
        if getattr(_quiet, "on", False) or _as2.logger.isEnabledFor(logging.DEBUG):
            with signing():
                yield
            return
        _quiet.on = True
        try:
            with signing():
                yield
        finally:
            _quiet.on = False
    finally:
        _quiet.parsing = False


# --- pyas2lib's log records of a parse that is tried again ------------------------------
# A signature that fails with the partner's canonicalisation is tried once with the other
# (receiver step 4): clients such as ``openssl cms -binary`` sign the bytes as they are.
# pyas2lib logs the first failure at ERROR with a traceback, although the second check
# then verifies the message: noise that hides real errors on the Logs page. Within
# :func:`held_logs`, on its thread only, pyas2lib's records are held back, and released
# as they are, or at DEBUG when the caller says the failure was an expected fallback.
_held = threading.local()


class _HoldBack(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        records = getattr(_held, "records", None)
        if records is None:
            return True
        records.append(record)
        return False


_as2.logger.addFilter(_HoldBack())


class HeldLogs:
    """pyas2lib's records held back; ``expected = True`` releases them at DEBUG."""

    def __init__(self) -> None:
        self.records: list[logging.LogRecord] = []
        self.expected = False

    def release(self) -> None:
        for record in self.records:
            if self.expected:
                if not _as2.logger.isEnabledFor(logging.DEBUG):
                    continue
                record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            _as2.logger.handle(record)
        self.records = []


@contextmanager
def held_logs():
    """Hold back pyas2lib's log records of this thread while the block runs; released
    when it ends (at DEBUG if the block set ``expected`` on what it was given)."""
    held, previous = HeldLogs(), getattr(_held, "records", None)
    _held.records = held.records
    try:
        yield held
    finally:
        _held.records = previous
        held.release()


def header_block(headers) -> bytes:
    """HTTP headers as the MIME header block pyas2lib parses (one line each)."""
    return "".join(f"{k}: {v}\r\n" for k, v in headers).encode("utf-8", "replace")


def wire(headers, body: bytes) -> bytes:
    return header_block(headers) + b"\r\n" + body


def read_headers(block: bytes) -> dict[str, str]:
    """Lower-cased header names to values, from a header block (never raises)."""
    parsed = email.message_from_bytes(block + b"\r\n", policy=policy.compat32)
    return {k.lower(): str(v) for k, v in parsed.items()}


def headers_of(headers, block: bytes) -> dict[str, str]:
    """:func:`read_headers` of ``block``, the :func:`header_block` of the HTTP headers
    ``headers``, read from the pairs as they are when every one is plain ASCII on one
    line (what the email parser then gives: the value without leading blanks; the last
    of a repeated name), which costs a hundredth of parsing the block."""
    found = {}
    for name, value in headers:
        if not (_NAME.fullmatch(name) and _VALUE.fullmatch(value)):
            return read_headers(block)
        found[name.lower()] = value.lstrip(" \t")
    return found


#: a header name the email parser reads as one (printable ASCII but the colon), and a
#: value it reads as one line as it is (printable ASCII and tabs)
_NAME = re.compile(r"[\041-\071\073-\176]+")
_VALUE = re.compile(r"[\t\040-\176]*")


def message_id_of(value: str | None) -> str | None:
    return value.strip().lstrip("<").rstrip(">").strip() if value else None


# --- our words in MDNs, bytes as they are in messages ------------------------------------
# pyas2lib writes its own product into every MDN (the Reporting-UA of the signed report,
# the user-agent header) and encodes a business document as 7bit/8bit, which rewrites
# its line ends to CRLF when the message is flattened (an EDI file sent is then not the
# file given). Both go through ``encoders.encode_7or8bit`` of pyas2lib's module, called
# for the document before it is signed and for each part of an MDN before the MDN is
# signed: on a thread within :func:`building` the document gets Content-Transfer-Encoding
# binary (pyas2lib then signs, hashes and sends exactly its bytes), and within our
# :class:`Mdn` build the report names b2bhub. pyas2lib used on its own is unaffected.
_ident = threading.local()


class _HubEncoders:
    """``email.encoders`` as pyas2lib's module sees it (see above)."""

    encode_base64 = staticmethod(_encoders.encode_base64)
    encode_noop = staticmethod(_encoders.encode_noop)
    encode_quopri = staticmethod(_encoders.encode_quopri)

    @staticmethod
    def encode_7or8bit(msg):
        report = getattr(_ident, "report", None)
        if report is not None and msg.get_content_type() == "message/disposition-notification":
            text = msg.get_payload()
            lines = [line for line in text.split("\r\n")
                     if not line.lower().startswith("reporting-ua:")]
            msg.set_payload("\r\n".join([f"Reporting-UA: {report}", *lines]))
        elif getattr(_ident, "binary", False):
            msg["Content-Transfer-Encoding"] = "binary"
            _ident.document = msg
            return
        _encoders.encode_7or8bit(msg)


if metadata.version("pyas2lib") == _PATCHED_VERSION:
    _as2.encoders = _HubEncoders


@contextmanager
def building(key_encryption: str | None = None):
    """Around ``Message.build`` of what the hub sends: the document's bytes as they are,
    signatures through OpenSSL, the content key wrapped with ``key_encryption``."""
    previous = getattr(_ident, "binary", False)
    _ident.binary = True
    try:
        with signing(key_encryption):
            yield
    finally:
        _ident.binary = previous


def content_mic(entity, alg: str) -> bytes:
    """The MIC of an unsigned message (RFC 4130 7.3.1: over the MIME content, headers
    included): here its MIME headers (:func:`content_head`) and its body's bytes, so
    sender and receiver compute the same."""
    body = entity.get_payload(decode=True) or b""
    digest = hashlib.new(alg, content_head(entity) + b"\r\n" + body).digest()
    return binascii.b2a_base64(digest).strip()


def content_head(entity) -> bytes:
    """The headers an unsigned message's MIC covers: its ``Content-*`` ones (type,
    transfer encoding, disposition; not Content-Length nor the transport's AS2 and HTTP
    headers, which differ between the two ends), each name once, its first value."""
    seen: dict[str, str] = {}
    for k, v in entity.items():  # each once: a parsed message may repeat them
        name = k.lower()
        if name.startswith("content-") and name != "content-length" and name not in seen:
            seen[name] = f"{k}: {v}\r\n"
    return "".join(seen.values()).encode("utf-8")


# --- the keys and certificates of a streamed message (:mod:`.stream`) ------------------

def decrypt_keys(profile: As2Profile, partner: str | None = None) -> list:
    """Our (cryptography RSA key, certificate) pairs that decrypt now, or pyas2lib's
    DecryptionError with the reason they are refused (``partner``: the sender, whose
    Organization object is then the one its MDN is signed with)."""
    keys = organization(profile, partner=partner).decrypt_key
    if isinstance(keys, _Refused):
        raise DecryptionError(keys.reason)
    pairs = keys if isinstance(keys, list) else [keys]
    return [found for found in map(_signer, pairs) if found is not None]


def verify_certs(profile: As2Profile) -> list:
    """The partner's certificates (cryptography's) that verify its signatures now, or
    pyas2lib's IntegrityError with the reason they are refused."""
    certs = partner(profile).load_verify_cert()
    return [x509.load_der_x509_certificate(c.asn1.dump())
            for c in (certs if isinstance(certs, list) else [certs])]


def sign_pair(org: Organization):
    """Our (cryptography RSA key, certificate) that signs, or None (not an RSA key)."""
    return _signer(org.sign_key) if org.sign_key else None


def encrypt_cert(made: Partner):
    """The partner's encryption certificate (cryptography's), or pyas2lib's
    InsufficientSecurityError with the reason it is refused."""
    return x509.load_der_x509_certificate(made.load_encrypt_cert().asn1.dump())


def build_message(message, data: bytes, key_encryption: str | None = None, **kwargs) -> None:
    """``Message.build`` of what the hub sends (within :func:`building`); an unsigned
    message that asks for a signed receipt gets the MIC the receipt must confirm."""
    _ident.document = None
    with building(key_encryption):
        message.build(data, **kwargs)
    del message.payload["ediint-features"]  # pyas2lib's "CMS": no RFC 6017 feature
    message.payload["EDIINT-Features"] = EDIINT_FEATURES  # what we implement: CEM
    document, _ident.document = _ident.document, None
    alg = message.receiver.mdn_digest_alg
    if message.mic is None and alg and document is not None:
        message.mic, message.digest_alg = content_mic(document, alg), alg


def micalg(options: str | None) -> str | None:
    """The digest the partner asked for its signed receipt (the one pyas2lib signs with:
    the last listed), or None when no signed receipt was asked for."""
    if not options or "signed-receipt-micalg" not in options.lower():
        return None
    alg = options.split(";")[-1].split(",")[-1].strip().replace("-", "").lower()
    return alg if alg in hashlib.algorithms_available else None


class Mdn(_PyMdn):
    """pyas2lib's MDN in the hub's words: our texts (the organization's profile), our
    product as Reporting-UA and User-Agent, and a Received-Content-MIC whenever a signed
    receipt is asked for: over the signed content, or for an unsigned message over the
    received MIME content with its headers (RFC 4130 7.3.1)."""

    def build(self, message, status, detailed_status=None, confirmation_text=MDN_TEXT,
              failed_text=None):
        receiver = message.receiver
        if failed_text is None:
            failed_text = getattr(receiver, "mdn_failed_text", None) or MDN_FAILED_TEXT
        alg = micalg(message.headers.get("disposition-notification-options")
                      if message.headers else None)
        if message.mic is None and alg and status == "processed" \
                and message.payload is not None:
            message.mic, message.digest_alg = content_mic(message.payload, alg), alg
        domain = getattr(receiver, "domain", None) or default_domain()
        if self._build_signed(message, status, detailed_status, confirmation_text,
                              failed_text, f"{domain}; {PRODUCT}"):
            return
        previous = getattr(_ident, "report", None)
        _ident.report = f"{domain}; {PRODUCT}"
        try:
            super().build(message, status, detailed_status, confirmation_text, failed_text)
        finally:
            _ident.report = previous
        if self.payload is not None:
            self.payload.replace_header("user-agent", PRODUCT)
            del self.payload["ediint-features"]  # we implement no RFC 6017 feature

    # --- the signed MDN as bytes ---------------------------------------------------------
    # pyas2lib builds a signed MDN as a tree of email.message objects, renders the report
    # with the email generator to sign it (which parses every header it sets again), and
    # renders the whole tree once more for its body: 2.2 of the 6.8 ms of a 10 KB
    # message's parse under cProfile, ~1 ms of CPU a message without it. The layout is
    # fixed (RFC 3798 and 4130), so on the receiver's thread (within :func:`parsing`,
    # pyas2lib's debug log off) a signed MDN that OpenSSL signs (RSA PKCS#1 v1.5, SHA-2)
    # with ASCII texts is put together here byte for byte as pyas2lib lays it out:
    # tests/test_as2_signing.py builds both and compares them. Anything else is
    # pyas2lib's to build, as before.

    _wire: tuple[dict[str, str], bytes] | None = None

    def _build_signed(self, message, status, detailed_status, confirmation_text,
                      failed_text, reporting_ua: str) -> bool:
        receiver, sender, headers = message.receiver, message.sender, message.headers
        options = headers.get("disposition-notification-options") if headers else None
        if not (getattr(_quiet, "on", False) and getattr(_signing, "on", False) and options
                and receiver is not None and receiver.sign_key):
            return False
        digest_alg = options.split(";")[-1].split(",")[-1].strip().replace("-", "")
        sign_alg = getattr(sender, "sign_alg", None) or "rsassa_pkcs1v15"
        if (_FAST_DIGESTS.get(_cms.normalize_digest_alg(digest_alg)) is None
                or sign_alg != "rsassa_pkcs1v15" or _signer(receiver.sign_key) is None):
            return False
        if getattr(receiver, "mdn_confirm_text", None):
            confirmation_text = receiver.mdn_confirm_text
        if getattr(sender, "mdn_confirm_text", None):
            confirmation_text = sender.mdn_confirm_text
        if status != "processed":
            confirmation_text = failed_text
        to, original = headers.get("as2-to"), message.message_id
        report = [f"Reporting-UA: {reporting_ua}", f"Original-Recipient: rfc822; {to}",
                  f"Final-Recipient: rfc822; {to}", f"Original-Message-ID: <{original}>",
                  "Disposition: automatic-action/MDN-sent-automatically; " + status
                  + (f": {detailed_status}" if detailed_status else "")]
        if message.mic:
            report.append(f"Received-content-MIC: {message.mic.decode()}, "
                          f"{message.digest_alg}")
        texts = [str(confirmation_text), *report]
        if not all(text.isascii() and "\r" not in text and "\n" not in text
                   for text in texts):
            return False  # the email package's encodings and line ends: pyas2lib's
        inner, outer = _boundary(texts), _as2.make_mime_boundary()
        signed = "\r\n".join((
            f'Content-Type: multipart/report; report-type="disposition-notification"; '
            f'boundary="{inner}"', "MIME-Version: 1.0", "", f"--{inner}",
            "Content-Type: text/plain", "Content-Transfer-Encoding: 7bit", "",
            confirmation_text, "", f"--{inner}",
            "Content-Type: message/disposition-notification",
            "Content-Transfer-Encoding: 7bit", "", *report, "", f"--{inner}--", "",
        )).encode("ascii")
        signature = sign_message(signed, digest_alg, receiver.sign_key, sign_alg)
        _signing.made = None  # mdn_content reads _wire
        content = _multipart_signed(outer, signed, _SIGNATURE_HEAD,
                                    base64.encodebytes(signature).decode("ascii"))
        domain = receiver.domain if receiver else None
        self.message_id = email_utils.make_msgid(domain=domain).lstrip("<").rstrip(">")
        self.orig_message_id = original
        self.digest_alg = digest_alg
        self._wire = ({
            "Content-Type": 'multipart/signed; protocol="application/pkcs7-signature"; '
                            f'micalg="{digest_alg}"; boundary="{outer}"',
            "AS2-Version": _as2.AS2_VERSION,
            "Message-ID": f"<{self.message_id}>",
            "AS2-From": _as2.quote_as2name(to),
            "AS2-To": _as2.quote_as2name(headers.get("as2-from")),
            "Date": email_utils.formatdate(localtime=True),
            "user-agent": PRODUCT,
        }, content)
        return True

    @property
    def content(self):
        return self._wire[1] if self._wire is not None else _PyMdn.content.fget(self)

    @property
    def headers(self):
        return dict(self._wire[0]) if self._wire is not None else _PyMdn.headers.fget(self)

    @property
    def headers_str(self):
        if self._wire is None:
            return _PyMdn.headers_str.fget(self)
        return header_block(self._wire[0].items())


def _boundary(texts: list[str]) -> str:
    """A boundary as the email generator makes one for a multipart that has none, and,
    as it sees to, in none of the parts' ``texts``."""
    while True:
        boundary = email.generator.Generator._make_boundary()
        if not any(boundary in text for text in texts):
            return boundary


if metadata.version("pyas2lib") == _PATCHED_VERSION:
    _as2.Mdn = Mdn  # the MDN Message.parse builds


__all__ = ["Mdn", "Message", "Organization", "Partner", "header_block", "message_id_of",
           "organization", "partner", "read_headers", "wire"]


def unquote(value: str | None) -> str | None:
    """An AS2 name as sent (quoted when it holds spaces), or None."""
    if value is None:
        return None
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return value or None


# --- what our check of a partner's MDN signature found ----------------------------------
# pyas2lib reports a signature that fails as "failed/Failure" with the error's text, like
# any MDN it could not parse: within :func:`mdn_verifying`, on its thread, the outcome of
# the last signature check is kept, so a failed signature is told apart from a partner's
# negative disposition (mdn_in.judge).
_verify_checked = _as2.verify_message  # the several-certificates one above, when installed
_verifying = threading.local()


class SignatureCheck:
    def __init__(self) -> None:
        self.error: Exception | None = None
        self.checked = False


def _verify_message(*args, **kwargs):
    check = getattr(_verifying, "check", None)
    try:
        result = _verify_checked(*args, **kwargs)
    except Exception as exc:
        if check is not None:
            check.checked, check.error = True, exc
        raise
    if check is not None:
        check.checked, check.error = True, None
    return result


_as2.verify_message = _verify_message


class _Entity(email.message.Message):
    """The entities pyas2lib parses: a ``multipart/signed`` walks only itself and its
    own two parts. pyas2lib takes the last part of the walk that is not the signature
    as the signed content: of a deep walk, a multipart content's last inner part (a
    CEM request's certificate, :mod:`.cem`), whose MIC then never matches."""

    def walk(self):
        if self.get_content_type() != "multipart/signed" or not self.is_multipart():
            yield from super().walk()
            return
        yield self
        yield from self.get_payload()


def _parse_mime(data, *args, **kwargs):
    """pyas2lib's parser: of :class:`_Entity` within :func:`parsing` (a message's parse;
    an MDN's parse walks its multipart/signed deep to find the report), read by
    :func:`.mime.parse` where the entity's shape allows."""
    if getattr(_quiet, "parsing", False):
        if not args and not kwargs and (entity := _mime.parse(data, _Entity)) is not None:
            return entity
        kwargs.setdefault("_class", _Entity)
    return email.message_from_bytes(data, *args, **kwargs)


_as2.parse_mime = _parse_mime


@contextmanager
def mdn_verifying():
    previous, check = getattr(_verifying, "check", None), SignatureCheck()
    _verifying.check = check
    try:
        yield check
    finally:
        _verifying.check = previous


def organization_stub(as2_id: str | None, profile: As2Profile | None):
    """Our side of a negative MDN for a message pyas2lib could not read: its name and
    domain, no key (such an MDN is not signed)."""
    return HubOrganization(as2_name=as2_id or "unknown", domain=default_domain(profile))


def email_message():
    from email.message import Message as EmailMessage
    return EmailMessage()

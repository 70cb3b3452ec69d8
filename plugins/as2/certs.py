"""Certificates and private keys as uploaded (PEM or PKCS#12), read with ``cryptography``.

An uploaded key pair is kept as an unencrypted PKCS#8 PEM in the ``certificates`` table:
the password it came with is used once to open it and never stored or shown. Why the
database and not the data directory: every process that needs the key (the web process
signing a synchronous MDN, the workers signing messages and asynchronous MDNs) already
reads the database, which is the single thing to back up and secure; a key file in one
host's data directory would be missing on the next worker host. The API never returns a
private key.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import UTC, datetime

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from b2bhub.plugin import N_


class CertificateError(ValueError):
    """An upload that is not a readable certificate or key; ``args[0]`` says why, a text
    of ours (:func:`N_`): English for the API, the reader's language on a page."""


@dataclass(frozen=True)
class KeyPair:
    pem: str  # the certificate
    private_key_pem: str | None
    subject: str
    issuer: str
    not_before: datetime
    not_after: datetime


def _naive(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(tzinfo=None)


def _describe(cert: x509.Certificate, key_pem: str | None) -> KeyPair:
    return KeyPair(
        pem=cert.public_bytes(serialization.Encoding.PEM).decode(),
        private_key_pem=key_pem, subject=cert.subject.rfc4514_string(),
        issuer=cert.issuer.rfc4514_string(),
        not_before=_naive(cert.not_valid_before_utc), not_after=_naive(cert.not_valid_after_utc))


def _key_pem(key) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _password(password: str | None) -> bytes | None:
    return password.encode() if password else None


def upload_from_files(cert_file: bytes, key_file: bytes | None = None,
                      password: str | None = None) -> dict:
    """The :func:`read_upload` shape of files as a browser uploads them: a PEM (the
    certificate, maybe with its key), a DER certificate, or a PKCS#12 (``.p12``/``.pfx``);
    ``key_file`` a separate PEM key. Raises CertificateError for a file that is none of
    these, so the user learns it is not a certificate rather than a wrong password."""
    if b"-----BEGIN" in cert_file:
        upload: dict = {"pem": cert_file.decode("ascii", "replace")}
    elif cert_file[:1] == b"\x30":  # DER: an ASN.1 SEQUENCE, a certificate or a PKCS#12
        try:
            cert = x509.load_der_x509_certificate(cert_file)
        except ValueError:
            upload = {"pkcs12": base64.b64encode(cert_file).decode()}
        else:
            upload = {"pem": cert.public_bytes(serialization.Encoding.PEM).decode()}
    else:
        raise CertificateError(N_("not a certificate: expected a PEM or DER certificate or "
                                  "a PKCS#12 file (.p12, .pfx)"))
    if key_file:
        upload["private_key_pem"] = key_file.decode("ascii", "replace")
    if password:
        upload["password"] = password
    return upload


def read_upload(upload: dict, need_key: bool) -> KeyPair:
    """Read ``{"pem": ..., "private_key_pem": ..., "password": ...}`` or
    ``{"pkcs12": <base64>, "password": ...}``; a PEM may hold certificate and key together.
    ``need_key``: our own certificate must come with its private key."""
    if not isinstance(upload, dict):
        raise CertificateError(N_("a certificate is an object with 'pem' or 'pkcs12'"))
    password = upload.get("password")
    if password is not None and not isinstance(password, str):
        raise CertificateError(N_("the certificate's password must be text"))
    for field in ("pem", "pkcs12", "private_key_pem"):
        if upload.get(field) is not None and not isinstance(upload[field], str):
            raise CertificateError(N_("the certificate's %(field)s must be text", field=field))
    if upload.get("pkcs12"):
        try:
            data = base64.b64decode(upload["pkcs12"], validate=True)
            key, cert, _extra = pkcs12.load_key_and_certificates(data, _password(password))
        except (ValueError, TypeError) as exc:
            raise CertificateError(N_("PKCS#12 could not be opened (wrong password or not "
                                      "PKCS#12): %(why)s", why=str(exc))) from None
        if cert is None:
            raise CertificateError(N_("the PKCS#12 holds no certificate"))
        pair = _describe(cert, _key_pem(key) if key is not None else None)
    elif upload.get("pem"):
        pem = str(upload["pem"]).encode()
        try:
            cert = x509.load_pem_x509_certificate(pem)
        except ValueError as exc:
            raise CertificateError(N_("not a PEM certificate: %(why)s", why=str(exc))) from None
        key_text = upload.get("private_key_pem") or (
            pem if b"PRIVATE KEY-----" in pem else None)
        key_pem = None
        if key_text:
            try:
                key = serialization.load_pem_private_key(
                    key_text if isinstance(key_text, bytes) else key_text.encode(),
                    _password(password))
            except (ValueError, TypeError) as exc:
                raise CertificateError(N_("the private key could not be read (wrong "
                                          "password or not a PEM key): %(why)s",
                                          why=str(exc))) from None
            if key.public_key().public_numbers() != cert.public_key().public_numbers():
                raise CertificateError(N_("the private key does not belong to the certificate"))
            key_pem = _key_pem(key)
        pair = _describe(cert, key_pem)
    else:
        raise CertificateError(N_("a certificate needs 'pem' or 'pkcs12'"))
    if need_key and pair.private_key_pem is None:
        raise CertificateError(N_("our own certificate must come with its private key"))
    return pair

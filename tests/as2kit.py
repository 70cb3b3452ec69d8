"""Test certificates (made once per session with ``cryptography``) and AS2 set-up."""

from __future__ import annotations

import datetime as dt

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def make_pair(common_name: str, days: int = 365) -> tuple[str, str]:
    """(certificate PEM, private key PEM) of a self-signed RSA certificate."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM).decode(),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()).decode())


def _pem(cert, key) -> tuple[str, str]:
    return (cert.public_bytes(serialization.Encoding.PEM).decode(),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()).decode())


def make_ca(common_name: str) -> tuple[str, str]:
    """(certificate PEM, key PEM) of a CA that issues TLS certificates (make_issued)."""
    return make_pair(common_name, days=3650)


def make_issued(ca: tuple[str, str], common_name: str, server: bool = True,
                start_days: int = -1, end_days: int = 365) -> tuple[str, str]:
    """(certificate PEM, key PEM) issued by ``ca``: a server certificate for localhost
    and 127.0.0.1, or a client one; valid from ``start_days`` to ``end_days`` from now
    (both negative: expired)."""
    ca_cert = x509.load_pem_x509_certificate(ca[0].encode())
    ca_key = serialization.load_pem_private_key(ca[1].encode(), None)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
               .issuer_name(ca_cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now + dt.timedelta(days=start_days))
               .not_valid_after(now + dt.timedelta(days=end_days))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage(
                   [ExtendedKeyUsageOID.SERVER_AUTH if server
                    else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    if server:
        import ipaddress
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return _pem(builder.sign(ca_key, hashes.SHA256()), key)

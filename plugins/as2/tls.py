"""Outbound TLS per partner (docs/as2.md "TLS"): the CA bundle that verifies the
partner's server certificate and our client certificate for mutual TLS, both from the
partner's AS2 profile, used for every POST to the partner (messages, asynchronous MDNs
we owe it, the connection test).

``tls_ca_bundle`` (PEM text, one or more certificates) is trusted in addition to the
system's store, or instead of it when ``tls_system_trust`` is off. The client certificate
is a certificate of the profile with the role ``tls_client`` and its private key (kept
like the profile's other keys, never shown again). Python's ``ssl`` loads a key only from
a file: it is written to a private temporary file, loaded, and the file removed at once;
the context built is kept per profile version.

A certificate of the bundle is a trust anchor whether or not it is self-signed: the
context verifies with OpenSSL's partial-chain flag (``ssl.VERIFY_X509_PARTIAL_CHAIN``),
so a bundle holding only the partner's server certificate, issued by a CA we do not
hold (as a CEM request for TLS brings it, :mod:`.cem`), verifies that server; without
the flag OpenSSL would insist on reaching a self-signed root.
"""

from __future__ import annotations

import os
import ssl
import tempfile
import threading
from datetime import UTC, datetime

import requests
from cryptography import x509
from requests.adapters import HTTPAdapter

from b2bhub.plugin import N_

#: the role of a profile's certificate that is our TLS client certificate
TLS_CLIENT = "tls_client"
#: the largest CA bundle taken, in characters
MAX_BUNDLE = 512 * 1024


def bundle_problem(value) -> str | None:
    """Why ``value`` is not a CA bundle (PEM certificates), or None (None is no bundle)."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_BUNDLE:
        return N_("must be PEM text (%(most)s KB at most) or null", most=MAX_BUNDLE // 1024)
    try:
        certs = x509.load_pem_x509_certificates(value.encode("ascii", "replace"))
    except ValueError as exc:
        return N_("must hold PEM certificates (%(why)s)", why=str(exc))
    return None if certs else N_("must hold at least one PEM certificate")


def bundle_subjects(value: str | None) -> list[str]:
    """The subjects of a CA bundle's certificates, as the profile page lists them."""
    if not value:
        return []
    return [c.subject.rfc4514_string()
            for c in x509.load_pem_x509_certificates(value.encode("ascii", "replace"))]


def context_for(profile) -> ssl.SSLContext:
    """The client context of a partner's profile (its CA bundle, trust in the system
    store, its client certificate), built once per profile version."""
    client = getattr(profile, "tls_client", None)
    key = (profile.party, profile.updated_at, profile.get("tls_ca_bundle"),
           bool(profile.get("tls_system_trust")), client.id if client else None)
    with _lock:
        found = _contexts.get(key)
    if found is None:
        found = _build(profile.get("tls_ca_bundle"), bool(profile.get("tls_system_trust")),
                       client)
        with _lock:
            if len(_contexts) > 256:
                _contexts.clear()
            _contexts[key] = found
    return found


_contexts: dict[tuple, ssl.SSLContext] = {}
_lock = threading.Lock()


def _build(bundle: str | None, system: bool, client) -> ssl.SSLContext:
    context = ssl.create_default_context() if system else ssl.SSLContext(
        ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # a trusted certificate that is not self-signed (a partner's CA-issued server
    # certificate in the bundle) ends the chain: see the module's docstring
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    if bundle:
        context.load_verify_locations(cadata=bundle)
    if client is not None and client.key_pem:
        with tempfile.TemporaryDirectory(prefix="b2bhub-tls-") as folder:
            path = os.path.join(folder, "client.pem")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(client.key_pem + client.pem)
            context.load_cert_chain(path)
    return context


class _ContextAdapter(HTTPAdapter):
    """requests' adapter with our SSLContext: the verification it does is the
    context's (requests would otherwise add its own CA bundle to it)."""

    def __init__(self, context: ssl.SSLContext):
        self._context = context
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        kwargs["ssl_context"] = self._context
        return super().init_poolmanager(*args, **kwargs)

    def cert_verify(self, conn, url, verify, cert):
        conn.cert_reqs = "CERT_REQUIRED"  # the context holds the trust; nothing to add


def post(profile, url: str, **kwargs) -> requests.Response:
    """``requests.post`` to a partner with its profile's TLS context (for https://)."""
    with requests.Session() as session:
        if url.lower().startswith("https://"):
            session.mount("https://", _ContextAdapter(context_for(profile)))
        return session.post(url, **kwargs)


# --- what a TLS failure means, in words ---------------------------------------------

_REFUSED_CLIENT = ("CERTIFICATE_REQUIRED", "HANDSHAKE_FAILURE", "BAD_CERTIFICATE",
                   "UNKNOWN_CA", "CERTIFICATE_UNKNOWN", "ACCESS_DENIED",
                   "UNSUPPORTED_CERTIFICATE")


def ssl_error_of(exc: BaseException) -> ssl.SSLError | None:
    """The ssl error inside a requests/urllib3 exception chain, if any."""
    seen = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, ssl.SSLError):
            return current
        stack.extend([current.__cause__, current.__context__,
                      *(a for a in getattr(current, "args", ()) if isinstance(a, BaseException)),
                      getattr(current, "reason", None)])
    return None


def explain(exc: BaseException, profile=None) -> str:
    """A TLS failure in words: the server's certificate not trusted, expired or for
    another name; our client certificate missing or refused."""
    error = ssl_error_of(exc) or exc
    reason = (getattr(error, "reason", None) or "").upper()
    client = getattr(profile, "tls_client", None) if profile is not None else None
    if isinstance(error, ssl.SSLCertVerificationError):
        text = getattr(error, "verify_message", "") or str(error)
        code = getattr(error, "verify_code", None)
        if code == 10:
            return f"the partner's server certificate has expired ({text})"
        if code == 9:
            return f"the partner's server certificate is not valid yet ({text})"
        if code in (18, 19, 20, 21):
            return (f"the partner's server certificate is not trusted ({text}); add its "
                    "CA to the profile's TLS CA bundle")
        if code == 62:
            return f"the partner's server certificate is for another host name ({text})"
        return f"the partner's server certificate failed verification ({text})"
    ours = (f"our client certificate {client.subject}" if client is not None
            else "no client certificate (the profile has none)")
    if any(word in reason for word in _REFUSED_CLIENT):
        return (f"the partner's server refused the TLS handshake ({reason.lower()}): it "
                f"wants a client certificate it trusts; we sent {ours}")
    if isinstance(error, ssl.SSLEOFError) or "UNEXPECTED_EOF" in reason:
        # a server that refuses a client certificate after a TLS 1.3 handshake may close
        # before its alert reaches us
        return (f"the partner's server closed the TLS connection unexpectedly ({error}); "
                f"a server that wants a client certificate it trusts does so; we sent {ours}")
    return str(error)


def peer_certificate(host: str, port: int, timeout: float) -> x509.Certificate | None:
    """The server's certificate as it presents it, unverified (to name what it is
    when verification fails); None when there is none to read."""
    import socket
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw, \
                context.wrap_socket(raw, server_hostname=host) as tls:
            der = tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError):
        return None
    return x509.load_der_x509_certificate(der) if der else None


def describe_certificate(cert: x509.Certificate, now: datetime | None = None) -> str:
    """Subject, issuer and validity of a certificate, with the days left."""
    now = now or datetime.now(UTC)
    end, start = cert.not_valid_after_utc, cert.not_valid_before_utc
    if end < now:
        when = f"expired {end:%Y-%m-%d %H:%M} UTC"
    elif start > now:
        when = f"not valid before {start:%Y-%m-%d %H:%M} UTC"
    else:
        when = f"valid until {end:%Y-%m-%d %H:%M} UTC, {(end - now).days} days left"
    return f"{cert.subject.rfc4514_string()}, issued by {cert.issuer.rfc4514_string()}, {when}"

"""pyas2lib objects built from b2bhub's AS2 profiles, and the wire form of messages."""

from __future__ import annotations

import email
import logging
import threading
from contextlib import contextmanager
from email import policy
from importlib import metadata

import pyas2lib.as2 as _as2
from pyas2lib import Mdn, Message, Organization, Partner

from b2bhub.as2.profiles import As2Profile


def organization(profile: As2Profile, domain: str | None = None) -> Organization:
    """Our side, its key loaded once per profile version (loading a key costs more than
    parsing a small message); pyas2lib only reads these objects. Kept with the profile
    too, which the receiver's profile cache keeps."""
    org = profile.loaded.get(("organization", domain))
    if org is None:
        org = profile.loaded[("organization", domain)] = _organization(profile, domain)
    return org


def _organization(profile: As2Profile, domain: str | None) -> Organization:
    key = (profile.party, profile.updated_at, profile.as2_id, profile.key_pem,
           profile.get("mdn_url"), domain)
    with _lock:
        org = _orgs.get(key)
    if org is None:
        pem = (profile.key_pem + profile.cert_pem).encode() if profile.key_pem else None
        org = Organization(as2_name=profile.as2_id, sign_key=pem, decrypt_key=pem,
                           mdn_url=profile.get("mdn_url"), domain=domain)
        with _lock:
            if len(_orgs) > 256:
                _orgs.clear()
            _orgs[key] = org
    return org


_orgs: dict[tuple, Organization] = {}
_lock = threading.Lock()


class LoadedPartner(Partner):
    """A pyas2lib Partner whose certificates are loaded on first use and kept (pyas2lib
    loads them again at every message it verifies or encrypts)."""

    def load_verify_cert(self):
        cert = self.__dict__.get("_verify_loaded")
        if cert is None:
            cert = self.__dict__["_verify_loaded"] = super().load_verify_cert()
        return cert

    def load_encrypt_cert(self):
        cert = self.__dict__.get("_encrypt_loaded")
        if cert is None:
            cert = self.__dict__["_encrypt_loaded"] = super().load_encrypt_cert()
        return cert


def partner(profile: As2Profile, binary: bool | None = None) -> Partner:
    """The partner's side, kept with the profile (pyas2lib only reads it)."""
    found = profile.loaded.get(("partner", binary))
    if found is None:
        found = profile.loaded[("partner", binary)] = _partner(profile, binary)
    return found


def _partner(profile: As2Profile, binary: bool | None) -> Partner:
    cert = profile.cert_pem.encode() if profile.cert_pem else None
    mode = profile.get("mdn_mode")
    return LoadedPartner(
        as2_name=profile.as2_id, verify_cert=cert, encrypt_cert=cert, validate_certs=False,
        compress=profile.get("compress"), sign=profile.get("sign"),
        digest_alg=profile.get("digest_alg"), encrypt=profile.get("encrypt"),
        enc_alg=profile.get("encryption_alg"),
        mdn_mode={"sync": "SYNC", "async": "ASYNC"}.get(mode),
        mdn_digest_alg=profile.get("mdn_digest_alg") if profile.get("mdn_signed") else None,
        canonicalize_as_binary=(profile.get("canonicalize_as_binary")
                                if binary is None else binary))


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


@contextmanager
def parsing():
    """Around ``Message.parse`` (only): no debug copies of the MIME tree, unless
    pyas2lib's debug log is on."""
    if getattr(_quiet, "on", False) or _as2.logger.isEnabledFor(logging.DEBUG):
        yield
        return
    _quiet.on = True
    try:
        yield
    finally:
        _quiet.on = False


def header_block(headers) -> bytes:
    """HTTP headers as the MIME header block pyas2lib parses (one line each)."""
    return "".join(f"{k}: {v}\r\n" for k, v in headers).encode("utf-8", "replace")


def wire(headers, body: bytes) -> bytes:
    return header_block(headers) + b"\r\n" + body


def read_headers(block: bytes) -> dict[str, str]:
    """Lower-cased header names to values, from a header block (never raises)."""
    parsed = email.message_from_bytes(block + b"\r\n", policy=policy.compat32)
    return {k.lower(): str(v) for k, v in parsed.items()}


def message_id_of(value: str | None) -> str | None:
    return value.strip().lstrip("<").rstrip(">").strip() if value else None


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


def email_message():
    from email.message import Message as EmailMessage
    return EmailMessage()
